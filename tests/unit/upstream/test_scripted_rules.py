"""The retry, resume and failure-case rules as unit tests, through the declared transport seam:
the gateway app in front of scripted replicas (``scripted_upstream``), no sockets, no engine
processes. The end-to-end files (tests/e2e/test_resilience.py, test_failure_cases.py,
test_resume.py) keep proving the same against the simulator."""

from __future__ import annotations

from collections.abc import Callable

import orjson

from tests.unit.upstream.scripted_upstream import (
    Call,
    Reply,
    chat_events,
    error_event,
    scripted_gateway,
)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ENGINE_500 = {"error": {"message": "boom", "type": "InternalServerError", "code": 500}}


def _first_fails(failure: Reply, then: Reply) -> Callable[[Call], Reply]:
    """A script whose first call gets ``failure`` and every later one ``then``."""
    calls: list[Call] = []

    def script(call: Call) -> Reply:
        calls.append(call)
        return failure if len(calls) == 1 else then

    return script


async def test_a_503_is_retried_on_the_other_replica_and_counted() -> None:
    script = _first_fails(Reply(503, ENGINE_500), Reply(events=chat_events("Hello")))
    async with scripted_gateway(script) as bench:
        r = await bench.client.post("/v1/chat/completions", json=CHAT)
        first, second = bench.upstream.calls
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Hello"
    assert first.replica != second.replica
    assert bench.failures()[first.replica] == 1 and bench.failures()[second.replica] == 0
    assert r.headers["x-speedgate-replica"].endswith(f"/{second.replica}")


async def test_an_in_stream_4xx_on_two_replicas_is_the_clients_answer() -> None:
    async with scripted_gateway(lambda call: Reply(events=[error_event(400, "bad schema")])
                                ) as bench:
        r = await bench.client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        calls = bench.upstream.calls
    assert r.status_code == 400 and "bad schema" in r.text
    assert len(calls) == 2 and bench.failures() == [0, 0]


async def test_the_body_rule_two_500s_alike_count_against_neither() -> None:
    async with scripted_gateway(lambda call: Reply(500, ENGINE_500)) as bench:
        r = await bench.client.post("/v1/chat/completions", json=CHAT)
        calls = bench.upstream.calls
    assert r.status_code == 502 and len(calls) == 2 and bench.failures() == [0, 0]


async def test_a_500_another_replica_serves_counts_against_the_first() -> None:
    script = _first_fails(Reply(500, ENGINE_500), Reply(events=chat_events("Hello")))
    async with scripted_gateway(script) as bench:
        r = await bench.client.post("/v1/chat/completions", json=CHAT)
        first, _ = bench.upstream.calls
    assert r.status_code == 200
    assert bench.failures()[first.replica] == 1 and sum(bench.failures()) == 1


async def test_a_stream_broken_mid_way_is_continued_on_the_other_replica() -> None:
    def script(call: Call) -> Reply:
        if call.path == "/tokenize":  # the continuation asks for the carried text's count
            return Reply(body={"count": 1, "max_model_len": 4096, "tokens": [9906]})
        if call.doc.get("continue_final_message"):  # the healed " big" comes back first
            return Reply(events=chat_events(" big", " world"))
        return Reply(events=chat_events("Hello", " big", " world"), break_after=3)

    async with scripted_gateway(script) as bench:
        r = await bench.client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        first, tokenize, second = bench.upstream.calls
    assert tokenize.path == "/tokenize" and tokenize.replica == second.replica
    text = "".join(line for line in _contents(r.content))
    assert text == "Hello big world" and b'"error"' not in r.content
    assert second.doc["messages"][-1] == {"role": "assistant", "content": "Hello"}
    assert first.replica != second.replica
    assert bench.failures()[first.replica] == 1 and bench.failures()[second.replica] == 0


async def test_the_requests_own_deadline_is_nobodys_failure() -> None:
    async with scripted_gateway(lambda call: Reply(hang=True),
                                pool={"timeouts": {"ttft_s": 30, "total_s": 0.2}}) as bench:
        r = await bench.client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert r.status_code == 504 and bench.failures() == [0, 0]


def _contents(raw: bytes) -> list[str]:
    out = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            doc = orjson.loads(line[6:])
            for c in doc.get("choices") or ():
                out.append((c.get("delta") or {}).get("content") or "")
    return out
