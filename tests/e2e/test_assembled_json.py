"""Non-stream chat and completions requests are streamed upstream and assembled by the gateway:
the JSON equals the engine's own non-stream answer field by field, stalls are caught by
``stall_s`` (not ``total_s``), and a break mid-way is resumed like a stream's."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.helpers import metric
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e
SIM_ARGS = ("--time-scale", "0.02", "--seed", "0", "--output-tokens", "24")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"]}}}]
MSGS = [{"role": "user", "content": "Tell me about the weather."}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("assembled"), replicas_per_tier=2, sim_args=SIM_ARGS,
              tiers=("standard",),
              timeouts={"connect_s": 1, "ttft_s": 3, "stall_s": 1, "total_s": 30},
              pool_overrides={"retry": {"budget_min_retries": 50},
                              "outlier": {"enabled": False}})
    s.start()
    yield s
    s.stop()


def both(stack: Stack, path: str, body: dict) -> tuple[dict, dict]:
    """(the gateway's answer, the engine's own non-stream answer to the same request)."""
    body = {"model": MODEL, **body}
    via = httpx.post(stack.base_url + path, json=body, timeout=30)
    assert via.status_code == 200, via.text
    direct = httpx.post(stack.sims["standard"][0] + path, json=body, timeout=30)
    assert direct.status_code == 200, direct.text
    return via.json(), direct.json()


def same_fields(via: dict, direct: dict) -> None:
    assert set(via) == set(direct)
    assert via["object"] == direct["object"] and via["model"] == direct["model"]
    assert via["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]
    assert via["usage"]["completion_tokens"] == direct["usage"]["completion_tokens"]
    assert via["usage"]["total_tokens"] == direct["usage"]["total_tokens"]
    assert set(via["usage"]["prompt_tokens_details"]) == set(
        direct["usage"]["prompt_tokens_details"])
    assert via["service_tier"] == "default"  # the tier that served, as for any JSON answer
    assert via["system_fingerprint"] == direct["system_fingerprint"]
    assert len(via["choices"]) == len(direct["choices"])
    for a, b in zip(via["choices"], direct["choices"], strict=True):
        assert set(a) == set(b)
        for key in ("index", "finish_reason", "stop_reason", "logprobs", "text"):
            assert a.get(key) == b.get(key), key
        if "message" in a:
            ma, mb = a["message"], b["message"]
            assert set(ma) == set(mb)
            for key in ma:
                if key != "tool_calls":
                    assert ma[key] == mb[key], key
            for ca, cb in zip(ma.get("tool_calls") or [], mb.get("tool_calls") or [],
                              strict=True):
                assert ca["function"] == cb["function"] and ca["type"] == cb["type"]
                assert ca["id"].startswith("chatcmpl-tool-")


@pytest.mark.parametrize("body", [
    {"messages": MSGS},
    {"messages": MSGS, "max_tokens": 7},
    {"messages": MSGS, "n": 3},
    {"messages": MSGS, "stop": [","]},
    {"messages": MSGS, "tools": TOOLS},
    {"messages": MSGS, "stream": False, "temperature": 0},
], ids=["plain", "length", "n3", "stop", "tools", "stream-false"])
def test_chat_json_equals_the_engines(stack: Stack, body: dict) -> None:
    same_fields(*both(stack, "/v1/chat/completions", body))


@pytest.mark.parametrize("body", [
    {"prompt": "Once upon a time"},
    {"prompt": ["one", "two"], "max_tokens": 5},
], ids=["text", "two-prompts"])
def test_completions_json_equals_the_engines(stack: Stack, body: dict) -> None:
    same_fields(*both(stack, "/v1/completions", body))


def test_stalled_json_request_is_retried_by_stall_s(stack: Stack) -> None:
    """A stall after the first token: caught after ``stall_s`` (1 s, not ``total_s``) and the
    answer resumed on the other replica; the text is the engine's uninterrupted answer."""
    direct = httpx.post(stack.sims["standard"][0] + "/v1/chat/completions",
                        json={"model": MODEL, "messages": MSGS}, timeout=30).json()
    before = metric(stack, "speedgate_resumes_total", reason="stall-timeout", outcome="resumed")
    r = httpx.post(stack.base_url + "/v1/chat/completions", timeout=30, json={
        "model": MODEL, "messages": MSGS,
        "sim_faults": {"stall_after_chunks": 14, "stall_s": 20}})
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]
    assert got["choices"][0]["finish_reason"] == direct["choices"][0]["finish_reason"]
    assert metric(stack, "speedgate_resumes_total", reason="stall-timeout",
                  outcome="resumed") == before + 1
    # honest usage: both attempts' prompts, the text once
    assert got["usage"]["prompt_tokens"] > direct["usage"]["prompt_tokens"]


@pytest.mark.parametrize("extra", [
    {"n": 2},
    {"response_format": {"type": "json_object"}},  # a grammar would restart: not continued
])
def test_json_break_that_cannot_resume_is_asked_again(stack: Stack, extra: dict) -> None:
    """A break that cannot be resumed (n=2, structured output) on one replica is asked again
    from scratch (nothing reached the client), served by the replica that does not break."""
    broken = stack.sims["standard"][0]
    marker = f"fresh {sorted(extra)}"
    before = metric(stack, "speedgate_resumes_total", outcome="refused")
    httpx.post(broken + "/sim/faults", json={"reset_after_chunks": 3})
    try:
        for i in range(4):
            r = httpx.post(stack.base_url + "/v1/chat/completions", timeout=30, json={
                "model": MODEL, **extra,
                "messages": [{"role": "user", "content": f"{marker} {i}"}]})
            assert r.status_code == 200, r.text
            doc = r.json()
            assert len(doc["choices"]) == extra.get("n", 1)
            assert all(c["finish_reason"] and c["message"]["content"] for c in doc["choices"])
            assert r.headers["x-speedgate-replica"].endswith("/1")
    finally:
        httpx.delete(broken + "/sim/faults")
    on_broken = [q for q in httpx.get(broken + "/sim/requests").json()
                 if marker in str((q.get("body") or {}).get("messages"))]
    assert on_broken and not any(q["body"].get("continue_final_message") for q in on_broken)
    assert metric(stack, "speedgate_resumes_total", outcome="refused") == before + len(on_broken)


def test_json_break_that_cannot_resume_anywhere_is_a_502(stack: Stack) -> None:
    r = httpx.post(stack.base_url + "/v1/chat/completions", timeout=30, json={
        "model": MODEL, "n": 2, "messages": [{"role": "user", "content": "n2 everywhere"}],
        "sim_faults": {"reset_after_chunks": 3}})
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "upstream_error"
    # the first attempt and MAX_FRESH (2) fresh ones: the other replica first, then, nothing
    # else being usable, a replica that broke it (avoiding one is a preference, so that a
    # one-replica pool gets its fresh attempt)
    assert _asked(stack, "n2 everywhere") == 3


def test_json_complete_before_the_break_is_served(stack: Stack) -> None:
    """The engine resets after the finish chunk (before usage and [DONE]): the answer is
    complete, served with an estimated usage."""
    chunks = ["The ", "answer ", "is ", "here."]
    r = httpx.post(stack.base_url + "/v1/chat/completions", timeout=30, json={
        "model": MODEL, "messages": [{"role": "user", "content": "finish then break"}],
        "sim_faults": {"chunks": chunks, "reset_after_chunks": len(chunks)}})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["choices"][0]["message"]["content"] == "".join(chunks)
    assert doc["choices"][0]["finish_reason"] == "stop"
    assert doc["usage"]["completion_tokens"] > 0 and doc["usage"]["prompt_tokens"] > 0
    assert _asked(stack, "finish then break") == 1


def _asked(stack: Stack, marker: str) -> int:
    """How many upstream attempts carried ``marker`` in their messages."""
    return sum(marker in str((r.get("body") or {}).get("messages")) for r in stack.sim_requests())


@pytest.mark.parametrize("after", [0, 3])
def test_in_stream_client_error_is_the_engines_4xx(stack: Stack, after: int) -> None:
    """vLLM streams ``{"error": {..., "code": 400}}`` after its 200 when generation raises
    (its non-stream answer would be that HTTP 400): the JSON client gets the 400 in OpenAI's
    shape, never resumed; before any output it is asked once more on the other replica (both
    refuse it here: the client's), after output not retried."""
    marker = f"client-error-{after}"
    before = metric(stack, "speedgate_resumes_total")
    for _ in range(3):
        r = httpx.post(stack.base_url + "/v1/chat/completions", timeout=30, json={
            "model": MODEL, "messages": [{"role": "user", "content": marker}],
            "sim_faults": {"error_after_chunks": after, "error_message": "invalid grammar"}})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["message"] == "invalid grammar" and err["type"] == "invalid_request_error"
    assert _asked(stack, marker) == (6 if after == 0 else 3)
    assert metric(stack, "speedgate_resumes_total") == before


def test_in_stream_server_error_is_still_retried(stack: Stack) -> None:
    """A 5xx code in the error event stays the replica's fault: retried on the other one."""
    r = httpx.post(stack.base_url + "/v1/chat/completions", timeout=30, json={
        "model": MODEL, "messages": [{"role": "user", "content": "server-error"}],
        "sim_faults": {"error_after_chunks": 0, "error_code": 500}})
    assert r.status_code == 502, r.text
    assert _asked(stack, "server-error") == 2


def test_resumed_json_keeps_the_engines_fields(stack: Stack) -> None:
    """A resumed JSON answer has the fields of an unbroken one: ``system_fingerprint`` and
    ``usage.prompt_tokens_details`` (its cached tokens the finishing attempt's)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "fields after resume"}]}
    direct = httpx.post(stack.sims["standard"][0] + "/v1/chat/completions", json=body,
                        timeout=30).json()
    r = httpx.post(stack.base_url + "/v1/chat/completions", timeout=30,
                   json={**body, "sim_faults": {"reset_after_chunks": 14}})
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]
    assert got["system_fingerprint"] == direct["system_fingerprint"]
    assert set(got["usage"]["prompt_tokens_details"]) == set(
        direct["usage"]["prompt_tokens_details"])
    assert got["usage"]["prompt_tokens"] > direct["usage"]["prompt_tokens"]
