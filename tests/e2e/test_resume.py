"""Mid-stream resume end to end: streams broken after content reached the client (reset, stall,
malformed event, SIGKILL of the replica) are continued on another replica, same pool first then
along the fallback chain; the client sees one uninterrupted stream, byte for byte the text an
unbroken generation has, with the first attempt's id, one role chunk, one finish reason, one
usage chunk (the sum of the attempts) and one ``[DONE]``. The rules that forbid a resume end
the stream with one in-band error event."""

from __future__ import annotations

import httpx
import orjson
import pytest

from tests.e2e.helpers import CHAT, metric, wait_for
from tests.e2e.stack import MODEL, RESUME_SIM_ARGS, Stack, resume_stack

pytestmark = pytest.mark.e2e
CHUNKS = [f"part{i} " for i in range(10)]
FULL = "".join(CHUNKS)
# for breaks every 3 chunks along the whole chain (4 replicas): each continuation regenerates
# the word it was cut in (token healing), so it adds 2 new chunks; 8 fit into 4 attempts
CHAIN_CHUNKS = CHUNKS[:8]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = resume_stack(tmp_path_factory.mktemp("resume"), budget_min_retries=50)
    s.start()
    yield s
    s.stop()


def run(stack: Stack, body: dict, on_event=None) -> dict:
    """POST a stream; the client's view: text, ids, role/finish/usage/[DONE] counts, errors."""
    out = {"text": "", "ids": set(), "created": set(), "roles": 0, "finishes": [], "usage": [],
           "done": 0, "errors": [], "tier": None}
    body = {"model": MODEL, "stream": True, "stream_options": {"include_usage": True}, **body}
    with httpx.stream("POST", stack.base_url + CHAT, json=body, timeout=30) as r:
        assert r.status_code == 200, r.read()
        out["tier"] = r.headers.get("x-speedgate-tier")
        n = 0
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                out["done"] += 1
                continue
            doc = orjson.loads(line[6:])
            if "error" in doc:
                out["errors"].append(doc["error"])
                continue
            out["ids"].add(doc["id"])
            out["created"].add(doc["created"])
            if doc.get("usage"):
                out["usage"].append(doc["usage"])
            for c in doc["choices"]:
                delta = c["delta"]
                out["roles"] += "role" in delta
                out["text"] += delta.get("content") or ""
                if c.get("finish_reason"):
                    out["finishes"].append(c["finish_reason"])
            n += 1
            if on_event is not None:
                on_event(n, r)
    return out


def clean(out: dict, text: str) -> None:
    assert out["errors"] == []
    assert out["text"] == text
    assert len(out["ids"]) == 1 and len(out["created"]) == 1
    assert out["roles"] == 1 and len(out["finishes"]) == 1 and out["done"] == 1
    assert len(out["usage"]) == 1


def scripted(**faults) -> dict:
    return {"messages": [{"role": "user", "content": "go"}],
            "sim_faults": {"chunks": CHUNKS, "chunk_interval_s": 0.01, **faults}}


@pytest.mark.parametrize("fault", [
    {"reset_after_chunks": 6},
    {"stall_after_chunks": 6, "stall_s": 3},
    {"malformed_after_chunks": 6},
])
def test_break_resumed_in_the_same_pool(stack: Stack, fault: dict) -> None:
    """Failure cases resume-reset and resume-stall (and a malformed event): one stream, the
    whole text, one resume in the metric and in the access log."""

    def logged() -> int:
        return sum("resumes=1 " in ln and "tier=fast " in ln and "outcome=ok" in ln
                   for ln in stack.log_path.read_text().splitlines())

    before = metric(stack, "speedgate_resumes_total", outcome="resumed")
    lines = logged()
    out = run(stack, {**scripted(**fault), "model": f"{MODEL}-fast"})
    clean(out, FULL)
    assert out["tier"] == "fast"
    assert metric(stack, "speedgate_resumes_total", outcome="resumed") == before + 1
    assert wait_for(lambda: logged() == lines + 1)
    # one usage: the continuation's prompt prefilled again is counted, with the carried text
    assert out["usage"][0]["completion_tokens"] >= len(CHUNKS)


def test_breaks_continue_along_the_fallback_chain(stack: Stack) -> None:
    """Three breaks: fast A, fast B (the pool has no other replica), then standard."""
    body = {**scripted(reset_after_chunks=3), "model": f"{MODEL}-fast"}
    body["sim_faults"]["chunks"] = CHAIN_CHUNKS
    out = run(stack, body)
    clean(out, "".join(CHAIN_CHUNKS))
    requests = stack.sim_requests("fast") + stack.sim_requests("standard")
    continued = [r for r in requests if (r.get("body") or {}).get("continue_final_message")]
    assert len(continued) >= 3
    last = stack.sim_requests("standard")
    assert any((r.get("body") or {}).get("continue_final_message") for r in last)


def test_a_diverging_continuation_is_continued_again_carrying_the_whole_text(
    stack: Stack,
) -> None:
    """Token healing's divergence: fast A breaks after "one two three " (" " regenerated),
    fast B's continuation samples another token ("~ ", the replicas' fault) than the " " the
    client has: the splice stops it before the client sees it, and fast B (healthy: a
    divergence is no failure, neither counted nor excluded) continues again carrying the whole
    text. The client's text is exact."""
    words = ["one ", "two ", "three ", "four"]
    fast = stack.sims["fast"]
    with httpx.Client(timeout=5) as c:
        for url in fast:
            c.post(url + "/sim/faults", json={"continuation_diverges": True}).raise_for_status()
    before = metric(stack, "speedgate_resumes_total", reason="diverged", outcome="resumed")
    try:
        body = {**scripted(reset_after_chunks=3), "model": f"{MODEL}-fast"}
        body["sim_faults"]["chunks"] = words
        out = run(stack, body)
    finally:
        with httpx.Client(timeout=5) as c:
            for url in fast:
                c.delete(url + "/sim/faults").raise_for_status()
    clean(out, "".join(words))
    assert "~" not in out["text"]
    assert metric(stack, "speedgate_resumes_total", reason="diverged",
                  outcome="resumed") == before + 1
    def carried(tier: str) -> list[str]:
        return [r["body"]["messages"][-1]["content"] for r in stack.sim_requests(tier)
                if (r.get("body") or {}).get("continue_final_message")
                and r["body"].get("sim_faults", {}).get("chunks") == words]

    # healed (" " left to regenerate), then after the divergence the whole text, on fast B
    assert carried("fast") == ["one two three", "one two three "]
    assert carried("standard") == []


def test_generated_text_is_byte_identical(stack: Stack) -> None:
    msgs = [{"role": "user", "content": "Describe a river at dawn."}]
    whole = run(stack, {"messages": msgs})
    clean(whole, whole["text"])
    # every attempt breaks after 12 events (one token each at this pace): 30 tokens, 3 attempts
    # (asked of the fast tier: two fast replicas, then the standard pool's two)
    broken = run(stack, {"messages": msgs, "model": f"{MODEL}-fast",
                         "sim_faults": {"reset_after_chunks": 12}})
    clean(broken, whole["text"])
    assert broken["finishes"] == whole["finishes"]
    # summed usage: both prompts, the text once per attempt that produced it
    assert broken["usage"][0]["prompt_tokens"] > whole["usage"][0]["prompt_tokens"]


def test_sigkill_mid_stream(stack: Stack) -> None:
    killed: list[str] = []

    def kill(n: int, r: httpx.Response) -> None:
        if n == 3 and not killed:
            name = r.headers["x-speedgate-replica"]
            tier, index = name.split("/")[-2], int(name.split("/")[-1])
            url = stack.sims[tier][index]
            killed.append(url)
            stack.kill_sim(url, crash=True)

    body = {"messages": [{"role": "user", "content": "go"}],
            "sim_faults": {"chunks": CHUNKS, "chunk_interval_s": 0.1}}
    try:
        out = run(stack, body, on_event=kill)
    finally:
        for url in killed:
            stack.restart_sim(url)
    assert killed
    clean(out, FULL)


def test_unresumable_rules_end_in_band(stack: Stack) -> None:
    """A tool call under way and n > 1: one in-band error event, as without resume."""
    tool = {**scripted(reset_after_chunks=5, tool_call_after_chunks=3),
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}
    out = run(stack, tool)
    assert len(out["errors"]) == 1 and out["done"] == 0
    n2 = {"messages": [{"role": "user", "content": "go"}], "n": 2,
          "sim_faults": {"reset_after_chunks": 4}}
    out = run(stack, n2)
    assert len(out["errors"]) == 1 and out["done"] == 0
    assert metric(stack, "speedgate_resumes_total", outcome="refused") >= 2


def test_resume_disabled_pool(tmp_path) -> None:
    s = Stack(tmp_path, replicas_per_tier=2, sim_args=RESUME_SIM_ARGS, tiers=("standard",),
              pool_overrides={"resume": {"enabled": False}})
    s.start()
    try:
        out = run(s, scripted(reset_after_chunks=4))
        assert len(out["errors"]) == 1 and out["done"] == 0
        assert FULL.startswith(out["text"]) and len(out["text"]) < len(FULL)
        assert metric(s, "speedgate_resumes_total", outcome="refused", reason="broken-stream")
    finally:
        s.stop()




def test_legacy_completions_resume_byte_identical(stack: Stack) -> None:
    """Completions continue from the prompt plus the text produced: stream and JSON."""
    def text_of(body: dict) -> tuple[str, list[str]]:
        body = {"model": f"{MODEL}-fast", "prompt": "Once upon a time", **body}
        if not body.get("stream"):
            r = httpx.post(stack.base_url + "/v1/completions", json=body, timeout=30)
            assert r.status_code == 200, r.text
            c = r.json()["choices"][0]
            return c["text"], [c["finish_reason"]]
        text, finishes = "", []
        with httpx.stream("POST", stack.base_url + "/v1/completions", json=body,
                          timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    doc = orjson.loads(line[6:])
                    assert "error" not in doc
                    for c in doc["choices"]:
                        text += c["text"]
                        if c.get("finish_reason"):
                            finishes.append(c["finish_reason"])
        return text, finishes

    whole, finish = text_of({})
    faults = {"sim_faults": {"reset_after_chunks": 12}}
    assert text_of({"stream": True, **faults}) == (whole, finish)
    assert text_of(faults) == (whole, finish)


def test_json_answer_resumed_across_the_chain_names_the_tier_that_finished(stack: Stack) -> None:
    body = {**scripted(reset_after_chunks=3), "model": f"{MODEL}-fast"}
    body["sim_faults"]["chunks"] = CHAIN_CHUNKS
    r = httpx.post(stack.base_url + CHAT, json=body, timeout=30)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["choices"][0]["message"]["content"] == "".join(CHAIN_CHUNKS)
    assert r.headers["x-speedgate-tier"] == "standard" and doc["service_tier"] == "default"
    assert r.headers["x-speedgate-replica"].startswith(f"{MODEL}/standard/")
    # the tier changed during a resume: a fallback, named in the header and the access log
    assert r.headers["x-speedgate-fallback"] == "fast:resume-broken-stream"
    rid = r.headers["x-request-id"]
    logged = [ln for ln in stack.log_path.read_text().splitlines()
              if rid in ln and "fallback=" in ln]
    assert logged and "fast:resume-broken-stream" in logged[-1]


def test_content_before_a_tool_call_resumes(stack: Stack) -> None:
    """A break in the content before a tool call starts is resumed; the call follows once."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    body = {"messages": [{"role": "user", "content": "go"}], "tools": tools,
            "sim_faults": {"chunks": ["Let ", "me ", "check. ", '{"a": 1}'],
                           "tool_call_after_chunks": 3, "reset_after_chunks": 3}}
    out = run(stack, body)
    assert out["errors"] == [] and out["text"] == "Let me check. "
    assert out["finishes"] == ["tool_calls"] and out["done"] == 1 and out["roles"] == 1


def test_continuations_do_not_spend_the_retry_budget(tmp_path) -> None:
    """A pool whose retry budget allows no retry at all still resumes its broken streams:
    continuations are bounded by ``max_resumes``, not by the budget (a replica dying with many
    streams open must not lose most of them). They are still counted as retries."""
    s = Stack(tmp_path, replicas_per_tier=2, sim_args=RESUME_SIM_ARGS, tiers=("standard",),
              pool_overrides={"retry": {"budget_percent": 0, "budget_min_retries": 0},
                              "outlier": {"enabled": False}})
    s.start()
    try:
        for _ in range(3):
            clean(run(s, scripted(reset_after_chunks=6)), FULL)
        assert metric(s, "speedgate_resumes_total", outcome="resumed") == 3
        assert metric(s, "speedgate_resumes_total", outcome="failed") == 0
    finally:
        s.stop()


def test_in_stream_client_error(stack: Stack) -> None:
    """vLLM's in-stream error with a 4xx code: before the first content event, once both
    replicas sent it, the client gets that 4xx (as the engine's HTTP error); after content, one
    in-band error event, not retried; never resumed."""
    before = metric(stack, "speedgate_resumes_total")
    body = {"model": MODEL, "stream": True,
            "messages": [{"role": "user", "content": "in-stream 400 early"}],
            "sim_faults": {"error_after_chunks": 0, "error_message": "invalid grammar"}}
    r = httpx.post(stack.base_url + CHAT, json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == "invalid grammar"
    out = run(stack, {"messages": [{"role": "user", "content": "in-stream 400 late"}],
                      "sim_faults": {"chunks": CHUNKS, "error_after_chunks": 4,
                                     "error_message": "invalid grammar"}})
    assert out["text"] == "".join(CHUNKS[:4]) and out["done"] == 0
    assert [e["message"] for e in out["errors"]] == ["invalid grammar"]
    asked = [r for r in stack.sim_requests()
             if "in-stream 400" in str((r.get("body") or {}).get("messages"))]
    assert len(asked) == 3  # the early one on both replicas, the late one once
    assert metric(stack, "speedgate_resumes_total") == before


def test_break_after_every_finish_ends_the_stream(stack: Stack) -> None:
    """The replica breaks right after the finish chunk (the last content event), before its
    usage chunk and ``[DONE]``: the engine ended the generation, so the gateway ends the stream
    (usage estimated when asked, then ``[DONE]``) and the openai SDK reads it without error. One
    event earlier (before the finish) the stream is resumed as before."""
    import openai

    client = openai.OpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0)
    before = metric(stack, "speedgate_resumes_total", outcome="completed")
    resumed = metric(stack, "speedgate_resumes_total", outcome="resumed")
    for include in (True, False):
        text, finishes, usage = "", [], []
        stream = client.chat.completions.create(
            model=MODEL, stream=True, messages=[{"role": "user", "content": "go"}],
            stream_options={"include_usage": include},
            extra_body={"sim_faults": {"chunks": CHUNKS, "reset_after_chunks": len(CHUNKS)}})
        for chunk in stream:  # raises on an in-band error event
            if chunk.usage is not None:
                usage.append(chunk.usage)
            for c in chunk.choices:
                text += c.delta.content or ""
                if c.finish_reason:
                    finishes.append(c.finish_reason)
        assert text == FULL and finishes == ["stop"]
        assert len(usage) == (1 if include else 0)
        if include:
            assert usage[0].prompt_tokens > 0 and usage[0].completion_tokens >= len(CHUNKS)
            assert usage[0].total_tokens == usage[0].prompt_tokens + usage[0].completion_tokens
    assert metric(stack, "speedgate_resumes_total", outcome="completed") == before + 2
    assert metric(stack, "speedgate_resumes_total", outcome="resumed") == resumed
    # the access log: served ok, its usage marked estimated; the break recorded
    lines = [ln for ln in stack.log_path.read_text().splitlines() if "resumes=1 " in ln]
    assert lines and "outcome=ok" in lines[-1] and "usage_estimated=True" in lines[-1]
    # one event earlier the finish never reached the client: resumed as before
    out = run(stack, scripted(reset_after_chunks=len(CHUNKS) - 1))
    clean(out, FULL)
    assert metric(stack, "speedgate_resumes_total", outcome="resumed") == resumed + 1
    assert metric(stack, "speedgate_resumes_total", outcome="completed") == before + 2


def test_continuation_waits_for_a_saturated_pool(tmp_path) -> None:
    """Two replicas with one slot each: X streams on one, Y breaks on the other. Y's
    continuation finds no usable replica (its own failed it, X holds the other's only slot)
    and waits for a slot — far longer than the few short backoffs it used to give up after —
    then continues on the freed replica once X ends (its client leaves)."""
    import threading

    s = Stack(tmp_path, replicas_per_tier=2, sim_args=RESUME_SIM_ARGS, tiers=("standard",),
              timeouts={"connect_s": 1, "ttft_s": 5, "stall_s": 20, "total_s": 60},
              pool_overrides={"max_inflight_per_replica": 1,
                              "retry": {"backoff_base_s": 0.01, "backoff_max_s": 0.05},
                              "outlier": {"enabled": False}})
    s.start()
    try:
        broke = threading.Event()
        result: dict = {}

        def y() -> None:
            result["out"] = run(s, scripted(reset_after_chunks=6),
                                on_event=lambda n, _r: n == 7 and broke.set())

        long = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "x"}],
                "sim_faults": {"chunks": ["x "] * 10_000, "chunk_interval_s": 0.01}}
        with httpx.stream("POST", s.base_url + CHAT, json=long, timeout=60) as x:
            lines = x.iter_lines()
            next(lines)  # X holds its replica's only slot
            t = threading.Thread(target=y)
            t.start()
            assert broke.wait(30)  # Y's client has its 6 events: the break follows them
            for _ in range(300):  # X streams on a while (150 events, 10 ms apart at least)
                next(lines)
        t.join(30)
        clean(result["out"], FULL)
        assert metric(s, "speedgate_resumes_total", outcome="resumed") == 1
    finally:
        s.stop()
