"""Mid-stream resume probed as a client would meet it (written by a reviewer trying to break
it): breaks at many points of generated and scripted text, small max_tokens, stop, logprobs,
usage on/off, n=2, tools, concurrency, client disconnects during a continuation, every replica
breaking, the official openai client, JSON answers broken after their finish. Faults sit on
the fast replicas (``break_fast``): a fast-model request breaks on fast A, its continuation
again on fast B, and the standard pool finishes it."""

from __future__ import annotations

import random
import threading
import time

import httpx
import orjson
import pytest

from tests.e2e.helpers import CHAT, wait_for
from tests.e2e.stack import MODEL, Stack, resume_stack

pytestmark = pytest.mark.e2e
COMPL = "/v1/completions"
RNG = random.Random(1234)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = resume_stack(tmp_path_factory.mktemp("breaker"), budget_min_retries=500)
    s.start()
    yield s
    s.stop()


@pytest.fixture(autouse=True)
def _clean_replicas(stack):
    """Each test starts with no replica faults, empty request logs and counters."""
    stack.reset_sims()
    yield


# ---------------------------------------------------------------- client views

def chat_stream(stack: Stack, body: dict, path: str = CHAT, usage: bool | None = True,
                on_event=None, timeout: float = 40) -> dict:
    out = {"text": "", "ids": set(), "created": set(), "models": set(), "roles": 0,
           "finishes": [], "usage": [], "done": 0, "errors": [], "after_done": 0,
           "after_error": 0, "logprobs": [], "raw": [], "events": 0, "status": None}
    body = {"model": MODEL, "stream": True, **body}
    if usage is not None:
        body.setdefault("stream_options", {"include_usage": usage})
    with httpx.stream("POST", stack.base_url + path, json=body, timeout=timeout) as r:
        out["status"] = r.status_code
        if r.status_code != 200:
            out["body"] = r.read()
            return out
        n = 0
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            out["raw"].append(line)
            if out["done"]:
                out["after_done"] += 1
            if out["errors"]:
                out["after_error"] += 1
            if line == "data: [DONE]":
                out["done"] += 1
                continue
            doc = orjson.loads(line[6:])
            if "error" in doc:
                out["errors"].append(doc["error"])
                continue
            out["ids"].add(doc["id"])
            out["created"].add(doc["created"])
            out["models"].add(doc.get("model"))
            if doc.get("usage"):
                out["usage"].append(doc["usage"])
            for c in doc["choices"]:
                if path == CHAT:
                    delta = c["delta"]
                    out["roles"] += "role" in delta
                    out["text"] += delta.get("content") or ""
                else:
                    out["text"] += c.get("text") or ""
                if c.get("logprobs"):
                    out["logprobs"].append(c["logprobs"])
                if c.get("finish_reason"):
                    out["finishes"].append(c["finish_reason"])
            n += 1
            if on_event is not None and on_event(n, r):
                break
    return out


def clean(out: dict, text: str, usage: bool = True, path: str = CHAT) -> None:
    assert out["status"] == 200, out.get("body")
    assert out["errors"] == [], out["errors"]
    assert out["text"] == text
    assert len(out["ids"]) == 1 and len(out["created"]) == 1 and len(out["models"]) == 1
    if path == CHAT:
        assert out["roles"] == 1
    assert len(out["finishes"]) == 1 and out["done"] == 1 and out["after_done"] == 0
    assert len(out["usage"]) == (1 if usage else 0)


def post_json(stack: Stack, body: dict, path: str = CHAT) -> httpx.Response:
    return httpx.post(stack.base_url + path, json={"model": MODEL, **body}, timeout=40)


FAST = f"{MODEL}-fast"


def break_fast(stack: Stack, **fault) -> None:
    """Put ``fault`` on every fast replica (not on standard): a fast-model request breaks on
    fast A, its continuation breaks again on fast B (after as many events), standard finishes."""
    with httpx.Client(timeout=5) as c:
        for u in stack.sims["fast"]:
            c.post(u + "/sim/faults", json=fault).raise_for_status()


def break_all(stack: Stack, **fault) -> None:
    """Put ``fault`` on every replica of both tiers: no attempt can finish."""
    with httpx.Client(timeout=5) as c:
        for u in stack.all_sims():
            c.post(u + "/sim/faults", json=fault).raise_for_status()


def gen_msgs(tag: str) -> list[dict]:
    return [{"role": "user", "content": f"Tell me about {tag}."}]


# ---------------------------------------------------------------- random break points

@pytest.mark.parametrize("kind", ["reset", "stall", "malformed"])
def test_random_breaks_chat_stream_generated(stack: Stack, kind: str) -> None:
    msgs = gen_msgs(f"rivers {kind}")
    body = {"model": FAST, "messages": msgs, "sim_faults": {"output_tokens": 40}}
    whole = chat_stream(stack, body)
    clean(whole, whole["text"])
    bad = []
    for k in sorted(RNG.sample(range(1, 40), 3 if kind == "stall" else 8)):
        f = {f"{kind}_after_chunks": k}
        if kind == "stall":
            f["stall_s"] = 3
        break_fast(stack, **f)
        out = chat_stream(stack, body)
        try:
            clean(out, whole["text"])
            assert out["finishes"] == whole["finishes"]
        except AssertionError as e:
            bad.append((k, str(e)[:300]))
    assert not bad, bad


@pytest.mark.parametrize("kind", ["reset", "malformed"])
def test_random_breaks_chat_json_generated(stack: Stack, kind: str) -> None:
    msgs = gen_msgs(f"json {kind}")
    body = {"model": FAST, "messages": msgs, "sim_faults": {"output_tokens": 40}}
    whole = post_json(stack, body).json()
    bad = []
    for k in sorted(RNG.sample(range(1, 40), 6)):
        break_fast(stack, **{f"{kind}_after_chunks": k})
        r = post_json(stack, body)
        d = r.json()
        if r.status_code != 200 or d["choices"][0]["message"] != whole["choices"][0]["message"] \
                or d["choices"][0]["finish_reason"] != whole["choices"][0]["finish_reason"]:
            bad.append((k, r.status_code, r.text[:300]))
    assert not bad, (whole["choices"][0], bad)


@pytest.mark.parametrize("stream", [True, False])
def test_random_breaks_completions(stack: Stack, stream: bool) -> None:
    body = {"model": FAST, "prompt": "Once upon a time in a land far away",
            "sim_faults": {"output_tokens": 40}}
    whole = post_json(stack, body, COMPL).json()["choices"][0]
    bad = []
    for k in sorted(RNG.sample(range(1, 40), 6)):
        break_fast(stack, reset_after_chunks=k)
        if stream:
            out = chat_stream(stack, body, path=COMPL)
            try:
                clean(out, whole["text"], path=COMPL)
                assert out["finishes"] == [whole["finish_reason"]]
            except AssertionError as e:
                bad.append((k, str(e)[:300]))
        else:
            r = post_json(stack, body, COMPL)
            c = r.json()["choices"][0] if r.status_code == 200 else {}
            if (c.get("text"), c.get("finish_reason")) != (whole["text"], whole["finish_reason"]):
                bad.append((k, r.text[:300]))
    assert not bad, (whole["text"], bad)


# ---------------------------------------------------------------- max_tokens near the limit

@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_small_max_tokens_break_near_limit_chat(stack: Stack, field: str) -> None:
    body = {"model": FAST, "messages": gen_msgs(f"limits {field}"), field: 8}
    whole = chat_stream(stack, body)
    clean(whole, whole["text"])
    assert whole["finishes"] == ["length"]
    bad = []
    for k in range(1, 8):
        break_fast(stack, reset_after_chunks=k)
        out = chat_stream(stack, body)
        if out["errors"] or out["text"] != whole["text"] or out["finishes"] != ["length"]:
            bad.append((k, out["text"], out["finishes"], out["errors"]))
    assert not bad, f"unbroken {whole['text']!r}; broken: {bad}"


def test_max_tokens_1_break_after_first_token(stack: Stack) -> None:
    body = {"model": FAST, "messages": gen_msgs("one token"), "max_tokens": 1}
    whole = chat_stream(stack, body)
    break_fast(stack, reset_after_chunks=1)
    out = chat_stream(stack, body)
    clean(out, whole["text"])
    assert out["finishes"] == whole["finishes"] == ["length"]


# ---------------------------------------------------------------- stop sequences

def test_stop_sequence_with_break_before_stop(stack: Stack) -> None:
    body = {"model": FAST, "messages": gen_msgs("stopping"), "sim_faults": {"output_tokens": 40}}
    whole = chat_stream(stack, body)
    stop_word = whole["text"].split()[20]
    body["stop"] = [stop_word]
    ref = chat_stream(stack, body)
    clean(ref, ref["text"])
    assert ref["finishes"] == ["stop"] and len(ref["text"]) < len(whole["text"])
    bad = []
    for k in (3, 10, 17):
        break_fast(stack, reset_after_chunks=k)
        out = chat_stream(stack, body)
        if out["errors"] or out["text"] != ref["text"] or out["finishes"] != ["stop"]:
            bad.append((k, out["text"], out["finishes"], out["errors"]))
    assert not bad, (ref["text"], bad)


# ---------------------------------------------------------------- logprobs

def test_logprobs_break(stack: Stack) -> None:
    body = {"model": FAST, "messages": gen_msgs("logprobs"), "logprobs": True, "top_logprobs": 2}
    cb = {"model": FAST, "prompt": "Hi there", "logprobs": 2}
    whole = chat_stream(stack, body)
    clean(whole, whole["text"])
    cw = chat_stream(stack, cb, path=COMPL)  # both references unbroken
    break_fast(stack, reset_after_chunks=7)
    out = chat_stream(stack, body)
    clean(out, whole["text"])
    out = chat_stream(stack, cb, path=COMPL)
    clean(out, cw["text"], path=COMPL)
    prompts = [r["body"].get("prompt") for r in stack.sim_requests()]
    assert any(p and p.startswith("Hi there") and p != "Hi there" for p in prompts), prompts


# ---------------------------------------------------------------- usage on / off

@pytest.mark.parametrize("usage", [True, False, None])
def test_include_usage_on_off(stack: Stack, usage) -> None:
    body = {"model": FAST, "messages": gen_msgs(f"usage {usage}")}
    whole = chat_stream(stack, body, usage=usage)
    clean(whole, whole["text"], usage=bool(usage))
    for kind in ("reset", "malformed"):
        break_fast(stack, **{f"{kind}_after_chunks": 9})
        out = chat_stream(stack, body, usage=usage)
        clean(out, whole["text"], usage=bool(usage))
        if usage:
            u = out["usage"][0]
            assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
            assert u["completion_tokens"] >= whole["usage"][0]["completion_tokens"]


def test_continuous_usage_stats_break(stack: Stack) -> None:
    body = {"model": FAST, "messages": gen_msgs("continuous"),
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    whole = chat_stream(stack, body, usage=None)
    break_fast(stack, reset_after_chunks=9)
    out = chat_stream(stack, body, usage=None)
    assert out["errors"] == [] and out["text"] == whole["text"] and out["done"] == 1
    assert out["roles"] == 1 and len(out["finishes"]) == 1
    seen = [u["completion_tokens"] for u in out["usage"]]
    assert seen == sorted(seen), seen


# ---------------------------------------------------------------- n = 2

def test_n2_stream_break_one_error(stack: Stack) -> None:
    break_fast(stack, reset_after_chunks=6)
    out = chat_stream(stack, {"model": FAST, "messages": gen_msgs("n2"), "n": 2})
    assert len(out["errors"]) == 1 and out["done"] == 0 and out["after_error"] == 0
    assert not out["finishes"]


def test_json_n2_broken_on_every_fast_replica_is_asked_of_the_next_tier(stack: Stack) -> None:
    body = {"model": FAST, "messages": gen_msgs("n2 json"), "n": 2}
    whole = post_json(stack, body).json()
    break_fast(stack, reset_after_chunks=6)
    r = post_json(stack, body)
    assert r.status_code == 200, r.text
    got = [c["message"]["content"] for c in r.json()["choices"]]
    assert got == [c["message"]["content"] for c in whole["choices"]]


# ---------------------------------------------------------------- tools

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
TOOL_CHUNKS = ["Let ", "me ", "check ", "that. ", '{"a": ', '1, "b"', ': 2}']


def _tool_args(out: dict) -> str:
    args = ""
    for line in out["raw"]:
        if line.startswith("data: {"):
            for c in orjson.loads(line[6:]).get("choices", []):
                for tc in c["delta"].get("tool_calls") or []:
                    args += tc.get("function", {}).get("arguments") or ""
    return args


def test_tool_content_then_call_break_in_content(stack: Stack) -> None:
    body = {"model": FAST, "messages": gen_msgs("tools"), "tools": TOOLS,
            "sim_faults": {"chunks": TOOL_CHUNKS, "tool_call_after_chunks": 4}}
    bad = []
    # (k=3 would make fast B's continuation break right after the tool-call header: a break
    # inside a call, correctly refused; both fast replicas carry the fault)
    for k in (1, 2):
        break_fast(stack, reset_after_chunks=k)
        out = chat_stream(stack, body)
        if out["errors"] or out["text"] != "Let me check that. " \
                or out["finishes"] != ["tool_calls"] or _tool_args(out) != '{"a": 1, "b": 2}':
            bad.append((k, out["text"], out["finishes"], _tool_args(out), out["errors"]))
    assert not bad, bad


def test_tool_break_inside_call_stream_and_json(stack: Stack) -> None:
    body = {"model": FAST, "messages": gen_msgs("tools2"), "tools": TOOLS,
            "sim_faults": {"chunks": TOOL_CHUNKS, "tool_call_after_chunks": 4}}
    break_fast(stack, reset_after_chunks=6)
    out = chat_stream(stack, body)
    assert len(out["errors"]) == 1 and out["done"] == 0 and not out["finishes"]


# ---------------------------------------------------------------- concurrency

def test_concurrent_broken_streams(stack: Stack) -> None:
    refs = {i: chat_stream(stack, {"model": FAST, "messages": gen_msgs(f"conc {i}")})["text"]
            for i in range(8)}
    break_fast(stack, reset_after_chunks=7, chunk_interval_s=0.02)
    results: dict[int, dict] = {}

    def go(i: int) -> None:
        results[i] = chat_stream(stack, {"model": FAST, "messages": gen_msgs(f"conc {i}")})

    ts = [threading.Thread(target=go, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    bad = []
    for i in range(8):
        try:
            clean(results[i], refs[i])
        except AssertionError as e:
            bad.append((i, str(e)[:300]))
    assert not bad, bad


# ---------------------------------------------------------------- client disconnect

def _stats(stack: Stack) -> list[dict]:
    return [httpx.get(u + "/sim/stats", timeout=5).json() for u in stack.all_sims()]


def test_client_disconnect_during_continuation_aborts_engine(stack: Stack) -> None:
    break_fast(stack, reset_after_chunks=5, chunk_interval_s=0.05)
    body = {"model": FAST, "messages": gen_msgs("disconnect"), "max_tokens": 2000,
            "sim_faults": {"output_tokens": 2000}}
    with httpx.Client(timeout=5) as c:  # fast B never breaks: a long continuation
        c.delete(stack.sims["fast"][1] + "/sim/faults")
        c.post(stack.sims["fast"][1] + "/sim/faults", json={"chunk_interval_s": 0.05})
    out = chat_stream(stack, body, on_event=lambda n, r: n >= 10)
    assert out["errors"] == []
    continued = [r for r in stack.sim_requests()
                 if (r.get("body") or {}).get("continue_final_message")]
    assert continued, "no continuation was asked"
    ok = wait_for(lambda: all(s["running"] == 0 and s["waiting"] == 0 for s in _stats(stack)),
                  timeout_s=5)
    assert ok, _stats(stack)
    assert sum(s["aborted"] for s in _stats(stack)) >= 1, _stats(stack)


def test_client_disconnect_during_stall(stack: Stack) -> None:
    """Client leaves during the stall before the break is detected: no continuation after."""
    break_fast(stack, stall_after_chunks=5, stall_s=30, chunk_interval_s=0.02)
    body = {"model": FAST, "messages": gen_msgs("disc2"), "max_tokens": 2000,
            "sim_faults": {"output_tokens": 2000}}
    out = chat_stream(stack, body, on_event=lambda n, r: n >= 5)
    assert out["errors"] == []
    time.sleep(2.5)  # past stall_s
    continued = [r for r in stack.sim_requests()
                 if (r.get("body") or {}).get("continue_final_message")]
    assert not continued, "a continuation was started for a client that had left"
    assert wait_for(lambda: all(s["running"] == 0 for s in _stats(stack)), timeout_s=5)


# ---------------------------------------------------------------- every replica breaks

@pytest.mark.parametrize(("faults", "bound_s"), [
    ({"reset_after_chunks": 3}, 15),
    ({"stall_after_chunks": 3, "stall_s": 60}, 25),
], ids=["reset", "stall"])
def test_every_replica_breaks_one_error_no_hang(stack: Stack, faults: dict, bound_s: float) -> None:
    """Every replica breaks the stream (a reset, or a stall past stall_s): one in-band error
    after the relayed part, no [DONE], no finish, one stream id, within the request's bounds."""
    break_all(stack, **faults)
    t0 = time.monotonic()
    out = chat_stream(stack, {"model": f"{MODEL}-fast", "messages": gen_msgs(f"all{faults}"),
                              "max_tokens": 200, "sim_faults": {"output_tokens": 200}})
    dt = time.monotonic() - t0
    assert dt < bound_s, dt
    assert len(out["errors"]) == 1 and out["done"] == 0 and out["after_error"] == 0
    assert len(out["finishes"]) == 0 and out["roles"] == 1
    assert len(out["ids"]) == 1


def test_every_replica_breaks_json(stack: Stack) -> None:
    break_all(stack, reset_after_chunks=3)
    t0 = time.monotonic()
    r = post_json(stack, {"model": f"{MODEL}-fast", "messages": gen_msgs("alljson"),
                          "max_tokens": 200, "sim_faults": {"output_tokens": 200}})
    assert time.monotonic() - t0 < 25
    assert r.status_code >= 500, r.text
    assert "error" in r.json()


# ---------------------------------------------------------------- openai client

def test_openai_client_stream_and_json(stack: Stack) -> None:
    import openai

    client = openai.OpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0)
    msgs = gen_msgs("openai sdk")
    ref = client.chat.completions.create(model=FAST, messages=msgs)
    c0 = client.completions.create(model=FAST, prompt="Alpha beta gamma")
    for k in (2, 11, 20):
        break_fast(stack, reset_after_chunks=k)
        text, fin, ids = "", [], set()
        for ch in client.chat.completions.create(
                model=FAST, messages=msgs, stream=True, stream_options={"include_usage": True}):
            ids.add(ch.id)
            for c in ch.choices:
                text += c.delta.content or ""
                if c.finish_reason:
                    fin.append(c.finish_reason)
        assert text == ref.choices[0].message.content and fin == [ref.choices[0].finish_reason]
        assert len(ids) == 1
        break_fast(stack, malformed_after_chunks=k)
        res = client.chat.completions.create(model=FAST, messages=msgs)
        assert res.choices[0].message.content == ref.choices[0].message.content
        assert res.choices[0].finish_reason == ref.choices[0].finish_reason
        break_fast(stack, reset_after_chunks=k)
        c = client.completions.create(model=FAST, prompt="Alpha beta gamma")
        assert c.choices[0].text == c0.choices[0].text


# ---------------------------------------------------------------- JSON break after finish

def test_json_break_after_finish(stack: Stack) -> None:
    chunks = [f"w{i} " for i in range(6)]
    for path in (CHAT, COMPL):
        body = {"model": FAST, "sim_faults": {"chunks": chunks}}
        body |= {"messages": gen_msgs("jf")} if path == CHAT else {"prompt": "jf"}
        break_fast(stack, reset_after_chunks=len(chunks))
        r = post_json(stack, body, path)
        assert r.status_code == 200, r.text
        d = r.json()
        c = d["choices"][0]
        text = c["message"]["content"] if path == CHAT else c["text"]
        assert text == "".join(chunks) and c["finish_reason"] == "stop"
        assert d["usage"]["completion_tokens"] > 0
        assert d["usage"]["total_tokens"] == (d["usage"]["prompt_tokens"]
                                              + d["usage"]["completion_tokens"])


# ---------------------------------------------------------------- odd texts

@pytest.mark.parametrize("chunks", [
    ["Hello"],
    ["Hello", " world"],
    ["a", "  ", "b", "\n\n", "c ", " d"],
    ["line1\n", "line2\n", "\tindent", "ed\n", "end"],
    ["你好", "世界", "，", "今天", "天气", "很好", "。"],
    ["x" * 30, "y" * 30, "z" * 10, " tail"],
    ["word", "-", "hyphen", "ated ", "done."],
    ["emoji 😀", "😀😀 ", "ok"],
])
def test_scripted_odd_texts_every_break(stack: Stack, chunks: list[str]) -> None:
    full = "".join(chunks)
    bad = []
    for k in range(1, len(chunks) + 1):
        for kind in ("reset", "malformed"):
            break_fast(stack, **{f"{kind}_after_chunks": k})
            out = chat_stream(stack, {"model": FAST, "messages": gen_msgs("odd"),
                                      "sim_faults": {"chunks": chunks}})
            if out["errors"] or out["text"] != full or out["done"] != 1 or out["roles"] != 1 \
                    or len(out["finishes"]) != 1 or len(out["usage"]) != 1:
                bad.append((kind, k, out["text"], out["errors"], out["finishes"]))
    assert not bad, bad


# ================================================================ found broken, now rules

def test_json_whose_continuation_breaks_after_the_finish_is_served(stack: Stack) -> None:
    """Non-stream chat: attempt 1 breaks after 4 of 7 scripted chunks (resumed); the
    continuation (" ", c4, c5, c6: the finish on its 4th event) breaks right after its finish,
    before usage and [DONE]. Served whole, as the same stream is (was a 500: the assembled
    answer's codec had no ending)."""
    chunks = [f"c{i} " for i in range(7)]
    body = {"messages": [{"role": "user", "content": "x"}],
            "sim_faults": {"chunks": chunks, "reset_after_chunks": 4}}
    out = chat_stream(stack, body)
    clean(out, "".join(chunks))  # holds
    r = post_json(stack, body)
    assert r.status_code == 200, r.text  # was a 500 (AssemblyCodec had no ending)
    assert r.json()["choices"][0]["message"]["content"] == "".join(chunks)


def test_json_tool_call_broken_on_every_fast_replica_is_asked_of_the_next_tier(
    stack: Stack,
) -> None:
    """Non-stream chat, both fast replicas break inside a tool call (not resumable): the
    JSON answer is asked again from scratch, and the fallback tier's replicas come before a
    replica that broke it (was: fast/1, fast/0, fast/1 again, then 502)."""
    body = {"model": FAST, "messages": gen_msgs("tools json"), "tools": TOOLS,
            "sim_faults": {"chunks": TOOL_CHUNKS, "tool_call_after_chunks": 4}}
    break_fast(stack, reset_after_chunks=6)
    r = post_json(stack, body)
    assert r.status_code == 200, r.text  # was 502: fast/1, fast/0, fast/1 again
    m = r.json()["choices"][0]["message"]
    assert m["content"] == "Let me check that. "
    assert m["tool_calls"][0]["function"]["arguments"] == '{"a": 1, "b": 2}'


@pytest.mark.parametrize("path,body,k", [
    (COMPL, {"prompt": "Tell me 35 things"}, 4),
    (CHAT, {"messages": [{"role": "user", "content": "Tell me 16 things"}]}, 2),
])
def test_length_limited_resume_keeps_every_word(
    stack: Stack, path: str, body: dict, k: int,
) -> None:
    """max_tokens=8, one break after k events on the replica that served the unbroken
    request: the resumed answer has every word of the unbroken one, finish 'length'. (A
    tiktoken estimate of the carried text counted "finds" as 2 tokens where the engine made 1,
    and the answer lost its last word: the carried tokens are counted by the engine.)"""
    body = {"model": MODEL, "max_tokens": 8, **body}
    ref = chat_stream(stack, body, path=path)
    clean(ref, ref["text"], path=path)
    assert ref["finishes"] == ["length"]
    # break on the replica the affinity routes this prompt to (the one that served it)
    for u in stack.sims["standard"]:
        if httpx.get(u + "/sim/requests", timeout=5).json():
            httpx.post(u + "/sim/faults", json={"reset_after_chunks": k}, timeout=5)
    out = chat_stream(stack, body, path=path)
    assert any(r["body"].get("continue_final_message")
               or r["body"].get("prompt", body.get("prompt")) != body.get("prompt")
               for r in stack.sim_requests()), "no continuation: the break did not happen"
    assert out["errors"] == [] and out["finishes"] == ["length"]
    assert out["text"] == ref["text"]  # was one word short (a tiktoken estimate)


# ---------------------------------------------------------------- other refusal rules

def _raw_events(stack: Stack, path: str, body: dict) -> list[str]:
    lines = []
    with httpx.stream("POST", stack.base_url + path, json=body, timeout=40) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line:
                lines.append(line)
    return lines


@pytest.mark.parametrize("extra,path", [
    ({"response_format": {"type": "json_object"}}, CHAT),
    ({"guided_regex": "[a-z ]+"}, CHAT),
    ({"echo": True}, COMPL),
])
def test_refused_rules_one_inband_error(stack: Stack, extra: dict, path: str) -> None:
    break_fast(stack, reset_after_chunks=4)
    body = {"model": FAST, **extra}
    body |= {"messages": gen_msgs("rules")} if path == CHAT else {"prompt": "rules"}
    out = chat_stream(stack, body, path=path)
    assert len(out["errors"]) == 1 and out["done"] == 0 and out["after_error"] == 0
    assert not out["finishes"]


def test_responses_and_messages_streams_resume(stack: Stack) -> None:
    """A Responses stream's and a Messages stream's break inside their text continue along the
    chain (fast A, fast B, standard) into one response / one message whose text is an
    unbroken generation's."""
    body = {"model": FAST, "max_tokens": 100, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}
    resp_body = {"model": FAST, "input": "hi", "stream": True, "max_output_tokens": 100}
    whole = _messages_text(_raw_events(stack, "/v1/messages", body))
    resp_whole = _responses_text(_raw_events(stack, "/v1/responses", resp_body))
    break_fast(stack, reset_after_chunks=4)
    ev = _raw_events(stack, "/v1/responses", resp_body)
    assert not any(e == "event: error" for e in ev)
    assert sum(e == "event: response.completed" for e in ev) == 1
    assert _responses_text(ev) == resp_whole and resp_whole
    ev = _raw_events(stack, "/v1/messages", body)
    assert not any(e == "event: error" for e in ev)
    assert sum(e == "event: message_start" for e in ev) == 1
    assert sum(e == "event: message_stop" for e in ev) == 1
    assert _messages_text(ev) == whole and whole


def _responses_text(ev: list[str]) -> str:
    """The text of the ``response.output_text.delta`` events among raw SSE lines."""
    out = ""
    for line in ev:
        if line.startswith("data: ") and '"response.output_text.delta"' in line:
            out += orjson.loads(line[6:])["delta"]
    return out


def _messages_text(ev: list[str]) -> str:
    """The text of the ``text_delta`` events among raw SSE lines."""
    out = ""
    for line in ev:
        if line.startswith("data: ") and '"text_delta"' in line:
            out += orjson.loads(line[6:])["delta"]["text"]
    return out
