"""The console end to end: after known traffic through a real stack (simulators and
a gateway process, auth on), ``GET /v1/console/state`` reports exactly the requests, tokens,
cost, TTFT percentiles, auto decisions, sessions and incidents the clients saw; it answers
only an admin key, and neither it nor the page ever holds prompt text or a key. In a real
browser (headless Chromium, skipped only when none is installed) the page asks for the key."""

from __future__ import annotations

import math
import uuid
from collections import Counter
from collections.abc import Iterator

import httpx
import orjson
import pytest

from gateway.admit.auth import new_key
from gateway.common.usage import Usage
from gateway.config import Prices
from gateway.console.sketch import RELATIVE_ACCURACY
from gateway.telemetry.cost import cost_usd
from tests.e2e.browser import Chromium
from tests.e2e.helpers import CHAT, metric, wait_for
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e

PRICES = {
    "standard": {"input_per_mtok_usd": 1.0, "cached_input_per_mtok_usd": 0.1,
                 "output_per_mtok_usd": 2.0},
    "fast": {"input_per_mtok_usd": 2.0, "cached_input_per_mtok_usd": 0.2,
             "output_per_mtok_usd": 6.0},
}
ADMIN, ADMIN_HASH = new_key()
APP, APP_HASH = new_key()
MARKER = f"PROMPT-TEXT-{uuid.uuid4().hex}"  # in every prompt; must never reach the console
STATE = "/v1/console/state"
GAP_S = 0.01  # the simulators space content events this far apart (wall-clock seconds)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(
        tmp_path_factory.mktemp("console"),
        tier_overrides={t: {"prices": p} for t, p in PRICES.items()},
        # a refusal for the console to count: prompt + a cap past every context
        model_overrides={"output_cap_overflow": "refuse"},
        config_extra={
            "auth": {"keys": [{"id": "ops", "hash": ADMIN_HASH, "admin": True},
                              {"id": "app", "hash": APP_HASH}]},
            "console": {"window_s": 120, "step_s": 2},
        },
    )
    s.start()
    try:
        yield s
    finally:
        s.stop()


def _stream(c: httpx.Client, model: str, session: str, turn: int) -> dict:
    """One streamed turn; what the client saw: tier, TTFT header, usage, auto reason."""
    body = {"model": model, "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": 12, "sim_faults": {"chunk_interval_s": GAP_S},
            "messages": [{"role": "system", "content": f"{MARKER} agent " * 40},
                         {"role": "user", "content": f"{MARKER} turn {turn}"}]}
    headers = {"authorization": f"Bearer {APP}", "x-session-id": session}
    usage = None
    with c.stream("POST", CHAT, json=body, headers=headers) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                doc = orjson.loads(line[6:])
                if doc.get("usage"):
                    usage = Usage.from_openai(doc["usage"])
    assert usage is not None
    return {"tier": r.headers["x-speedgate-tier"], "ttft": float(r.headers["x-speedgate-ttft-s"]),
            "usage": usage, "session": session, "reason": r.headers.get("x-speedgate-auto-reason")}


def _lower_quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[math.floor(q * (len(ordered) - 1))]


def _state(stack: Stack, key: str | None = ADMIN) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.get(stack.base_url + STATE, headers=headers, timeout=10)


def test_state_after_known_traffic(stack: Stack) -> None:
    seen: list[dict] = []
    plan = [("mymodel", "sess-std", 6), (f"{MODEL}-fast", "sess-fast", 4),
            (f"{MODEL}-auto", "sess-auto", 4)]
    extra: list[tuple[str, Usage]] = []  # the JSON requests of the incident phase
    m = lambda name, **kw: metric(stack, name, **kw)  # noqa: E731
    before = {"retry": m("speedgate_retries_total", reason="http-503"),
              "fallback": m("speedgate_fallbacks_total", from_tier="fast", to_tier="standard"),
              "timeout": m("speedgate_timeouts_total", stage="total")}
    with httpx.Client(base_url=stack.base_url, timeout=30) as c:
        for model, session, turns in plan:
            for turn in range(turns):
                seen.append(_stream(c, model, session, turn))
        # incidents: every fast replica answers 503 → one retry, then a fallback to standard
        for url in stack.sims["fast"]:
            httpx.post(url + "/sim/faults", json={"status": 503}).raise_for_status()
        try:
            for _ in range(2):
                r = c.post(CHAT, headers={"authorization": f"Bearer {APP}"}, json={
                    "model": f"{MODEL}-fast", "max_tokens": 5,
                    "messages": [{"role": "user", "content": MARKER}]})
                assert r.status_code == 200 and r.headers["x-speedgate-tier"] == "standard"
                u = Usage.from_openai(r.json()["usage"])
                assert u is not None
                extra.append(("standard", u))
        finally:
            for url in stack.sims["fast"]:
                httpx.delete(url + "/sim/faults").raise_for_status()
        # and a deadline that ends the only attempt: a total timeout (504)
        r = c.post(CHAT, headers={"authorization": f"Bearer {APP}",
                                  "x-speedgate-timeout": "0.3"},
                   json={"model": MODEL, "max_tokens": 5, "sim_faults": {"ttft_delay_s": 2},
                         "messages": [{"role": "user", "content": MARKER}], "stream": True})
        assert r.status_code == 504
    r = _state(stack)
    assert r.status_code == 200
    assert MARKER not in r.text and ADMIN not in r.text and APP not in r.text
    assert ADMIN_HASH[7:] not in r.text and APP_HASH[7:] not in r.text
    doc = r.json()
    (model,) = doc["models"]
    tiers = model["tiers"]
    for tier in ("standard", "fast"):
        mine = [s for s in seen if s["tier"] == tier]
        usages = [s["usage"] for s in mine] + [u for t, u in extra if t == tier]
        t = tiers[tier]
        # every request this tier served (+ the timed-out one, asked for standard)
        assert t["requests"] == len(usages) + (1 if tier == "standard" else 0), tier
        assert t["ok"] == len(usages) and t["errors"] == (1 if tier == "standard" else 0)
        ttfts = [s["ttft"] for s in mine]
        assert t["ttft_s"]["n"] == len(ttfts)
        for q, name in ((0.5, "p50"), (0.95, "p95")):
            want = _lower_quantile(ttfts, q)
            # the header is rounded to 0.1 ms; the sketch is within α of the true value
            slack = RELATIVE_ACCURACY * (want + 5e-5) + 5e-5
            assert abs(t["ttft_s"][name] - want) <= slack, (tier, name, t["ttft_s"], want)
        assert t["output_tokens_per_s"]["n"] == len(mine)
        if tier == "standard":  # one token per event, events ≥ 10 ms apart: ≤ 100 tokens/s
            assert 50 < t["output_tokens_per_s"]["p50"] < 100 * (1 + RELATIVE_ACCURACY)
        assert t["tokens"]["prompt"] == sum(u.prompt for u in usages)
        assert t["tokens"]["cached"] == sum(u.cached for u in usages)
        assert t["tokens"]["completion"] == sum(u.completion for u in usages)
        want_cost = sum(cost_usd(u, Prices(**PRICES[tier])) for u in usages)
        assert t["cost_usd"] == pytest.approx(want_cost, rel=1e-6)
        assert doc["cost"]["per_pool"][f"{MODEL}/{tier}"]["usd"] == t["cost_usd"]
        assert sum(t["series"]["requests"]) == t["requests"]
    # auto: the decisions the clients were told, by reason
    told = Counter((s["tier"], s["reason"]) for s in seen if s["session"] == "sess-auto")
    got = {(d["tier"], d["reason"]): d["count"] for d in model["auto"]["decisions"]}
    assert got == dict(told) and model["auto"]["decisions_total"] == 4
    # sessions: turns, tokens and cost per session, with the key's id
    rows = {s["session_id"]: s for s in doc["sessions"]["most_active"]}
    for _, session, turns in plan:
        row = rows[session]
        mine = [s["usage"] for s in seen if s["session"] == session]
        assert (row["turns"], row["key_id"]) == (turns, "app")
        assert row["prompt_tokens"] == sum(u.prompt for u in mine)
        assert row["cached_tokens"] == sum(u.cached for u in mine)
    # and the three requests that named no session (same opening message): one more session,
    # their conversation hash
    (hashed,) = [s for sid, s in rows.items() if sid not in {p[1] for p in plan}]
    assert hashed["session_id"].startswith("p:") and hashed["turns"] == 3
    assert doc["sessions"]["active"] == 4
    # incidents, checked against the gateway's own Prometheus counters
    by = {(i["kind"], i["where"], i["reason"]): i["count"] for i in doc["incidents"]["by_reason"]}
    assert by == {("retry", "fast", "http-503"): 2,
                  ("fallback", "fast→standard", "replicas-exhausted"): 2,
                  ("timeout", "standard", "total"): 1}
    assert m("speedgate_retries_total", reason="http-503") - before["retry"] == 2
    assert m("speedgate_fallbacks_total", from_tier="fast", to_tier="standard") - before[
        "fallback"] == 2
    assert m("speedgate_timeouts_total", stage="total") - before["timeout"] == 1
    assert [i["status"] for i in doc["incidents"]["recent"]] == [504, 200, 200]  # newest first
    assert doc["gateway"]["requests"]["ok"] == len(seen) + 2
    # every replica of both pools, healthy; the fast ones failed twice each (the 503s), not
    # enough to eject them: marked, not sick
    for pool in model["pools"]:
        assert len(pool["replicas"]) == 2 and pool["healthy"] == 2
        for rep in pool["replicas"]:
            assert rep["sick"] is False and rep["url"] in stack.sims[pool["tier"]]
            if pool["tier"] == "fast":
                assert (rep["state"], rep["consecutive_failures"]) == ("failing", 2)
            else:
                assert rep["state"] == "ok"
            assert rep["engine"]["fresh"] is True and rep["engine"]["running"] is not None


def test_state_needs_an_admin_key(stack: Stack) -> None:
    r = _state(stack, None)
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
    r = _state(stack, APP)
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_required"
    assert APP not in r.text
    assert _state(stack, ADMIN).status_code == 200


def test_the_page_is_served_without_data_and_root_redirects(stack: Stack) -> None:
    r = httpx.get(stack.base_url + "/console")
    assert r.status_code == 200 and "speedgate console" in r.text
    assert MARKER not in r.text and ADMIN not in r.text
    assert "default-src 'none'" in r.headers["content-security-policy"]
    r = httpx.get(stack.base_url + "/", headers={"accept": "text/html"})
    assert r.status_code == 307 and r.headers["location"] == "/console"


async def test_the_page_asks_for_an_admin_key_in_a_real_browser(stack: Stack,
                                                                chromium: Chromium) -> None:
    """Headless Chromium: without a key the page shows the prompt and no data; a wrong key and
    a non-admin key are refused (and not kept); the admin key opens the console, lives in the
    tab's session storage only, and never appears in the URL or the page."""
    page = await chromium.new_page()  # a fresh tab: empty session storage
    rows = "document.querySelectorAll('tr[data-replica]').length"
    prompt_shown = "document.getElementById('keyprompt').hidden === false"
    submit = "document.getElementById('keyform').requestSubmit()"
    message = "document.getElementById('keymsg').textContent"
    try:
        await page.navigate(stack.base_url + "/console")
        await page.wait_for(prompt_shown, timeout_s=15)
        assert await page.js(rows) == 0
        for key, says in (("sg-not-a-key", "not accepted"), (APP, "not an admin key")):
            await page.type_into("#keyinput", key)
            await page.js(submit)
            await page.wait_for(f"{prompt_shown} && {message}.includes({says!r})", timeout_s=15)
            assert await page.js("sessionStorage.length") == 0  # a refused key is not kept
        await page.type_into("#keyinput", ADMIN)
        await page.js(submit)
        await page.wait_for(f"{rows} === 4", timeout_s=15)
        assert await page.js(prompt_shown) is False
        assert await page.js("sessionStorage.getItem('speedgate.adminKey')") == ADMIN
        assert await page.js("localStorage.length") == 0
        href = await page.js("location.href")
        assert ADMIN not in href and href.endswith("/console")
        html = await page.js("document.documentElement.outerHTML")
        assert ADMIN not in html and MARKER not in html
    finally:
        await page.close()


async def test_the_page_shows_kv_capacity_largest_sessions_and_refusals(
    stack: Stack, chromium: Chromium
) -> None:
    """Headless Chromium: the KV card shows each replica's capacity (as the engine reported it),
    use and headroom, the largest sessions by footprint, and a request refused for fitting no
    replica (the gateway's own numbers, from ``/v1/console/state``)."""
    def learned() -> bool:
        reps = [r for m in _state(stack).json()["models"] for p in m["pools"]
                for r in p["replicas"]]
        return bool(reps) and all(r["engine"]["kv_tokens"] for r in reps)

    assert wait_for(learned, timeout_s=15)  # the scraper read every replica's KV pool
    with httpx.Client(base_url=stack.base_url, timeout=30) as c:
        for turn in range(2):
            _stream(c, MODEL, "kv-largest", turn)
    body = {"model": MODEL, "max_tokens": 5_000_000,
            "messages": [{"role": "user", "content": f"{MARKER} too long an answer"}]}
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=30) as ac:
        r = await ac.post(CHAT, json=body, headers={"authorization": f"Bearer {APP}"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    # the request is accounted just after its answer was sent
    assert wait_for(lambda: _state(stack).json()["sessions"]["kv"]["refused"] >= 1,
                    timeout_s=10)
    state = _state(stack).json()
    largest = {s["session_id"]: s["last_tokens"] for s in state["sessions"]["largest"]}
    assert largest.get("kv-largest", 0) > 0
    page = await chromium.new_page()
    try:
        await page.navigate(stack.base_url + "/console")
        await page.wait_for("document.getElementById('keyprompt').hidden === false", timeout_s=15)
        await page.type_into("#keyinput", ADMIN)
        await page.js("document.getElementById('keyform').requestSubmit()")
        await page.wait_for("document.querySelectorAll('tr[data-kv-replica]').length === 4 && "
                            "Number(document.querySelector('[data-kv-refused]')"
                            ".dataset.kvRefused) >= 1", timeout_s=15)
        shown = await page.js(
            "JSON.stringify([...document.querySelectorAll('tr[data-kv-replica]')].map((tr) => "
            "[tr.dataset.kvReplica, Number(tr.querySelector('[data-kv-capacity]').dataset."
            "kvCapacity), tr.querySelector('[data-kv-headroom]').dataset.kvHeadroom]))")
        want = {r["name"]: r["engine"]["kv_tokens"] for m in state["models"]
                for p in m["pools"] for r in p["replicas"]}
        rows = orjson.loads(shown)
        assert {name: cap for name, cap, _ in rows} == want
        assert all(headroom != "" and int(headroom) <= want[name] for name, _, headroom in rows)
        footprint = await page.js(
            "JSON.stringify([...document.querySelectorAll('table[data-sessions=largest] tbody tr')]"
            ".map((tr) => [tr.querySelector('td').title, Number(tr.querySelector("
            "'[data-footprint]').dataset.footprint)]))")
        assert dict(orjson.loads(footprint))["kv-largest"] == largest["kv-largest"]
        text = await page.js("document.querySelector('[data-kv]').textContent")
        assert "refused: fits no replica" in text and MARKER not in text
    finally:
        await page.close()
