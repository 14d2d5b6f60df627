"""Talking to the engines: one attempt, and what to do when it fails.

- ``transport``: ``UpstreamClient`` and ``UpstreamReply``, the declared seam to the engines
  (protocols); ``client``: ``Upstream``, the pooled HTTP client (aiohttp) behind it, and its
  typed failures;
- ``failures``: ``Failure``, the kinds of failure, and ``TRAITS``, their properties (one table);
- ``attempt``: ``open_attempt``, one request to one replica under its staged timeouts (connect,
  TTFT, stall), until the first content event;
- ``failover``: ``open_with_failover``, retries within a pool and fallbacks along the plan's
  chain, never after output reached the client;
- ``continuation``: ``open_continuation`` and ``Resumption``, the attempt that continues a
  stream broken mid-way (same pool, then the fallback chain; never a replica that failed);
  ``tokenize``: ``engine_token_count``, the engine's count of the text it carries (vLLM's
  ``/tokenize``), which its output limit is shrunk by;
- ``verdict``: what a failed attempt means (go on, answer now, whose failure to record: the
  stream-4xx diagnosis and the body rule), pure;
- ``retry``: ``next_attempt`` (where the next attempt goes, or stop), backoff with full
  jitter (the retry budget and outlier state are the fleet's, ``gateway.fleet``);
  ``deadline``: the request's total deadline from the client's headers;
- ``deps``: ``StepDeps``, what these steps read from the gateway's state;
- ``exchange``: ``Exchange``, the request context the handler builds once and every step from
  here up takes (body, plan, protocol, record, trace, attempts, relayed payloads, whether the
  response started);
- engine polling: ``health``: ``HealthChecker``, active ``/health`` probes; ``load_scraper``:
  ``LoadScraper``, each replica's ``/metrics`` (queue, KV usage, spec-decode counters);
  ``discovery``: ``DnsDiscovery``, replicas from DNS (a Kubernetes headless Service).
"""
