"""Silent prefill: a stream whose first token is slow is committed after
``keepalive_after_s`` and kept alive in the API's own form, so a hop that closes connections
idle for longer (``IdleTimeoutProxy``) does not cut it; retries after the commit stay
invisible, and a final failure is one in-band error event. The official clients parse it all.

Times: the simulator's first token comes ``DELAY_S`` after its headers (wall clock), the proxy
cuts after ``IDLE_S`` of silence, the gateway commits after ``AFTER_S`` and writes a keep-alive
every ``EVERY_S``: without the keep-alive every request here is cut."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from tests.e2e.helpers import metric
from tests.e2e.idle_proxy import IdleTimeoutProxy
from tests.e2e.protocol_helpers import parse_events
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e
DELAY_S, IDLE_S, AFTER_S, EVERY_S = 2.5, 1.0, 0.3, 0.3
SLOW = {"sim_faults": {"ttft_delay_s": DELAY_S}}
USER = [{"role": "user", "content": "Tell me about the weather."}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    # the fast pool writes no keep-alive of its own after the commit for long: only the
    # engine's (``prefill_pings_s``) relayed can keep its streams alive
    timeouts = {"connect_s": 2, "ttft_s": 10, "stall_s": 5, "total_s": 30,
                "keepalive_after_s": AFTER_S, "keepalive_interval_s": EVERY_S}
    s = Stack(tmp_path_factory.mktemp("r3ka"), timeouts=timeouts,
              tier_overrides={"fast": {"timeouts": {**timeouts, "keepalive_interval_s": 60}}},
              pool_overrides={"retry": {"budget_min_retries": 50},
                              "outlier": {"enabled": False}}).start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def proxy(stack: Stack):
    port = int(stack.base_url.rsplit(":", 1)[1])
    p = IdleTimeoutProxy(("127.0.0.1", port), IDLE_S).start()
    try:
        yield p
    finally:
        p.stop()


def _stream_via(api: str, base: str) -> str:
    """The text of one slow-first-token stream of ``api`` through ``base``, official client."""
    if api == "messages":
        client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
        with client.messages.stream(model=MODEL, max_tokens=6, messages=USER,
                                    extra_body=SLOW) as s:
            text = "".join(s.text_stream)
            assert s.get_final_message().content[0].text == text
        return text
    oai = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    if api == "chat":
        chunks = oai.chat.completions.create(model=MODEL, messages=USER, max_tokens=6,
                                             stream=True, extra_body=SLOW)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    if api == "completions":
        chunks = oai.completions.create(model=MODEL, prompt="Once upon", max_tokens=6,
                                        stream=True, extra_body=SLOW)
        return "".join(c.choices[0].text for c in chunks if c.choices)
    with oai.responses.stream(model=MODEL, input="Hi", max_output_tokens=6,
                              extra_body=SLOW) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        assert s.get_final_response().output_text == "".join(deltas)
    return "".join(deltas)


@pytest.mark.parametrize("api", ["chat", "completions", "responses", "messages"])
def test_r3_slow_first_token_behind_an_idle_timeout_completes(
        stack: Stack, proxy: IdleTimeoutProxy, api: str) -> None:
    assert _stream_via(api, proxy.url)
    assert proxy.cut == 0


@pytest.mark.parametrize("api", ["chat", "messages"])
def test_r3_engine_keepalives_are_relayed_once_committed(
        stack: Stack, proxy: IdleTimeoutProxy, api: str) -> None:
    pinged = {"sim_faults": {"ttft_delay_s": DELAY_S, "prefill_pings_s": IDLE_S / 3}}
    if api == "messages":
        client = anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0)
        with client.messages.stream(model=f"{MODEL}-fast", max_tokens=6, messages=USER,
                                    extra_body=pinged) as s:
            assert "".join(s.text_stream) and s.get_final_message().usage.output_tokens == 6
    else:
        oai = openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
        chunks = oai.chat.completions.create(model=f"{MODEL}-fast", messages=USER, max_tokens=6,
                                             stream=True, extra_body=pinged)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert proxy.cut == 0


@pytest.mark.parametrize(("path", "body", "ping"), [
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 4}, b": keepalive\n\n"),
    ("/v1/messages", {"messages": USER, "max_tokens": 4},
     b'event: ping\ndata: {"type": "ping"}\n\n'),
    ("/v1/responses", {"input": "Hi", "max_output_tokens": 4}, b": keepalive\n\n"),
], ids=["chat", "messages", "responses"])
def test_r3_committed_stream_failing_everywhere_is_one_in_band_error(
        stack: Stack, path: str, body: dict, ping: bytes) -> None:
    # every replica answers 500 after a second: the stream was committed by then
    slow_500 = {"sim_faults": {"headers_delay_s": 1.0, "status": 500}}
    with httpx.stream("POST", stack.base_url + path, timeout=20,
                      json={"model": MODEL, "stream": True, **body, **slow_500}) as r:
        raw = r.read()
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert raw.startswith(ping)
    events = parse_events(raw)
    errors = [doc for name, doc in events if name == "error" or "error" in doc]
    assert len(errors) == 1 and len(events) == (1 if path != "/v1/messages" else 1 + raw.count(
        b"event: ping"))
    if path == "/v1/messages":
        assert errors[0]["type"] == "error" and errors[0]["error"]["type"] == "api_error"
    elif path == "/v1/responses":
        assert errors[0]["type"] == "error" and errors[0]["code"] == "upstream_error"
    else:
        assert errors[0]["error"]["code"] == "upstream_error"


def test_r3_retry_after_the_commit_is_invisible(stack: Stack) -> None:
    """The replica the request goes to first fails after the commit; another one serves it,
    and the client sees one ordinary stream (the official client's final message)."""
    r = httpx.post(stack.base_url + "/v1/messages", timeout=10,
                   json={"model": MODEL, "max_tokens": 1, "messages": USER})
    first = stack.sims["standard"][int(r.headers["x-speedgate-replica"].rsplit("/", 1)[1])]
    httpx.post(first + "/sim/faults", json={"headers_delay_s": 1.0, "status": 503},
               timeout=5).raise_for_status()
    retries = metric(stack, "speedgate_retries_total")
    with httpx.stream("POST", stack.base_url + "/v1/messages", timeout=20,
                      json={"model": MODEL, "stream": True, "messages": USER,
                            "max_tokens": 3}) as r:
        raw = r.read()
    assert raw.startswith(b"event: ping\n")  # committed before the failure and the retry
    types = [doc["type"] for _, doc in parse_events(raw) if doc["type"] != "ping"]
    assert types == ["message_start", "content_block_start", *["content_block_delta"] * 3,
                     "content_block_stop", "message_delta", "message_stop"]
    assert metric(stack, "speedgate_retries_total") == retries + 1
    # and the official client parses such a stream (its replica may be the healthy one now)
    client = anthropic.Anthropic(base_url=stack.base_url, api_key="unused", max_retries=0)
    with client.messages.stream(model=MODEL, max_tokens=6, messages=USER,
                                extra_body=SLOW) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text and final.content[0].text == text and final.usage.output_tokens == 6


def test_quick_upstream_error_keeps_its_status(stack: Stack) -> None:
    """Before ``keepalive_after_s`` nothing is committed: an engine 4xx keeps its status, an
    engine 5xx everywhere is the API's 5xx (not an in-band error of a 200)."""
    client = anthropic.Anthropic(base_url=stack.base_url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.InternalServerError) as ie:
        with client.messages.stream(model=MODEL, max_tokens=4, messages=USER,
                                    extra_body={"sim_faults": {"status": 500}}) as s:
            "".join(s.text_stream)
    assert ie.value.status_code == 500
    oai = openai.OpenAI(base_url=stack.base_url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=MODEL, messages=USER, max_tokens=4, stream=True,
                                    extra_body={"sim_faults": {"status": 400}})
