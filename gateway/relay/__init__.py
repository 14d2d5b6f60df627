"""The request body on its way in and the engine's answer on its way out, for any protocol.

- ``body``: ``ParsedBody`` (the fields the gateway reads, the chat-shaped ``conversation``),
  the chat/completions ``parse_body`` and ``upstream_body`` (the client's bytes with ``model``
  and usage options spliced in, never re-serialised) and ``splice_model``;
- ``sse``: ``SSEParser`` (whole events from a byte stream) and ``encode_event``;
- ``stream``: ``relay_events`` (event by event, unbuffered, each event rewritten and classified
  by the protocol's ``StreamCodec``, see ``gateway.protocols``), ``StreamResult`` and
  ``SSE_HEADERS``;
- ``resume``: ``relay_resumable``, the relay with mid-stream resume (a stream broken after
  content reached the client continues on another replica, spliced into the same stream).
"""
