"""An engine's in-stream error event with a 4xx code (vLLM: ``{"error": {..., "code": 400}}``
after its 200) is the client's fault only when another replica says so too: vLLM gives every
exception raised during generation code 400, so a broken replica sends it for every request.
Before any content: one retry on another replica (not spending the retry budget); after
content: one in-band error event and the replica's failure. ``avoid`` (replicas whose streams
of a request broke) is a preference: a one-replica pool still gets its fresh attempt."""

from __future__ import annotations

import httpx
import orjson
import pytest

from tests.e2e.helpers import CHAT, metric
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e
SIM_ARGS = ("--time-scale", "0.02", "--seed", "0", "--output-tokens", "12")
EJECTIONS = "speedgate_replica_ejections_total"


def _stack(tmp, replicas: int, **pool) -> Stack:
    s = Stack(tmp, replicas_per_tier=replicas, sim_args=SIM_ARGS, tiers=("standard",),
              timeouts={"connect_s": 1, "ttft_s": 3, "stall_s": 1, "total_s": 30},
              pool_overrides={"routing": {"policy": "round_robin"},
                              "outlier": {"consecutive_failures": 3, "base_ejection_s": 300,
                                          "max_ejection_percent": 50},
                              **pool})
    s.start()
    return s


@pytest.fixture
def stack(tmp_path_factory):
    # one per test (ejections last 300 s); no retry budget: the diagnostic retry needs none
    s = _stack(tmp_path_factory.mktemp("s4xx"), 2,
               retry={"budget_percent": 0, "budget_min_retries": 0})
    yield s
    s.stop()


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    s = _stack(tmp_path_factory.mktemp("s4xx1"), 1, resume={"enabled": False},
               retry={"budget_min_retries": 50})
    yield s
    s.stop()


def _asked(stack: Stack, marker: str) -> int:
    """Upstream attempts whose messages carried ``marker``."""
    return sum(marker in str((r.get("body") or {}).get("messages")) for r in stack.sim_requests())


def _stream(stack: Stack, text: str, faults: dict | None = None) -> tuple[int, str, list]:
    """(status, content text, in-band errors) of a streamed chat request."""
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": text}]}
    if faults:
        body["sim_faults"] = faults
    out, errors = "", []
    with httpx.stream("POST", stack.base_url + CHAT, json=body, timeout=30) as r:
        if r.status_code != 200:
            return r.status_code, r.read().decode(), []
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            doc = orjson.loads(line[6:])
            if "error" in doc:
                errors.append(doc["error"])
            for c in doc.get("choices", []):
                out += c["delta"].get("content") or ""
    return 200, out, errors


def test_broken_replica_is_no_black_hole(stack: Stack) -> None:
    """A replica whose every generation fails with an in-stream 400: each request it gets is
    served by the other replica (no retry budget needed), and after ``consecutive_failures``
    such failures outlier ejection ejects it; the healthy one is never ejected."""
    bad, good = stack.sims["standard"]
    httpx.post(bad + "/sim/faults", json={"error_after_chunks": 0,
                                          "error_message": "CUDA error: device lost"}
               ).raise_for_status()
    try:
        for i in range(8):
            status, text, errors = _stream(stack, f"black hole {i}")
            assert status == 200 and text and not errors, (status, text, errors)
        r = httpx.post(stack.base_url + CHAT, timeout=30, json={
            "model": MODEL, "messages": [{"role": "user", "content": "black hole json"}]})
        assert r.status_code == 200, r.text
        assert metric(stack, "speedgate_replica_ejected", replica=bad) == 1
        assert metric(stack, EJECTIONS, replica=bad) == 1
        assert metric(stack, EJECTIONS, replica=good) == 0
        # ejected: the next request goes to the healthy replica alone
        assert _stream(stack, "after ejection")[0] == 200
        assert _asked(stack, "after ejection") == 1
    finally:
        httpx.delete(bad + "/sim/faults").raise_for_status()


def test_client_4xx_on_both_replicas_is_answered(stack: Stack) -> None:
    """Both replicas refuse the request alike: the client's 400 in OpenAI's shape, at most two
    engine calls per request, no replica failure (three requests would eject otherwise)."""
    faults = {"error_after_chunks": 0, "error_message": "invalid grammar"}
    for i in range(3):
        status, text, _ = _stream(stack, f"client 4xx {i}", faults)
        assert status == 400 and orjson.loads(text)["error"]["message"] == "invalid grammar"
        r = httpx.post(stack.base_url + CHAT, timeout=30, json={
            "model": MODEL, "messages": [{"role": "user", "content": f"client 4xx json {i}"}],
            "sim_faults": faults})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["code"] == "bad_request"
    assert _asked(stack, "client 4xx") == 12
    assert metric(stack, EJECTIONS) == 0


def test_in_stream_4xx_after_content_is_the_replicas(tmp_path) -> None:
    """After content the 4xx is one in-band error event, not resumed, and the replica's failure
    (a request's validation fails before generation). Its first content event was a success
    (resetting the streak), so a pool ejecting at the first failure shows it was recorded."""
    stack = _stack(tmp_path, 2, outlier={"consecutive_failures": 1, "base_ejection_s": 300})
    try:
        for i in range(2):
            status, text, errors = _stream(stack, f"late 4xx {i}", {
                "chunks": ["a ", "b ", "c "], "error_after_chunks": 2,
                "error_message": "generation failed"})
            assert status == 200 and text == "a b " and [e["message"] for e in errors] == [
                "generation failed"]
        assert _asked(stack, "late 4xx") == 2
        assert metric(stack, EJECTIONS) == 1  # the second one: at most 50 % of the pool
    finally:
        stack.stop()


def test_single_replica_answers_the_4xx_and_records_nothing(single: Stack) -> None:
    """One replica: no telling whose fault it is; the 400 is answered and nothing recorded."""
    for i in range(3):
        status, _, _ = _stream(single, f"lone 4xx {i}", {"error_after_chunks": 0})
        assert status == 400
    assert _asked(single, "lone 4xx") == 3
    assert metric(single, EJECTIONS) == 0


def test_single_replica_fresh_attempt_after_a_break(single: Stack) -> None:
    """A JSON answer broken beyond resume (resume off) is asked again: on a one-replica pool
    the replica that broke, rather than no fresh attempt at all."""
    url = single.sims["standard"][0]
    httpx.post(url + "/sim/faults", json={"reset_after_chunks": 3}).raise_for_status()
    try:
        r = httpx.post(single.base_url + CHAT, timeout=30, json={
            "model": MODEL, "messages": [{"role": "user", "content": "fresh on one"}]})
        assert r.status_code == 502, r.text
        assert _asked(single, "fresh on one") == 3  # the first attempt and two fresh ones
    finally:
        httpx.delete(url + "/sim/faults").raise_for_status()
