"""Admission, the first step of the request path: who may send this request, and may it go now.

- ``request``: ``ClientRequest``, the client's request as both edges (proxy, picker) read it
  once: credentials, hints, the session its headers name, body;
- ``path``: ``admit_and_plan``, the one decision path of both edges (body checks, tier,
  entitlements, limits, band and budget, plan, KV fit); ``lent``: ``Lent``, what admission
  lent one request, given back once;
- ``gate``: ``Gate``, what the handler calls: ``check_key`` (API key), ``entitle`` (model and
  tier), ``reserve`` (rate limits, all-or-nothing) and ``release`` when the request ends;
- ``auth``: API keys (hashed), entitlements per model and tier, ``PermissionDenied``;
- ``ratelimit``: token buckets per key (``MemoryLimiter``, the ``Limiter`` interface,
  ``RateLimited``); ``ratelimit_redis``: ``RedisLimiter``, the same limits shared by replicas;
- ``hardening``: header and JSON-shape limits checked before any work (``check_headers``,
  ``check_json_shape``);
- ``params``: the client's sampling parameters against the OpenAI schema
  (``check_sampling_params``): a client's mistake never reaches, nor counts against, a replica;
- ``audit``: the audit log of refused and privileged requests;
- ``connections``: ``GuardedHttpToolsProtocol``, the server's HTTP protocol (uvicorn's
  httptools with header/body read timeouts, a connection cap and a pipelining fix), and its
  limits and counters, ``ConnectionGuard``;
- ``admission``: ``AdmissionControl`` (``enter`` → ``Ticket``, ``wait``, ``leave``), admission under
  load: the request's priority band and session budget, then a slot on a saturated pool;
- ``flow/``: ``FlowControl``, the gateway queue per pool (bands, fair queuing, shedding);
- ``budget``: ``SessionBudgets`` (USD per session, ``BudgetExceeded``), ``MemoryBudgetLedger``;
  ``budget_redis``: ``RedisBudgetLedger``, the ledgers shared by replicas.
"""
