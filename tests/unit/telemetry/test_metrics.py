"""The gateway's Prometheus metrics after known traffic: exact counts, token sums, histograms."""

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.common.usage import Usage
from gateway.config import load_config
from gateway.fleet.pools import PoolRegistry
from gateway.telemetry.histograms import ITL_BUCKETS, GapTimer
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.record import RequestRecord


def _config():
    return load_config(models={"m": {
        "tiers": {
            "standard": {"endpoints": ["http://127.0.0.1:9001", "http://u:secret@127.0.0.1:9002"],
                         "served_model_name": "m-std"},
            "fast": {"endpoints": ["http://127.0.0.1:9003"], "served_model_name": "m-fast"},
        },
        "fallback": {"fast": "standard"},
    }})


@pytest.fixture
def pools():
    return PoolRegistry(_config())


def samples(metrics: GatewayMetrics) -> dict[tuple[str, frozenset], float]:
    out = {}
    for fam in text_string_to_metric_families(metrics.render().decode()):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def total(smp, name, **labels) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in smp.items() if n == name and want <= ls)


def _rec(tier, *, stream=True, outcome="ok", status=200, usage=(100, 20, 10), ttft=0.05,
         e2e=1.0, cost=0.001, gaps=(), queue=0.002, path="/v1/chat/completions"):
    operation = "text_completion" if path == "/v1/completions" else "chat"
    rec = RequestRecord(request_id="r", path=path, operation=operation, model="m",
                        asked_tier=tier, stream=stream)
    rec.served_tier = tier if outcome != "no_healthy_replica" else None
    rec.status, rec.outcome = status, outcome
    rec.usage = Usage(usage[0], usage[2], usage[1]) if usage else None
    rec.ttft_s, rec.e2e_s, rec.queue_s, rec.cost_usd = ttft, e2e, queue, cost
    if gaps:
        rec.itl = GapTimer()
        t = 10.0
        rec.itl.tick(t)
        for g in gaps:
            t += g
            rec.itl.tick(t)
    return rec


def test_counts_and_token_sums_per_tier(pools):
    m = GatewayMetrics(pools)
    for _ in range(3):
        m.record_request(_rec("fast", usage=(100, 20, 10), cost=0.001, gaps=[2**-7] * 9))
    for _ in range(2):
        m.record_request(_rec("standard", usage=(50, 0, 5), cost=0.0005, stream=False))
    m.record_request(_rec("standard", outcome="no_healthy_replica", status=503, usage=None,
                          ttft=None, cost=None))
    s = samples(m)
    # requests by tier/outcome/status (the existing series keeps its labels)
    assert total(s, "speedgate_requests_total", tier="fast", outcome="ok", status="200") == 3
    assert total(s, "speedgate_requests_total", tier="standard", outcome="ok") == 2
    assert total(s, "speedgate_requests_total", tier="standard", status="503") == 1
    # token sums per tier and type; histogram counts = requests with usage
    tu = "gen_ai_client_token_usage_sum"
    assert total(s, tu, tier="fast", gen_ai_token_type="input") == 300
    assert total(s, tu, tier="fast", gen_ai_token_type="cached_input") == 60
    assert total(s, tu, tier="fast", gen_ai_token_type="output") == 30
    assert total(s, tu, tier="standard", gen_ai_token_type="input") == 100
    assert total(s, tu, tier="standard", gen_ai_token_type="output") == 10
    assert total(s, "gen_ai_client_token_usage_count", tier="fast",
                 gen_ai_token_type="output") == 3
    # request duration: one observation per request, failed ones included (asked tier)
    assert total(s, "gen_ai_server_request_duration_seconds_count") == 6
    assert total(s, "gen_ai_server_request_duration_seconds_count", tier="standard",
                 outcome="no_healthy_replica", pool="") == 1
    assert total(s, "gen_ai_server_request_duration_seconds_sum", tier="fast") == 3.0
    # TTFT only for streams that got a first token; TPOT for successful streams
    assert total(s, "gen_ai_server_time_to_first_token_seconds_count", tier="fast") == 3
    assert total(s, "gen_ai_server_time_to_first_token_seconds_count", tier="standard") == 0
    assert total(s, "gen_ai_server_time_per_output_token_seconds_count") == 3
    # decode span 9 gaps of 7.8125 ms over 10 output tokens → one gap per token after the first
    assert total(s, "gen_ai_server_time_per_output_token_seconds_sum") == 3 * 2**-7
    # ITL: every gap counted, in the right bucket
    itl = "gen_ai_client_operation_time_per_output_chunk_seconds"
    assert total(s, itl + "_count", tier="fast") == 27
    assert total(s, itl + "_sum", tier="fast") == 27 * 2**-7
    assert total(s, itl + "_bucket", tier="fast", le="0.0075") == 0
    assert total(s, itl + "_bucket", tier="fast", le="0.01") == 27
    # cost and queue
    assert total(s, "speedgate_cost_usd_total", tier="fast", pool="m/fast") == pytest.approx(0.003)
    assert total(s, "speedgate_cost_usd_total") == pytest.approx(0.004)
    assert total(s, "speedgate_queue_time_seconds_count") == 6
    # operation name from the path; pool label
    assert total(s, "gen_ai_server_request_duration_seconds_count",
                 gen_ai_operation_name="chat", pool="m/fast", gen_ai_request_model="m") == 3


def test_attempt_retry_fallback_timeout_counters(pools):
    m = GatewayMetrics(pools)
    fast, std = pools.get("m", "fast"), pools.get("m", "standard")
    m.record_attempt(fast, "connect-error")
    m.record_retry(fast, "connect-error")
    m.record_attempt(fast, "ttft-timeout")
    m.record_timeout(fast, "ttft")
    m.record_fallback("m", "fast", "standard")
    m.record_attempt(std, "ok")
    s = samples(m)
    assert total(s, "speedgate_upstream_attempts_total") == 3
    assert total(s, "speedgate_upstream_attempts_total", pool="m/fast") == 2
    assert total(s, "speedgate_upstream_attempts_total", pool="m/standard", result="ok") == 1
    assert total(s, "speedgate_retries_total", tier="fast", reason="connect-error") == 1
    assert total(s, "speedgate_timeouts_total", stage="ttft", pool="m/fast") == 1
    assert total(s, "speedgate_fallbacks_total", from_tier="fast", to_tier="standard") == 1


def test_scrape_time_pool_metrics_redact_and_read_live_state(pools):
    m = GatewayMetrics(pools)
    std = pools.get("m", "standard")
    std.replicas[0].inflight = 4
    std.replicas[1].outlier.ejected_until = math.inf
    std.replicas[1].outlier.ejections_total = 2
    std.budget.exhausted = 7
    text = m.render().decode()
    assert "secret" not in text
    s = samples(m)
    assert total(s, "speedgate_replica_inflight", pool="m/standard") == 4
    assert total(s, "speedgate_replica_healthy") == 3
    assert total(s, "speedgate_replica_ejected") == 1
    assert total(s, "speedgate_replica_ejections_total", pool="m/standard") == 2
    assert total(s, "speedgate_retry_budget_exhausted_total", pool="m/standard") == 7


def test_gap_timer_buckets_and_span():
    t = GapTimer()
    assert t.span_s == 0.0
    now = 1.0
    for gap in (0.0, 2**-10, 2**-7, 2.5, 97.0):  # binary-exact gaps
        now += gap
        t.tick(now)
    assert t.n == 4
    assert t.span_s == pytest.approx(2**-10 + 2**-7 + 99.5)
    assert sum(t.counts) == 4
    assert t.counts[0] == 1  # 0.98 ms: le="0.001"
    assert t.counts[ITL_BUCKETS.index(0.01)] == 1  # 7.8 ms: le="0.01"
    assert t.counts[ITL_BUCKETS.index(2.5)] == 1  # exactly 2.5 s: le="2.5"
    assert t.counts[-1] == 1  # 97 s: +Inf


def test_no_key_or_session_label_anywhere(pools):
    m = GatewayMetrics(pools)
    rec = _rec("fast", gaps=[0.01])
    rec.key_id, rec.session_id = "key-123", "sess-456"
    m.record_request(rec)
    text = m.render().decode()
    assert "key-123" not in text and "sess-456" not in text


def test_observe_is_record_request(pools):
    m = GatewayMetrics(pools)
    m.observe(_rec("fast", path="/v1/completions"))
    s = samples(m)
    assert total(s, "speedgate_requests_total") == 1
    assert total(s, "gen_ai_server_request_duration_seconds_count",
                 gen_ai_operation_name="text_completion") == 1


def test_render_async_equals_render(pools):
    import asyncio

    m = GatewayMetrics(pools)
    m.record_request(_rec("fast", gaps=[0.01]))
    assert asyncio.run(m.render_async()) == m.render()


@pytest.mark.parametrize("k", [1, 2, 7])
def test_gap_timer_tick_many_is_k_ticks(k):
    """One upstream read of ``k`` content events: ``tick_many`` leaves the state ``k`` ticks
    at the same instant leave, after earlier events and before later ones."""
    one, many = GapTimer(), GapTimer()
    for t in (one, many):
        t.tick(1.0)
    for _ in range(k):
        one.tick(1.5)
    many.tick_many(1.5, k)
    for t in (one, many):
        t.tick(1.5 + 2**-7)
    assert (many.counts, many.n, many.sum_s, many.first, many.last) == (
        one.counts, one.n, one.sum_s, one.first, one.last)
    fresh = GapTimer()
    fresh.tick_many(3.0, k)
    assert (fresh.first, fresh.last, fresh.n, fresh.counts[0]) == (3.0, 3.0, k - 1, k - 1)
