"""Small pieces every step shares, with no dependency on any step.

- ``tasks``: ``every`` (a periodic loop) and ``cancel_and_wait`` (stopping background tasks);
- ``breaker``: ``CircuitBreaker``, the one breaker type of every Redis user;
- ``redis_client``: the cancel-safe redis-py client every Redis user builds;
- ``redis_conn``: ``RedisConnection``, the one Redis client and breaker every Redis user shares;
- ``ids``: ``bounded_id`` (a long client-supplied id kept as a fixed-size digest);
- ``urls``: ``redact_url`` (credentials out of URLs before they reach a log or a label);
- ``sse``: the SSE wire format, ``SSEParser`` (whole events from a byte stream) and
  ``encode_event``;
- ``blocks``: ``block_spans`` (prefix blocks and their chain hashes: routing and token counts);
- ``usage``: ``Usage``, a request's token counts (the value type the relay, the access log, cost
  and the usage store share).
"""
