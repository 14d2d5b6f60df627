"""The Grafana dashboard and the Prometheus scrape config: they load, and every PromQL query
names metrics (and labels) the gateway really exports."""

import json
import re
from pathlib import Path

import pytest
import yaml

from gateway.admit.budget import SessionBudgets
from gateway.admit.flow.flow_control import FlowControl
from gateway.admit.flow.metrics import register_flow_metrics
from gateway.common.usage import Usage
from gateway.config import load_config
from gateway.fleet.pools import PoolRegistry
from gateway.telemetry.histograms import GapTimer
from gateway.telemetry.metrics import GatewayMetrics, metric_label_names
from gateway.telemetry.record import RequestRecord

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy/grafana/speedgate-dashboard.json"
SCRAPE = ROOT / "deploy/prometheus/prometheus.yml"

PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "offset", "inf", "nan",
}
IDENT = r"[a-zA-Z_:][a-zA-Z0-9_:]*"


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
    # admission under load (issue 17): one of each flow-control and budget event
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
    return metric_label_names(m.registry)


def _dashboard():
    return json.loads(DASHBOARD.read_text())


def _queries(dash) -> list[str]:
    out = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for v in dash["templating"]["list"]:
        if v.get("type") == "query":
            out.append(v["query"]["query"] if isinstance(v["query"], dict) else v["query"])
    return out


def _names_and_labels(expr: str) -> tuple[set[str], dict[str, set[str]], set[str]]:
    """Metric names, label names used in each selector, and labels in by/without clauses."""
    lv = re.fullmatch(rf"\s*label_values\(\s*({IDENT})\s*,\s*({IDENT})\s*\)\s*", expr)
    if lv:  # a template variable's query
        return {lv.group(1)}, {lv.group(1): {lv.group(2)}}, set()
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    e = re.sub(r"\[[^\]]*\]", "", e)  # range selectors [5m], [$__rate_interval]
    grouping: set[str] = set()
    for m in re.finditer(r"\b(?:by|without)\s*\(([^)]*)\)", e):
        grouping |= {x.strip() for x in m.group(1).split(",") if x.strip()}
    e = re.sub(r"\b(?:by|without)\s*\([^)]*\)", " ", e)
    selectors: dict[str, set[str]] = {}
    for m in re.finditer(rf"({IDENT})\s*\{{([^}}]*)\}}", e):
        labels = set(re.findall(rf"({IDENT})\s*(?:=~|!~|!=|=)", m.group(2)))
        selectors.setdefault(m.group(1), set()).update(labels)
    e = re.sub(r"\{[^}]*\}", " ", e)
    names = set()
    for m in re.finditer(rf"(?<![\w$.]){IDENT}", e):
        word, rest = m.group(0), e[m.end():]
        if rest.lstrip().startswith("(") or word.lower() in PROMQL_WORDS:
            continue  # a function call or a keyword
        names.add(word)
    return names, selectors, grouping


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
    queries = _queries(_dashboard())
    assert len(queries) > 20
    seen: set[str] = set()
    for expr in queries:
        names, selectors, grouping = _names_and_labels(expr)
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
                 "speedgate_queue_shed_total", "speedgate_session_budget_refusals_total"):
        assert must in seen


def test_the_checker_rejects_unknown_metrics_and_labels(exported):
    names, selectors, grouping = _names_and_labels(
        'histogram_quantile(0.9, sum by (le, tier) (rate(foo_bucket{bar="x"}[5m])))')
    assert names == {"foo_bucket"} and selectors == {"foo_bucket": {"bar"}}
    assert grouping == {"le", "tier"} and "foo_bucket" not in exported
    assert _names_and_labels("label_values(speedgate_requests_total, tier)") == (
        {"speedgate_requests_total"}, {"speedgate_requests_total": {"tier"}}, set())


def test_scrape_config_targets_the_gateway_metrics_endpoint():
    cfg = yaml.safe_load(SCRAPE.read_text())
    (job,) = [j for j in cfg["scrape_configs"] if j["job_name"] == "speedgate"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    assert job["static_configs"][0]["targets"]
