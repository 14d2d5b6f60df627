"""The request body on its way in and the engine's answer on its way out.

- ``body``: ``parse_body`` → ``ParsedBody`` (the fields the gateway reads) and ``upstream_body``
  (the client's bytes with ``model`` and usage options spliced in, never re-serialised);
- ``sse``: ``SSEParser`` (whole events from a byte stream) and ``encode_event``;
- ``stream``: ``relay_events`` (event by event, unbuffered), ``ChunkRewriter`` (model name,
  ``service_tier``, usage stripping), ``error_event`` and ``SSE_HEADERS``.
"""
