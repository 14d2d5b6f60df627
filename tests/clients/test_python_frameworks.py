"""Agent frameworks over the gateway: ``openai-agents`` (a run with a function tool that ends,
on the chat and the Responses model) and ``langchain-openai`` (``ChatOpenAI`` on chat and on
the Responses API): plain, stream, fast tier, usage, a tool round trip, typed errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import agents as oa
import openai
import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e
CALLS: list[str] = []


@oa.function_tool
def weather(city: str) -> str:
    """The weather of a city."""
    CALLS.append(city)
    return "sunny"


def _agent_run(stack: Stack, responses: bool) -> None:
    oa.set_tracing_disabled(True)  # no trace export to any outside endpoint
    client = openai.AsyncOpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0)
    kind = oa.OpenAIResponsesModel if responses else oa.OpenAIChatCompletionsModel
    agent = oa.Agent(name="forecaster", instructions="Answer with the weather.",
                     tools=[weather], model=kind(model=MODEL, openai_client=client))
    CALLS.clear()
    result = oa.Runner.run_sync(agent, "Weather in Paris?", max_turns=5)
    assert len(CALLS) == 1 and isinstance(result.final_output, str) and result.final_output
    assert sum(1 for i in result.new_items if i.type == "tool_call_output_item") == 1


def test_openai_agents__tool_run_chat(stack: Stack) -> None:
    _agent_run(stack, responses=False)


def test_openai_agents__tool_run_responses(stack: Stack) -> None:
    _agent_run(stack, responses=True)


@tool
def lc_weather(city: str) -> str:
    """The weather of a city."""
    return "sunny"


def _llm(stack: Stack, responses: bool, **kw: Any) -> ChatOpenAI:
    return ChatOpenAI(model=kw.pop("model", MODEL), base_url=stack.base_url + "/v1",
                      api_key="x", max_retries=0, use_responses_api=responses, **kw)


def _plain(stack: Stack, responses: bool) -> None:
    assert _llm(stack, responses, max_tokens=8).invoke("hello").text


def _stream(stack: Stack, responses: bool) -> None:
    parts = list(_llm(stack, responses, max_tokens=8).stream("hello"))
    assert "".join(p.text for p in parts)


def _fast_tier(stack: Stack, responses: bool) -> None:
    llm = _llm(stack, responses, model=f"{MODEL}-fast", max_tokens=4,
               include_response_headers=True)
    assert llm.invoke("hello").response_metadata["headers"]["x-speedgate-tier"] == "fast"


def _usage(stack: Stack, responses: bool) -> None:
    u = _llm(stack, responses, max_tokens=5).invoke("hello").usage_metadata
    assert u["output_tokens"] == 5 and u["total_tokens"] == u["input_tokens"] + 5


def _tool_round_trip(stack: Stack, responses: bool) -> None:
    llm = _llm(stack, responses).bind_tools([lc_weather])
    msgs: list[Any] = [HumanMessage("Weather in Paris?")]
    first = llm.invoke(msgs)
    (call,) = first.tool_calls
    msgs += [first, ToolMessage("sunny", tool_call_id=call["id"])]
    final = llm.invoke(msgs)
    assert not final.tool_calls and final.text


def _typed_error(stack: Stack, responses: bool) -> None:
    with pytest.raises(openai.NotFoundError):
        _llm(stack, responses, model="no-such-model").invoke("hello")


def _case(fn: Callable[[Stack, bool], None], responses: bool) -> Callable[[Stack], None]:
    def test(stack: Stack) -> None:
        fn(stack, responses)

    return test


for _name, _fn in (("plain", _plain), ("stream", _stream), ("fast_tier", _fast_tier),
                   ("usage", _usage), ("tool_round_trip", _tool_round_trip),
                   ("typed_error", _typed_error)):
    for _sdk, _responses in (("langchain_chat", False), ("langchain_responses", True)):
        _t = _case(_fn, _responses)
        _t.__name__ = f"test_{_sdk}__{_name}"
        globals()[_t.__name__] = _t
