"""The official Python SDKs through the gateway over simulated replicas: ``openai`` (chat,
Responses, ``parse``) and ``anthropic``, each plain, streamed, on the fast tier, with usage,
a tool round trip and a typed error."""

from __future__ import annotations

import anthropic
import openai
import pydantic
import pytest

from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
USER = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def oai(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def ant(stack: Stack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.base_url, api_key="x", max_retries=0)


CHAT_TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": WEATHER}}]
RESP_TOOLS = [{"type": "function", "name": "weather", "parameters": WEATHER}]
ANT_TOOLS = [{"name": "weather", "input_schema": WEATHER}]


def test_openai_chat__plain(oai: openai.OpenAI) -> None:
    r = oai.chat.completions.create(model=MODEL, messages=USER, max_tokens=8)
    assert r.choices[0].message.content and r.choices[0].finish_reason == "length"


def test_openai_chat__stream(oai: openai.OpenAI) -> None:
    chunks = list(oai.chat.completions.create(model=MODEL, messages=USER, max_tokens=8,
                                              stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage.completion_tokens == 8


def test_openai_chat__fast_tier(oai: openai.OpenAI) -> None:
    raw = oai.chat.completions.with_raw_response.create(model=f"{MODEL}-fast", messages=USER,
                                                        max_tokens=4)
    assert raw.headers["x-speedgate-tier"] == "fast"


def test_openai_chat__usage(oai: openai.OpenAI) -> None:
    u = oai.chat.completions.create(model=MODEL, messages=USER, max_tokens=5).usage
    assert u.completion_tokens == 5 and u.total_tokens == u.prompt_tokens + 5 > 5


def test_openai_chat__tool_round_trip(oai: openai.OpenAI) -> None:
    r = oai.chat.completions.create(model=MODEL, messages=USER, tools=CHAT_TOOLS)
    (call,) = r.choices[0].message.tool_calls
    msgs = [*USER, r.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    final = oai.chat.completions.create(model=MODEL, messages=msgs, tools=CHAT_TOOLS)
    assert final.choices[0].finish_reason == "stop" and final.choices[0].message.content


def test_openai_chat__typed_error(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model="no-such-model", messages=USER)
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=MODEL, messages=USER, max_tokens=0)


class Weather(pydantic.BaseModel):
    city: str
    celsius: int


def test_openai_chat__parse(oai: openai.OpenAI) -> None:
    r = oai.chat.completions.parse(model=MODEL, messages=USER, response_format=Weather)
    assert isinstance(r.choices[0].message.parsed, Weather)


def test_openai_responses__plain(oai: openai.OpenAI) -> None:
    r = oai.responses.create(model=MODEL, input="hello", max_output_tokens=8)
    assert r.output_text and r.status == "incomplete"


def test_openai_responses__stream(oai: openai.OpenAI) -> None:
    with oai.responses.stream(model=MODEL, input="hello", max_output_tokens=8) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(deltas) == final.output_text != ""


def test_openai_responses__fast_tier(oai: openai.OpenAI) -> None:
    raw = oai.responses.with_raw_response.create(model=f"{MODEL}-fast", input="hi",
                                                 max_output_tokens=4)
    assert raw.headers["x-speedgate-tier"] == "fast"


def test_openai_responses__usage(oai: openai.OpenAI) -> None:
    u = oai.responses.create(model=MODEL, input="hello", max_output_tokens=6).usage
    assert u.output_tokens == 6 and u.total_tokens == u.input_tokens + 6


def test_openai_responses__tool_round_trip(oai: openai.OpenAI) -> None:
    r = oai.responses.create(model=MODEL, input="Weather in Paris?", tools=RESP_TOOLS)
    (call,) = [o for o in r.output if o.type == "function_call"]
    items = [{"role": "user", "content": "Weather in Paris?"},
             {"type": "function_call", "call_id": call.call_id, "name": call.name,
              "arguments": call.arguments},
             {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    final = oai.responses.create(model=MODEL, input=items, tools=RESP_TOOLS)
    assert [o.type for o in final.output] == ["message"] and final.output_text


def test_openai_responses__typed_error(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        oai.responses.create(model="no-such-model", input="hi")


def test_openai_responses__parse(oai: openai.OpenAI) -> None:
    r = oai.responses.parse(model=MODEL, input="Weather?", text_format=Weather)
    assert isinstance(r.output_parsed, Weather)


def test_anthropic__plain(ant: anthropic.Anthropic) -> None:
    m = ant.messages.create(model=MODEL, max_tokens=8, messages=USER)
    assert m.content[0].text and m.stop_reason == "max_tokens"


def test_anthropic__stream(ant: anthropic.Anthropic) -> None:
    with ant.messages.stream(model=MODEL, max_tokens=8, messages=USER) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == final.content[0].text != ""


def test_anthropic__fast_tier(ant: anthropic.Anthropic) -> None:
    raw = ant.messages.with_raw_response.create(model=f"{MODEL}-fast", max_tokens=4,
                                                messages=USER)
    assert raw.headers["x-speedgate-tier"] == "fast"


def test_anthropic__usage(ant: anthropic.Anthropic) -> None:
    u = ant.messages.create(model=MODEL, max_tokens=5, messages=USER).usage
    assert u.output_tokens == 5 and u.input_tokens + (u.cache_read_input_tokens or 0) > 0


def test_anthropic__tool_round_trip(ant: anthropic.Anthropic) -> None:
    m = ant.messages.create(model=MODEL, max_tokens=64, messages=USER, tools=ANT_TOOLS)
    (use,) = [b for b in m.content if b.type == "tool_use"]
    msgs = [*USER, {"role": "assistant", "content": [b.model_dump() for b in m.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                          "content": "sunny"}]}]
    final = ant.messages.create(model=MODEL, max_tokens=64, messages=msgs, tools=ANT_TOOLS)
    assert final.stop_reason == "end_turn" and final.content[-1].type == "text"


def test_anthropic__typed_error(ant: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError):
        ant.messages.create(model="no-such-model", max_tokens=4, messages=USER)
    with pytest.raises(anthropic.BadRequestError):
        ant.messages.create(model=MODEL, max_tokens=0, messages=USER)
