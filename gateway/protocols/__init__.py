"""Client APIs as protocol adapters: one module per API, one request path for all.

The handler (``gateway.handler.ApiRoute``) runs every API through the same steps (admit, plan,
attempt, relay, account); what differs between APIs is asked of a ``Protocol``
(``base.Protocol``): how to read and validate the body (model, stream flag, the conversation in
chat shape for routing keys and token estimates, the output cap, the ``service_tier`` hint),
which fields the gateway owns and rewrites on the way up (``model``, usage options, ids), how the
engine's stream is framed and where its first content event and usage are (a per-request
``base.StreamCodec``), how a JSON answer is rewritten, and how errors look (``error_shapes``).

Public surface:

- ``base``: ``Protocol``, ``StreamCodec`` and its verdicts (``SKIP``, ``FRAME``, ``CONTENT``,
  ``DONE``, ``ERROR``), ``HEAD_FRAME`` / ``HEAD_CONTENT`` / ``HEAD_ERROR``, ``Rewrite`` and
  ``named_event`` (a protocol's per-request state lives in ``ParsedBody.ext``; the request
  context the steps share is ``gateway.upstream.exchange.Exchange``);
- ``body``: ``ParsedBody`` (the fields the gateway reads, the chat-shaped ``conversation``),
  the chat/completions ``parse_body`` and ``upstream_body`` (the client's bytes with ``model``
  and usage options spliced in, never re-serialised) and ``splice_model``;
- ``error_shapes``: the OpenAI and Anthropic error shapes (``OPENAI_ERRORS``, ``ANTHROPIC_ERRORS``);
- ``openai_chat``: ``ChatProtocol`` (``/v1/chat/completions``), ``CompletionsProtocol``
  (``/v1/completions``) and their stream codec ``OpenAIStream`` with ``ChunkRewriter``;
- ``openai_resume``: what a broken OpenAI stream gave the client (``resume_point``), the
  request continuing it (``continuation_body``, the healed tail left out: ``heal_tail``);
  ``base.ResumePoint``;
- ``openai_splice``: ``OpenAISplice``, the codec splicing the continuation into the client's
  stream, and ``stream_ending``;
- ``openai_assemble``: ``AssemblyCodec`` and ``assemble``, a non-stream answer built from the
  engine's stream;
- ``responses``: ``ResponsesProtocol`` (``/v1/responses``): typed ``event:`` stream, usage in
  ``response.usage``, gateway-owned ``previous_response_id`` state (``response_store``:
  ``MemoryResponseStore``, ``RedisResponseStore``) and the in-flight table for ``cancel``;
- ``responses_items``: Responses input items → chat-shaped conversation, output text;
- ``responses_resume``: mid-stream resume of a Responses stream (``resume_point``, the
  codec's ``Framing``, the chat-completions ``continuation_body``, the ``ResponsesSplice``
  codec);
- ``messages``: ``MessagesProtocol`` (Anthropic ``/v1/messages``) and
  ``CountTokensProtocol`` (``/v1/messages/count_tokens``);
- ``messages_resume``: mid-stream resume of a Messages stream (``resume_point``, the
  chat-completions ``continuation_body``, the ``MessagesSplice`` codec);
- ``text_splice``: ``TextSplice``, what the Messages and Responses splices of a
  chat-completions continuation share;
- ``registry``: ``build_protocols`` (path → protocol for the app).
"""
