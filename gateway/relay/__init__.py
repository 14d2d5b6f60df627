"""The engine's answer on its way out to the client, for any protocol (the request body is
``gateway.protocols.body``'s, the SSE wire format ``gateway.common.sse``'s).

- ``stream``: ``relay_events`` (event by event, unbuffered, each event rewritten and classified
  by the protocol's ``StreamCodec``, see ``gateway.protocols``), ``StreamLimits``,
  ``StreamResult`` and ``SSE_HEADERS``;
- ``answer``: ``usage_headers`` (a JSON answer's accounting headers) and
  ``end_stream_with_error`` (the in-band error event ending a started stream);
- ``resume``: ``relay_resumable``, the relay with mid-stream resume (a stream broken after
  content reached the client continues on another replica, spliced into the same stream).
"""
