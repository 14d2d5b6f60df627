"""The Responses API and Anthropic Messages through the gateway in front of real vLLM 0.32,
with the official ``openai`` and ``anthropic`` clients: shapes, typed event
sequences, usage with cached tokens, tiers, ``previous_response_id`` owned by the gateway
(vLLM runs without its own store), ``count_tokens``, and vLLM's errors in each API's shape.

The tiny model's script (``engines.vllm.tinymodel``) answers the cycle text; no tool parser is
configured on these replicas, so tool calls are covered by the simulator suites only.
"""

from __future__ import annotations

import uuid

import anthropic
import httpx
import openai
import orjson
import pytest

from engines.vllm.launcher import CPU_BLOCK_SIZE
from engines.vllm.tinymodel import CYCLE_TEXT
from gateway.demo import MODEL
from tests.integration_vllm.stack import GHOST, VllmStack

pytestmark = pytest.mark.timeout(120, func_only=True)


@pytest.fixture(scope="module")
def oai(vllm_stack: VllmStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=vllm_stack.base_url + "/v1", api_key="unused",
                         max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def claude(vllm_stack: VllmStack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=vllm_stack.base_url, api_key="unused", max_retries=0,
                               timeout=60)


def _salted(n_words: int) -> str:
    return " ".join([uuid.uuid4().hex, *(f"item{i}" for i in range(n_words))])


def _typed(raw: bytes) -> list[tuple[str, dict]]:
    out = []
    for block in raw.split(b"\n\n"):
        lines = block.split(b"\n")
        name = [ln[7:].decode() for ln in lines if ln.startswith(b"event: ")]
        data = [ln[6:] for ln in lines if ln.startswith(b"data: ")]
        if data:
            out.append((name[0] if name else "", orjson.loads(b"\n".join(data))))
    return out


def test_responses_create_and_stream(oai: openai.OpenAI, vllm_stack: VllmStack) -> None:
    raw = oai.responses.with_raw_response.create(model=MODEL, input="Hello there",
                                                 max_output_tokens=64)
    r = raw.parse()
    assert r.model == MODEL and r.service_tier == "default" and r.status == "completed"
    assert r.output_text.strip() == CYCLE_TEXT.strip()
    assert raw.headers["x-speedgate-tier"] == "standard"
    assert int(raw.headers["x-speedgate-completion-tokens"]) == r.usage.output_tokens
    body = {"model": f"{MODEL}-fast", "input": "Hello there", "max_output_tokens": 64,
            "stream": True}
    with httpx.stream("POST", vllm_stack.base_url + "/v1/responses", json=body,
                      timeout=60) as resp:
        events = _typed(resp.read())
    assert resp.headers["x-speedgate-tier"] == "fast"
    types = [d["type"] for _, d in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed" and all(n == d["type"] for n, d in events)
    final = events[-1][1]["response"]
    assert final["model"] == MODEL and final["service_tier"] == "priority"
    text = "".join(d["delta"] for _, d in events if d["type"] == "response.output_text.delta")
    assert text.strip() == CYCLE_TEXT.strip() and final["usage"]["output_tokens"] > 0


def test_responses_previous_response_id_without_a_vllm_store(oai: openai.OpenAI) -> None:
    """vLLM keeps no responses (no ``VLLM_ENABLE_RESPONSES_API_STORE``): the chain works
    because the gateway expands it; the repeated prefix is served from vLLM's cache."""
    first = oai.responses.create(model=MODEL, input=_salted(300), max_output_tokens=8)
    second = oai.responses.create(model=MODEL, input="Go on", previous_response_id=first.id,
                                  max_output_tokens=8)
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached >= CPU_BLOCK_SIZE and cached % CPU_BLOCK_SIZE == 0
    assert oai.responses.retrieve(second.id).output_text == second.output_text
    with pytest.raises(openai.NotFoundError):
        oai.responses.create(model=MODEL, input="x", previous_response_id="resp_unknown")


def test_messages_create_stream_and_count_tokens(claude: anthropic.Anthropic) -> None:
    m = claude.messages.create(model=MODEL, max_tokens=64, system="You are brief.",
                               messages=[{"role": "user", "content": "Hello there"}])
    assert m.model == MODEL and m.content[0].text.strip() == CYCLE_TEXT.strip()
    assert m.stop_reason == "end_turn" and m.usage.service_tier == "standard"
    prompt = m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
    counted = claude.messages.count_tokens(model=f"{MODEL}-fast", system="You are brief.",
                                           messages=[{"role": "user", "content": "Hello there"}])
    assert counted.input_tokens == prompt
    with claude.messages.stream(model=f"{MODEL}-fast", max_tokens=64,
                                messages=[{"role": "user", "content": "Hello there"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text.strip() == CYCLE_TEXT.strip() and final.usage.service_tier == "priority"
    assert final.usage.output_tokens > 0


def test_messages_cache_reads_and_vllm_404_in_anthropic_shape(claude: anthropic.Anthropic) -> None:
    long = [{"role": "user", "content": _salted(300)}]
    claude.messages.create(model=MODEL, max_tokens=2, messages=long)
    again = claude.messages.create(model=MODEL, max_tokens=2, messages=long)
    assert again.usage.cache_read_input_tokens >= CPU_BLOCK_SIZE
    with pytest.raises(anthropic.NotFoundError) as e:
        claude.messages.create(model=GHOST, max_tokens=2,
                               messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "not_found_error"
    assert f"The model `{GHOST}` does not exist" in e.value.body["error"]["message"]
