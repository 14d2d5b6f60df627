"""A prompt that fits but prompt + output cap does not, on the OpenAI-shaped APIs, end to end
with the real SDKs against a 4,096-token replica: the gateway sends it without its cap (what
OpenCode, which always asks for 32,000 output tokens and never lowers them, needs to go on), the
engine writes what room its context leaves, and the answer says so (``x-speedgate-output-cap``,
the access log). A prompt alone too long is still refused; so is the Messages API's overflow, in
Anthropic's words (Claude Code lowers ``max_tokens`` itself). ``output_cap_overflow: refuse``
keeps the old 400: tests/e2e/test_kv_fit.py."""

from __future__ import annotations

import re
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from tests.e2e.helpers import wait_for
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e
LIMIT = 4096  # the replica's max_model_len (and KV pool), tokens
CAP = 32_000  # OpenCode's max_tokens
LOWERED = re.compile(rf"lowered; asked={CAP}; prompt=(\d+); max_model_len={LIMIT}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("caplower"), replicas_per_tier=1, tiers=("standard",),
              sim_args=("--time-scale", "0", "--max-model-len", str(LIMIT),
                        "--kv-cache-tokens", str(LIMIT), "--output-tokens", "100000"))
    try:
        s.start()
        assert wait_for(lambda: _learned(s), timeout_s=20), "gateway never learned the limits"
        yield s
    finally:
        s.stop()


def _learned(s: Stack) -> bool:
    state = httpx.get(s.base_url + "/v1/console/state", timeout=5).json()
    reps = [r for p in state["models"][0]["pools"] for r in p["replicas"]]
    return bool(reps) and all(r["engine"]["max_model_len"] for r in reps)


def _prompt(tokens: int) -> str:
    return "word " * tokens  # ~1 token per word for tiktoken and the simulator


def _client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0)


def _sent(stack: Stack) -> dict:
    return stack.sim_requests()[-1]["body"]


def test_chat_is_served_without_its_cap_and_says_so(stack: Stack) -> None:
    raw = _client(stack).chat.completions.with_raw_response.create(
        model=MODEL, max_tokens=CAP, messages=[{"role": "user", "content": _prompt(3000)}])
    m = LOWERED.fullmatch(raw.headers["x-speedgate-output-cap"])
    assert m is not None, raw.headers["x-speedgate-output-cap"]
    assert 3000 <= int(m[1]) < 3100
    r = raw.parse()
    assert r.choices[0].finish_reason in ("length", "stop") and r.choices[0].message.content
    assert r.usage is not None and r.usage.prompt_tokens + r.usage.completion_tokens <= LIMIT
    assert r.choices[0].finish_reason == "length"  # the engine wrote to the end of its context
    assert r.usage.prompt_tokens + r.usage.completion_tokens == LIMIT
    sent = _sent(stack)
    assert "max_tokens" not in sent and "max_completion_tokens" not in sent
    assert re.search(r"output_cap=lowered,asked=32000,prompt=\d+,max_model_len=4096",
                     stack.log())


def test_a_stream_is_served_the_same_way(stack: Stack) -> None:
    with _client(stack).chat.completions.with_streaming_response.create(
        model=MODEL, max_completion_tokens=CAP, stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": _prompt(3500)}],
    ) as resp:
        assert LOWERED.fullmatch(resp.headers["x-speedgate-output-cap"])
        chunks = list(resp.parse())
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and
              c.choices[0].finish_reason]
    assert finish == ["length"]
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens + usage.completion_tokens == LIMIT


def test_completions_get_the_room_as_their_cap(stack: Stack) -> None:
    """vLLM's completions default is 16 tokens, so completions are sent the room instead."""
    raw = _client(stack).completions.with_raw_response.create(
        model=MODEL, max_tokens=CAP, prompt=_prompt(3000))
    m = LOWERED.fullmatch(raw.headers["x-speedgate-output-cap"])
    assert m is not None
    assert _sent(stack)["max_tokens"] == LIMIT - int(m[1])
    r = raw.parse()
    assert r.choices[0].finish_reason in ("length", "stop") and r.choices[0].text


def test_responses_are_served_without_max_output_tokens(stack: Stack) -> None:
    raw = _client(stack).responses.with_raw_response.create(
        model=MODEL, max_output_tokens=CAP, input=_prompt(3000))
    assert LOWERED.fullmatch(raw.headers["x-speedgate-output-cap"])
    r = raw.parse()
    assert r.output_text and r.status in ("completed", "incomplete")
    assert "max_output_tokens" not in _sent(stack)


def test_a_cap_that_fits_is_sent_as_asked(stack: Stack) -> None:
    raw = _client(stack).chat.completions.with_raw_response.create(
        model=MODEL, max_tokens=50, messages=[{"role": "user", "content": _prompt(3000)}])
    assert "x-speedgate-output-cap" not in raw.headers
    assert raw.parse().usage.completion_tokens == 50  # type: ignore[union-attr]
    assert _sent(stack)["max_tokens"] == 50


def test_a_prompt_alone_too_long_and_the_messages_api_are_still_refused(stack: Stack) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        _client(stack).chat.completions.create(
            model=MODEL, max_tokens=CAP, messages=[{"role": "user", "content": _prompt(5000)}])
    assert e.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
    assert e.value.body["param"] == "messages"  # type: ignore[index]
    ac = anthropic.Anthropic(base_url=stack.base_url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as ae:
        ac.messages.create(model=MODEL, max_tokens=20_000,  # the SDK's non-streaming most
                           messages=[{"role": "user", "content": _prompt(3000)}])
    assert re.fullmatch(r"input length and `max_tokens` exceed context limit: \d+ \+ 20000 > "
                        r"4096, decrease input length or `max_tokens` and try again",
                        ae.value.body["error"]["message"])  # type: ignore[index]
