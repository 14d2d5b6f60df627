"""speedgate engine simulator: a vLLM-compatible OpenAI server for CPU machines and tests.

Run it with ``python -m engines.sim --port 8000``; start it from tests with
:func:`engines.sim.testing.start_sim`. Modules, one concept each:

- ``cli``: command-line flags -> :class:`~engines.sim.config.SimConfig`, process entry point;
- ``config``: every setting and default in one place;
- ``perf``: the performance model (prefill, decode step time, speculative decoding), pure;
- ``kvcache``: block KV cache with automatic prefix caching and LRU eviction, pure;
- ``engine``: the continuous-batching scheduler loop (running batch, FIFO waiting queue);
- ``textgen``: tokenizer, prompt rendering, deterministic text and tool arguments;
- ``faults``: the scripted fault schema;
- ``sse``: the SSE event writer that applies framing faults;
- ``protocol``: vLLM-shaped response, chunk and error bodies;
- ``completions``: the ``/v1/chat/completions`` and ``/v1/completions`` handlers;
- ``server``: the aiohttp application, control and inspection endpoints;
- ``metrics``: Prometheus metrics with vLLM's names.
"""
