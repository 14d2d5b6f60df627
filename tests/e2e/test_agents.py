"""Real coding agents through the front doors, with the official clients at their default
``max_retries``: a Claude-Code-shaped Messages request (system entries between the turns,
adaptive thinking, 24 tools, ``cache_control``, the beta header and query) and a Codex-shaped
Responses one (``prompt_cache_key``, ``session-id``, ``include``, reasoning) succeed; an agent's
own session header is its session (one replica, one ``/v1/usage`` session, one console row, its
budget); a wrong key fails at once (``x-should-retry: false``); the Responses sub-paths
(``input_items``, ``input_tokens``, ``compact``); compressed request bodies."""

from __future__ import annotations

import gzip
import uuid
from collections.abc import Iterator

import anthropic
import brotli
import httpx
import openai
import orjson
import pytest
import zstandard

from gateway.admit.auth import new_key
from tests.e2e.agents import (
    CLAUDE_CODE_BETA,
    claude_code_body,
    claude_code_headers,
    codex_body,
)
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e

AGENT, AGENT_HASH = new_key()
ADMIN, ADMIN_HASH = new_key()
PRICES = {"input_per_mtok_usd": 100.0, "cached_input_per_mtok_usd": 10.0,
          "output_per_mtok_usd": 400.0}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(
        tmp_path_factory.mktemp("agents"),
        pool_overrides={"prices": PRICES, "outlier": {"enabled": False}},
        config_extra={
            "auth": {"keys": [
                {"id": "agent", "hash": AGENT_HASH, "max_session_budget_usd": 100.0},
                {"id": "ops", "hash": ADMIN_HASH, "admin": True}]},
            "console": {"window_s": 300, "step_s": 2},
        },
    )
    s.start()
    try:
        yield s
    finally:
        s.stop()


class Counter:
    """Counts the requests a client sends (an event hook of the SDK's own HTTP client), so
    retries are seen."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, request: object) -> None:
        self.n += 1


def claude(stack: Stack, key: str = AGENT) -> tuple[anthropic.Anthropic, Counter]:
    count = Counter()
    http = anthropic.DefaultHttpxClient(event_hooks={"request": [count]}, timeout=60)
    return anthropic.Anthropic(base_url=stack.base_url, api_key=key, http_client=http), count


def codex(stack: Stack, key: str = AGENT) -> tuple[openai.OpenAI, Counter]:
    count = Counter()
    http = openai.DefaultHttpxClient(event_hooks={"request": [count]}, timeout=60)
    return openai.OpenAI(base_url=stack.base_url + "/v1", api_key=key, http_client=http), count


def admin_get(stack: Stack, path: str, **params: str) -> dict:
    r = httpx.get(stack.base_url + path, params=params,
                  headers={"authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200, r.text
    return r.json()


def test_claude_code_request_streams_through_the_anthropic_client(stack: Stack):
    session = f"cc-{uuid.uuid4().hex[:8]}"
    body = claude_code_body(3, session=session)
    client, count = claude(stack)
    extra = {k: body.pop(k) for k in ("context_management", "output_config")}
    body.pop("stream")
    with client.beta.messages.stream(
        **body, betas=CLAUDE_CODE_BETA.split(","), extra_body=extra,
        extra_headers=claude_code_headers(session),
    ) as s:
        events = [e.type for e in s]
        final = s.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    # the simulator, like a model, may answer with a tool call (24 tools offered)
    assert final.content and final.usage.output_tokens > 0 and count.n == 1, final
    sent = [r for r in stack.sim_requests() if r["body"].get("metadata", {}).get("user_id", "")
            .endswith(session)][-1]
    assert [m["role"] for m in sent["body"]["messages"]][:4] == [
        "system", "user", "assistant", "system"]  # system entries forwarded in place
    assert sent["body"]["thinking"] == {"type": "adaptive"}
    assert sent["body"]["context_management"] == extra["context_management"]
    assert len(sent["body"]["tools"]) == 24
    assert f"session_id={session} session_src=claude-code" in stack.log()


def test_count_tokens_sees_system_entries(stack: Stack):
    client, _ = claude(stack)
    body = claude_code_body(2)
    base = client.messages.count_tokens(model=MODEL, messages=body["messages"],
                                        tools=body["tools"], system=body["system"])
    body["messages"].insert(3, {"role": "system", "content": "a background notice " * 40})
    more = client.messages.count_tokens(model=MODEL, messages=body["messages"],
                                        tools=body["tools"], system=body["system"])
    assert more.input_tokens > base.input_tokens + 40


def test_codex_request_streams_through_the_openai_client(stack: Stack):
    session = f"codex-{uuid.uuid4().hex[:8]}"
    client, count = codex(stack)
    body = codex_body(cache_key=session)
    body.pop("stream")
    events = list(client.responses.create(**body, stream=True,
                                          extra_headers={"session-id": session}))
    assert events[-1].type == "response.completed" and count.n == 1
    sent = [r for r in stack.sim_requests() if r["path"] == "/v1/responses"][-1]["body"]
    assert sent["prompt_cache_key"] == session  # forwarded to the engine
    assert sent["include"] == ["reasoning.encrypted_content"]
    assert f"session_id={session} session_src=codex" in stack.log()


def test_prompt_cache_key_alone_is_the_session(stack: Stack):
    key = f"pck-{uuid.uuid4().hex[:8]}"
    client, _ = codex(stack)
    for turn in range(2):
        client.chat.completions.create(model=MODEL, max_tokens=3, prompt_cache_key=key,
                                       messages=[{"role": "user", "content": f"t{turn}"}])
    assert admin_get(stack, "/v1/usage", session_id=key, key_id="agent")["requests"] == 2
    assert f"session_id={key} session_src=prompt_cache_key" in stack.log()


def test_ten_turn_agent_session_is_one_session_on_one_replica_with_its_budget(stack: Stack):
    session = f"cc10-{uuid.uuid4().hex[:8]}"
    client, _ = claude(stack)
    replicas, spent = set(), 0.0
    for turn in range(1, 11):
        body = claude_code_body(turn, session=session, stream=False)
        raw = client.beta.messages.with_raw_response.create(
            **body, extra_headers={**claude_code_headers(session),
                                   "x-speedgate-session-budget-usd": "50"})
        raw.parse()
        replicas.add(raw.headers["x-speedgate-replica"])
        spent += float(raw.headers["x-speedgate-cost-usd"])
    assert len(replicas) == 1  # affinity by the agent's own session id
    usage = admin_get(stack, "/v1/usage", session_id=session, key_id="agent")
    assert usage["requests"] == 10
    assert usage["budget"]["spent_usd"] == pytest.approx(spent, rel=1e-6)
    rows = [s for s in admin_get(stack, "/v1/console/state")["sessions"]["most_active"]
            if s["session_id"] == session]
    assert len(rows) == 1 and rows[0]["turns"] == 10 and rows[0]["key_id"] == "agent"
    # its budget stops it: a budget below what it spent, and the client does not retry
    client, count = claude(stack)
    with pytest.raises(anthropic.RateLimitError) as e:
        client.beta.messages.create(
            **claude_code_body(11, session=session, stream=False),
            extra_headers={**claude_code_headers(session),
                           "x-speedgate-session-budget-usd": f"{spent / 2:.6f}"})
    assert e.value.response.headers["x-should-retry"] == "false"
    assert count.n == 1  # default max_retries (2), yet one request


def test_wrong_key_fails_at_once_with_both_clients(stack: Stack):
    client, count = claude(stack, key="sk-wrong")
    with pytest.raises(anthropic.AuthenticationError) as a:
        client.messages.create(model=MODEL, max_tokens=3,
                               messages=[{"role": "user", "content": "hi"}])
    assert a.value.response.headers["x-should-retry"] == "false" and count.n == 1
    oai, count = codex(stack, key="sk-wrong")
    with pytest.raises(openai.AuthenticationError) as o:
        oai.responses.create(model=MODEL, input="hi")
    assert o.value.response.headers["x-should-retry"] == "false" and count.n == 1
    oai, count = codex(stack)
    with pytest.raises(openai.NotFoundError) as nf:  # an unknown model: 404, not retried
        oai.chat.completions.create(model="no-such-model", max_tokens=3,
                                    messages=[{"role": "user", "content": "hi"}])
    assert nf.value.response.headers["x-should-retry"] == "false" and count.n == 1


def test_responses_input_items_and_input_tokens(stack: Stack):
    client, _ = codex(stack)
    first = client.responses.create(model=MODEL, input="first question", max_output_tokens=4)
    second = client.responses.create(model=MODEL, previous_response_id=first.id,
                                     input=[{"role": "user", "content": "second question"}],
                                     max_output_tokens=4)
    own = client.responses.input_items.list(first.id)
    assert [i.type for i in own.data] == ["message"]
    assert own.data[0].content[0].text == "first question"
    # the chained response: every item the engine saw, newest first by default
    items = client.responses.input_items.list(second.id, include=["message.output_text.logprobs"])
    assert [i.role for i in items.data] == ["user", "assistant", "user"]
    assert items.data[0].content[0].text == "second question"
    asc = client.responses.input_items.list(second.id, order="asc", limit=1)
    assert len(asc.data) == 1 and asc.has_more and asc.data[0].content[0].text == "first question"
    rest = client.responses.input_items.list(second.id, order="asc", after=asc.last_id)
    assert [i.id for i in rest.data] == [i.id for i in reversed(items.data)][1:]
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_" + "0" * 32)
    # input tokens, counted by a replica: the chain expanded, tools counted
    base = client.responses.input_tokens.count(model=MODEL, input="first question")
    assert base.object == "response.input_tokens" and base.input_tokens > 0
    chained = client.responses.input_tokens.count(model=MODEL, previous_response_id=first.id,
                                                  input="second question")
    assert chained.input_tokens > base.input_tokens
    tools = client.responses.input_tokens.count(model=MODEL, input="first question",
                                                tools=codex_body()["tools"])
    assert tools.input_tokens > base.input_tokens


def test_unservable_responses_paths_are_the_apis_404(stack: Stack):
    client, count = codex(stack)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.compact(model=MODEL, input="hi")
    assert count.n == 1 and "Invalid URL (POST /v1/responses/compact)" in str(e.value)
    auth = {"authorization": f"Bearer {AGENT}"}
    for method, path in [("POST", "/v1/responses/compact"), ("POST", "/v1/responses/x/y"),
                         ("GET", "/v1/responses/compact/input_items"),
                         ("DELETE", "/v1/responses/compact")]:
        r = httpx.request(method, stack.base_url + path, json={}, headers=auth)
        assert r.status_code == 404, (method, path, r.status_code)
        assert r.json()["error"]["code"] == "not_found"
    r = httpx.post(stack.base_url + "/v1/messages/batches", json={}, headers=auth)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd"])
def test_compressed_bodies_are_served(stack: Stack, coding: str):
    encode = {"gzip": gzip.compress, "deflate": __import__("zlib").compress,
              "br": brotli.compress, "zstd": zstandard.ZstdCompressor().compress}[coding]
    body = orjson.dumps(claude_code_body(2, stream=False))
    r = httpx.post(stack.base_url + "/v1/messages?beta=true", content=encode(body), timeout=30,
                   headers={"x-api-key": AGENT, "content-type": "application/json",
                            "content-encoding": coding, "anthropic-beta": CLAUDE_CODE_BETA})
    assert r.status_code == 200, r.text
    assert r.json()["type"] == "message"


def test_unknown_coding_is_415_in_the_apis_shape(stack: Stack):
    r = httpx.post(stack.base_url + "/v1/messages", content=b"\x1f\x9d...",
                   headers={"x-api-key": AGENT, "content-type": "application/json",
                            "content-encoding": "compress"})
    assert r.status_code == 415 and r.json()["type"] == "error"
    assert r.headers["x-should-retry"] == "false"


def test_a_responses_chain_without_a_session_id_is_one_session_named_by_its_first_id(
    stack: Stack,
):
    """Three turns of a ``previous_response_id`` chain, no session header, no
    ``prompt_cache_key``: one session in ``/v1/usage``, the console and the access log, named
    by the chain's first response id; every turn on one replica (affinity as before)."""
    client, _ = codex(stack)
    previous, first, replicas = None, None, set()
    for turn in range(3):
        extra = {"previous_response_id": previous} if previous else {}
        raw = client.responses.with_raw_response.create(
            model=MODEL, input=f"chain turn {turn} {uuid.uuid4().hex}", max_output_tokens=3,
            **extra)
        replicas.add(raw.headers["x-speedgate-replica"])
        previous = raw.parse().id
        first = first or previous
    assert first is not None and len(replicas) == 1
    assert admin_get(stack, "/v1/usage", session_id=first, key_id="agent")["requests"] == 3
    assert stack.log().count(f"session_id={first} session_src=responses_chain") == 3
    rows = [s for s in admin_get(stack, "/v1/console/state")["sessions"]["most_active"]
            if s["session_id"] == first]
    assert len(rows) == 1 and rows[0]["turns"] == 3


def test_chat_requests_sharing_a_conversation_prefix_are_one_session(stack: Stack):
    """Two plain chat requests with no session id whose leading messages (through the first
    user message) match are one session, the conversation hash (``session_src=conversation``),
    counted in ``/v1/usage``; a different opening is another session."""
    client, _ = codex(stack)
    task = f"task {uuid.uuid4().hex}"
    lead = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": task}]
    client.chat.completions.create(model=MODEL, max_tokens=3, messages=lead)
    client.chat.completions.create(model=MODEL, max_tokens=3, messages=[
        *lead, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}])
    client.chat.completions.create(model=MODEL, max_tokens=3, messages=[
        {"role": "user", "content": f"other {task}"}])
    lines = [line for line in stack.log().splitlines() if "session_src=conversation" in line]
    sessions = [line.split("session_id=", 1)[1].split(" ", 1)[0] for line in lines[-3:]]
    assert sessions[0] == sessions[1] != sessions[2] and sessions[0].startswith("p:")
    assert admin_get(stack, "/v1/usage", session_id=sessions[0],
                     key_id="agent")["requests"] == 2
