"""Flow control, the last step of admission: a gateway queue per pool in front of
saturated replicas, strict priority bands, fair queuing across keys and sessions, early
shedding with an honest ``Retry-After``. A pool that cannot saturate pays nothing.

- ``flow_control``: ``FlowControl`` (``classify`` → ``Admission``, ``acquire`` → ``Slot``,
  ``release``; the first-token guard of the top band);
- ``refusal``: ``QueueRefused`` (503, or 429 ``resource_unavailable`` for flex; the decision
  time in ``x-speedgate-admit-s``);
- ``bands``: ``resolve_band`` (header ``x-speedgate-priority``, ``service_tier``, key) →
  ``BandChoice``;
- ``queue``: ``BandedQueue`` of ``Waiter``s (strict bands, promotion, deadlines, tokens ahead);
- ``fair``: ``FairQueue``, two-level start-time fair queuing (keys weighted, sessions);
- ``drain``: ``DrainMeter`` (tokens per second of backlog), ``shed`` → ``ShedDecision``;
- ``saturation``: slots per band (``band_limits``), ``EngineQueues`` (scraped waiting);
- ``metrics``: ``register_flow_metrics``.

Every policy module is pure (``now`` passed in); only ``flow_control`` touches asyncio.
"""
