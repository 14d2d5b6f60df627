"""The one Grafana dashboard and the one Prometheus config: they load, and every PromQL query
names metrics (and labels) the gateway or an engine really exports (engine metrics with the
labels the scrape config adds)."""

import json
from pathlib import Path

import pytest
import yaml

from engines.sim.metrics import SimMetrics
from gateway.admit.budget import SessionBudgets
from gateway.admit.flow.flow_control import FlowControl
from gateway.admit.flow.metrics import register_flow_metrics
from gateway.common.usage import Usage
from gateway.config import ServerConfig, load_config
from gateway.fleet.pools import PoolRegistry
from gateway.telemetry.histograms import GapTimer
from gateway.telemetry.metrics import GatewayMetrics, metric_label_names
from gateway.telemetry.record import RequestRecord
from tests.promql import names_and_labels, queries

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy/observability/grafana/dashboards/speedgate.json"
SCRAPE = ROOT / "deploy/observability/prometheus.yml"
#: Labels Prometheus itself puts on every scraped sample.
TARGET_LABELS = {"instance", "job"}

@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    """Sample name → label names, from a real registry after one request of every kind."""
    config = load_config(models={"m": {"tiers": {
        "fast": {"endpoints": ["http://127.0.0.1:9003"], "served_model_name": "m-fast"},
        "standard": {"endpoints": ["http://127.0.0.1:9001"], "served_model_name": "m-std",
                     "max_inflight_per_replica": 4}},
        "fallback": {"fast": "standard"}}})
    pools = PoolRegistry(config)
    m = GatewayMetrics(pools)
    # admission under load: one of each flow-control and budget event
    flow = FlowControl(config, pools)
    register_flow_metrics(flow, m.registry)
    budgets = SessionBudgets(config)
    m.registry.register(budgets.collector())
    flow.shed[("m/standard", "batch", "expected_wait")] += 1
    flow.promotions[("m/standard", "batch", "standard")] += 1
    flow.observe_wait(pools.get("m", "standard"), "batch", 0.5)
    flow.observe_refusal(pools.get("m", "standard"), "batch", "expected_wait", 0.002)
    flow.pools["m/standard"].drain.rate = lambda: 100.0  # type: ignore[method-assign]
    budgets.refusals["m"] = budgets.soft["m"] = 1
    rec = RequestRecord(request_id="r", path="/v1/chat/completions", model="m",
                        asked_tier="fast", stream=True)
    rec.served_tier, rec.status, rec.outcome = "fast", 200, "ok"
    rec.usage, rec.usage_estimated = Usage(prompt=100, completion=20, cached=50), True
    rec.ttft_s, rec.e2e_s, rec.queue_s, rec.cost_usd = 0.1, 1.0, 0.001, 0.01
    rec.itl = GapTimer()
    for t in (0.0, 0.01, 0.02):
        rec.itl.tick(t)
    m.record_request(rec)
    fast = pools.get("m", "fast")
    m.record_attempt(fast, "ok")
    m.record_retry(fast, "connect-error")
    m.record_fallback("m", "fast", "standard")
    m.record_timeout(fast, "ttft")
    names = metric_label_names(m.registry)
    # the engines' metrics (vLLM's names, as the simulator exports them), with the labels the
    # scrape config's relabelling adds (`tier`) and Prometheus' own
    sim = SimMetrics("m", speculative=True)
    sim.finished("stop")
    added = TARGET_LABELS | {r["target_label"] for j in _scrape()["scrape_configs"]
                             for r in j.get("relabel_configs", []) if "target_label" in r}
    engine = {n: labels | added for n, labels in metric_label_names(sim.registry).items()}
    assert not names.keys() & engine.keys()
    return {**names, **engine}


def _scrape() -> dict:
    return yaml.safe_load(SCRAPE.read_text())


def _dashboard():
    return json.loads(DASHBOARD.read_text())


def test_dashboard_loads_and_has_the_required_panels():
    dash = _dashboard()
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    titles = " | ".join(p["title"] for p in dash["panels"]).lower()
    for want in ("time to first token", "inter-token", "tokens/s", "cost", "error", "retries",
                 "in-flight"):
        assert want in titles, want
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["targets"] and all(t["expr"].strip() for t in p["targets"])


def test_every_query_names_an_exported_metric_and_label(exported):
    exprs = queries(_dashboard())
    assert len(exprs) > 20
    seen: set[str] = set()
    for expr in exprs:
        names, selectors, grouping = names_and_labels(expr)
        assert names, f"no metric in {expr!r}"
        for n in names:
            assert n in exported, f"{n!r} (in {expr!r}) is not exported by the gateway"
        for n, labels in selectors.items():
            missing = labels - exported[n]
            assert not missing, f"{n} has no label(s) {missing} (in {expr!r})"
        available = set().union(*(exported[n] for n in names))
        assert grouping <= available, f"by/without labels {grouping - available} in {expr!r}"
        seen |= names
    # the per-tier latency panels are there
    for must in ("gen_ai_server_time_to_first_token_seconds_bucket",
                 "gen_ai_client_operation_time_per_output_chunk_seconds_bucket",
                 "gen_ai_client_token_usage_sum", "speedgate_cost_usd_total",
                 "speedgate_retries_total", "speedgate_replica_inflight",
                 "speedgate_queue_length", "speedgate_queue_wait_seconds_bucket",
                 "speedgate_queue_shed_total", "speedgate_session_budget_refusals_total",
                 # the engines' row
                 "vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits_total",
                 "vllm:spec_decode_num_accepted_tokens_total"):
        assert must in seen


def test_the_checker_rejects_unknown_metrics_and_labels(exported):
    names, selectors, grouping = names_and_labels(
        'histogram_quantile(0.9, sum by (le, tier) (rate(foo_bucket{bar="x"}[5m])))')
    assert names == {"foo_bucket"} and selectors == {"foo_bucket": {"bar"}}
    assert grouping == {"le", "tier"} and "foo_bucket" not in exported
    assert names_and_labels("label_values(speedgate_requests_total, tier)") == (
        {"speedgate_requests_total"}, {"speedgate_requests_total": {"tier"}}, set())


def test_scrape_config_targets_the_gateway_and_every_engine_metrics_endpoint():
    cfg = _scrape()
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    gateway = jobs["gateway"]
    assert gateway.get("metrics_path", "/metrics") == "/metrics"
    (sd,) = gateway["dns_sd_configs"]
    assert sd["names"] and sd["port"] == ServerConfig().port
    tiers = {r["replacement"] for name, j in jobs.items() if name.startswith("engines-")
             for r in j["relabel_configs"] if r["target_label"] == "tier"}
    assert tiers == {"standard", "fast"}


def test_one_dashboard_and_one_prometheus_config_under_deploy():
    dashboards = [p for p in (ROOT / "deploy").rglob("*.json")
                  if '"panels"' in p.read_text()]
    assert dashboards == [DASHBOARD]
    configs = [p for p in (ROOT / "deploy").rglob("*.y*ml") if "scrape_configs" in p.read_text()]
    assert configs == [SCRAPE]
