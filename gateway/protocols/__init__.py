"""Client APIs as protocol adapters: one package per API, one request path for all.

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
- ``openai/``: the OpenAI chat and completions APIs (``openai.chat``: ``ChatProtocol``,
  ``CompletionsProtocol``) with their resume, splice and assembly;
- ``responses/``: the Responses API (``responses.protocol.ResponsesProtocol``), its stored
  state, routes and resume;
- ``messages/``: the Anthropic Messages API (``messages.protocol.MessagesProtocol``,
  ``CountTokensProtocol``) and its resume;
- ``splice/``: what the Messages and Responses splices of a chat-completions continuation
  share (``splice.text_splice``);
- ``registry``: ``build_protocols`` (path → protocol for the app).
"""
