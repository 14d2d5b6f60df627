"""What the gateway measures and reports about each request, pool and session.

- ``record``: ``RequestRecord``, the facts one request gathers on its way;
- ``metrics``: ``GatewayMetrics`` (Prometheus, OpenTelemetry GenAI names); ``histograms``: the
  buckets, ``GapTimer`` (inter-token gaps) and ``BulkHistogram``; ``procstats``: process gauges;
- ``tracing``: ``Telemetry`` (OpenTelemetry spans per request and attempt, W3C trace context);
  ``otlp_metrics``: the OTLP bridge of the Prometheus registry;
- ``cost``: ``cost_usd``; ``tokencount``: tiktoken counting offline (usage the engine did not
  report), ``block_count``: its counts cached per prefix block (turn N+1 encodes only its new
  blocks); ``usage_store``: per-key and per-session totals (memory or Redis);
- ``access_log``: the access log line (text or JSON), never a prompt, a completion or a key.

What a finished request feeds to all of them is the last step's, ``gateway.account``.
"""
