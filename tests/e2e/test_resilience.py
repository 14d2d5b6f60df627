"""Timeouts, retries, fallbacks and ejection (shared/cases/failure-cases.md: Timeouts, Retries
and fallbacks) against the real gateway and scripted simulators."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest
import yaml

from tests.e2e.helpers import CHAT, stream_events, wait_for
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e

TIMEOUTS = {"connect_s": 1, "ttft_s": 1.0, "stall_s": 1.0, "total_s": 30}
# a generous retry budget here: its own test below measures the budget in a fresh stack
POOL = {"outlier": {"consecutive_failures": 3, "base_ejection_s": 0.5},
        "retry": {"budget_percent": 100, "budget_min_retries": 20}}


def _msgs() -> list[dict]:
    return [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("res"), timeouts=TIMEOUTS, pool_overrides=POOL).start()
    try:
        yield s
    finally:
        s.stop()


def _all_usable(stack: Stack) -> bool:
    tiers = httpx.get(stack.base_url + "/readyz").json()["models"][MODEL]
    return all(t["usable"] == t["replicas"] for t in tiers.values())


@pytest.fixture(autouse=True)
def _fresh(stack: Stack) -> None:
    """Every test starts with all replicas usable (ejections from earlier tests expired)."""
    assert wait_for(lambda: _all_usable(stack), timeout_s=5)


@pytest.fixture
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.base_url, timeout=30) as c:
        yield c


def _set_faults(url: str, faults: dict) -> None:
    httpx.post(url + "/sim/faults", json=faults).raise_for_status()


def _stream(http: httpx.Client, body: dict, headers: dict | None = None):
    """(status, headers, [parsed data events], saw_done) of a streaming request."""
    with http.stream("POST", CHAT, json=body | {"stream": True}, headers=headers or {}) as r:
        raw = r.read()
        status, hdrs = r.status_code, r.headers
    if status != 200:
        return status, hdrs, [orjson.loads(raw)], False
    datas = [e[6:] for e in raw.split(b"\n\n") if e.startswith(b"data: ")]
    done = bool(datas) and datas[-1] == b"[DONE]"
    return status, hdrs, [orjson.loads(d) for d in datas if d != b"[DONE]"], done


def _content(docs: list[dict]) -> str:
    return "".join(
        (d["choices"][0]["delta"].get("content") or "") for d in docs if d.get("choices")
    )


# --- Timeouts -----------------------------------------------------------------------------


def test_ttft_timeout_everywhere_is_504_and_engines_abort(http: httpx.Client, stack: Stack):
    body = {"model": MODEL, "messages": _msgs(), "sim_faults": {"ttft_delay_s": 10}}
    t0 = time.monotonic()
    status, _, docs, _ = _stream(http, body)
    elapsed = time.monotonic() - t0
    assert status == 504
    assert docs[0]["error"]["type"] == "timeout"
    assert docs[0]["error"]["code"] == "upstream_timeout"
    assert "ttft" in docs[0]["error"]["message"]
    assert 1.9 <= elapsed < 4.0  # one 1 s TTFT timeout per replica of the pool, then give up
    # headers came at once, yet each replica saw its connection closed at its timeout
    assert wait_for(lambda: stack.sim_stats("standard")["aborted"] == 2, timeout_s=2)


def test_ttft_timeout_on_one_replica_retries_elsewhere(http: httpx.Client, stack: Stack):
    slow = stack.sims["standard"][0]
    _set_faults(slow, {"ttft_delay_s": 10})
    for _ in range(8):
        status, hdrs, docs, done = _stream(http, {"model": MODEL, "messages": _msgs()})
        assert status == 200 and done
        assert hdrs["x-speedgate-tier"] == "standard"
        assert "x-speedgate-fallback" not in hdrs  # a retry in the same pool is not a fallback
        assert _content(docs)
    slow_stats = httpx.get(slow + "/sim/stats").json()
    assert slow_stats["completed"] == 0
    assert wait_for(lambda: httpx.get(slow + "/sim/stats").json()["aborted"]
                    == slow_stats["requests"])


def test_stall_vs_total_slow_but_steady_completes(http: httpx.Client):
    chunks = [f"t{i} " for i in range(8)]
    faults = {"chunks": chunks, "chunk_interval_s": 0.4}  # 3.2 s in all, gaps < 1 s stall
    status, _, docs, done = _stream(http, {"model": MODEL, "messages": _msgs(),
                                           "sim_faults": faults})
    assert status == 200 and done
    assert _content(docs) == "".join(chunks)


def test_stall_vs_total_stall_is_resumed(http: httpx.Client, stack: Stack):
    """A stall after content reached the client: caught by ``stall_s`` (not ``total_s``) and
    the stream resumed on another replica; the stalled one is aborted."""
    faults = {"chunks": ["a ", "b ", "c ", "d"], "stall_after_chunks": 3, "stall_s": 40}
    body = {"model": MODEL, "messages": _msgs(), "stream": True, "sim_faults": faults}
    times, docs = [], []
    for t, data, _ in stream_events(http, body):
        times.append(t)
        if data != b"[DONE]":
            docs.append(orjson.loads(data))
    assert _content(docs) == "a b c d"
    assert all("error" not in d for d in docs)
    assert times[-2] - times[-4] >= 0.9  # the ~1 s stall limit passed between "c" and "d"
    assert wait_for(lambda: stack.sim_stats()["aborted"] == 1, timeout_s=2)


class Blackhole:
    """A TCP server that accepts connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self._stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
                self.conns.append(conn)
            except OSError:
                continue

    def close(self) -> None:
        self._stop = True
        self.thread.join()
        for c in self.conns:
            c.close()
        self.sock.close()


def test_no_upstream_timeout(tmp_path):
    hole = Blackhole()
    s = Stack(tmp_path, timeouts=TIMEOUTS, pool_overrides=POOL,
              extra_endpoints={"standard": [hole.url]},
              health={"interval_s": 0.5, "timeout_s": 0.5, "unhealthy_threshold": 2})
    try:
        s.start()
        with httpx.Client(base_url=s.base_url, timeout=30) as http:
            durations = []
            for _ in range(12):
                t0 = time.monotonic()
                status, _, docs, done = _stream(http, {"model": MODEL, "messages": _msgs()})
                durations.append(time.monotonic() - t0)
                assert status == 200 and done and _content(docs)
            # a request that met the black hole paid one TTFT timeout, never more
            assert max(durations) < 1.0 + 1.0
            # the black hole is out of rotation: probes failed and/or it was ejected
            assert wait_for(lambda: httpx.get(s.base_url + "/readyz").json()["models"][MODEL]
                            ["standard"]["usable"] == 2, timeout_s=3)
            t0 = time.monotonic()
            for _ in range(6):
                status, _, _, done = _stream(http, {"model": MODEL, "messages": _msgs()})
                assert status == 200 and done
            assert time.monotonic() - t0 < 3.0  # unaffected once it is out
    finally:
        s.stop()
        hole.close()


# --- Retries and fallbacks ----------------------------------------------------------------


def test_no_dup_after_first_byte(http: httpx.Client, stack: Stack):
    # the tool call's arguments are cut before their end (an engine that had sent its
    # finish_reason would have finished the answer: that case ends with [DONE], see test_resume)
    faults = {"chunks": ["Hel", "lo ", '{"code":"pri', 'nt"}'], "tool_call_after_chunks": 2,
              "reset_after_chunks": 4}
    tools = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]
    body = {"model": MODEL, "messages": _msgs(), "tools": tools, "stream": True,
            "sim_faults": faults}
    docs = [orjson.loads(d) for _, d, _ in stream_events(http, body)]
    assert "error" in docs[-1]
    assert _content(docs[:-1]) == "Hello "
    args = "".join(
        c["function"].get("arguments") or ""
        for d in docs[:-1]
        for c in d["choices"][0]["delta"].get("tool_calls") or []
    )
    assert args == '{"code":"pri'
    assert len(stack.sim_requests()) == 1  # never retried once bytes reached the client


@pytest.mark.parametrize(
    "fault",
    [
        {"reset_after_chunks": 0},
        {"stall_after_chunks": 0, "stall_s": 30},
        {"malformed_after_chunks": 0},
    ],
    ids=["reset", "stall", "malformed"],
)
def test_fallback_before_content(http: httpx.Client, stack: Stack, fault: dict):
    for url in stack.sims["fast"]:
        _set_faults(url, fault)
    chunks = ["clean ", "and ", "complete"]
    status, hdrs, docs, done = _stream(
        http, {"model": f"{MODEL}-fast", "messages": _msgs(), "sim_faults": {"chunks": chunks}}
    )
    assert status == 200 and done
    assert _content(docs) == "clean and complete"  # nothing from the failed attempts
    assert sum(1 for d in docs if d["choices"][0]["delta"].get("role")) == 1
    assert hdrs["x-speedgate-tier"] == "standard"
    assert hdrs["x-speedgate-fallback"].startswith("fast:")
    assert all(d["service_tier"] == "default" for d in docs)
    assert len(stack.sim_requests("fast")) >= 1


def test_no_retry_4xx_cycle(http: httpx.Client, stack: Stack, tmp_path):
    msgs = [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Par'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    faults = {"status": 400, "error_message": "invalid tool call arguments"}
    r = http.post(CHAT, json={"model": f"{MODEL}-fast", "messages": msgs, "sim_faults": faults})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert len(stack.sim_requests()) == 1  # exactly one upstream attempt
    # a cyclic fallback chain is rejected when the config loads
    cfg = yaml.safe_load((stack.tmp / "gateway.yaml").read_text())
    cfg["models"][MODEL]["fallback"] = {"fast": "standard", "standard": "fast"}
    bad = tmp_path / "cyclic.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    out = subprocess.run([sys.executable, "-m", "gateway", "check-config", str(bad)],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "cyclic" in out.stderr


def test_429_on_one_replica_is_served_at_once_elsewhere(http: httpx.Client, stack: Stack):
    busy = stack.sims["standard"][0]
    _set_faults(busy, {"status": 429, "retry_after": 30})
    for _ in range(8):
        t0 = time.monotonic()
        r = http.post(CHAT, json={"model": MODEL, "messages": _msgs(), "max_tokens": 4})
        assert r.status_code == 200
        assert time.monotonic() - t0 < 1.0  # no Retry-After wait: another replica at once
    readyz = httpx.get(stack.base_url + "/readyz").json()
    assert readyz["models"][MODEL]["standard"]["ejected"] == 0  # busy is not broken


def test_deadline_shorter_than_retry_after_returns_the_429(http: httpx.Client, stack: Stack):
    for url in stack.sims["standard"]:
        _set_faults(url, {"status": 429, "retry_after": 30, "error_message": "busy"})
    t0 = time.monotonic()
    r = http.post(CHAT, json={"model": MODEL, "messages": _msgs()},
                  headers={"x-speedgate-timeout": "2"})
    assert time.monotonic() - t0 < 1.5
    assert r.status_code == 429
    assert r.headers["retry-after"] == "30"
    assert r.json()["error"]["type"] == "rate_limit_error"


def test_retry_budget_bounds_attempts_in_an_outage(tmp_path):
    pool = {"outlier": {"enabled": False},
            "retry": {"budget_percent": 20, "budget_min_retries": 3, "budget_window_s": 120}}
    s = Stack(tmp_path, timeouts=TIMEOUTS, pool_overrides=pool).start()
    try:
        for url in s.sims["standard"]:
            _set_faults(url, {"status": 503})
        with httpx.Client(base_url=s.base_url, timeout=30) as http:
            for _ in range(30):
                r = http.post(CHAT, json={"model": MODEL, "messages": _msgs()})
                assert r.status_code == 502
                assert r.json()["error"]["code"] == "upstream_error"
        # 30 first attempts + retries within 20 % of 30 requests + a floor of 3
        assert s.sim_stats("standard")["requests"] == 30 + 6 + 3
    finally:
        s.stop()


def test_short_retry_after_is_honoured_when_every_replica_said_it(http: httpx.Client,
                                                                   stack: Stack):
    for url in stack.sims["standard"]:
        _set_faults(url, {"status": 503, "retry_after": 1})
    timer = threading.Timer(0.5, lambda: [httpx.delete(u + "/sim/faults")
                                          for u in stack.sims["standard"]])
    timer.start()
    try:
        t0 = time.monotonic()
        r = http.post(CHAT, json={"model": MODEL, "messages": _msgs(), "max_tokens": 3})
        elapsed = time.monotonic() - t0
    finally:
        timer.join()
    assert r.status_code == 200  # the third attempt, after waiting the 1 s Retry-After
    assert 1.0 <= elapsed < 2.5
    assert len(stack.sim_requests("standard")) == 3


def test_a_short_client_deadline_is_not_the_replicas_fault(http: httpx.Client, stack: Stack):
    # review H1: a client's own short timeout must not eject healthy replicas
    for _ in range(6):
        r = http.post(CHAT, json={"model": MODEL, "messages": _msgs(),
                                  "sim_faults": {"ttft_delay_s": 2}},
                      headers={"x-stainless-timeout": "0.3"})
        assert r.status_code == 504
        assert r.json()["error"]["message"] == "upstream total timeout after 0.3s"
    ready = httpx.get(stack.base_url + "/readyz").json()["models"][MODEL]["standard"]
    assert ready["ejected"] == 0
