"""The simulator's Responses input items (``engines.sim.responses_api.to_chat``): known item
types are rendered, an unknown one is refused with 400 (as vLLM's pydantic union refuses it),
never dropped silently."""

from __future__ import annotations

import pytest

from engines.sim.request import RequestError
from engines.sim.responses_api import to_chat


def test_unknown_input_item_is_a_400_naming_its_type() -> None:
    """``{"type": "weird"}`` is a 400 naming ``input.0.type``, not left out of the prompt."""
    with pytest.raises(RequestError) as e:
        to_chat({"model": "m", "input": [{"type": "weird"},
                                         {"role": "user", "content": "hi"}]})
    assert e.value.status == 400
    assert e.value.param == "input.0.type"


def test_known_input_items_are_accepted() -> None:
    """Messages (typed or not), function calls, their outputs and reasoning items pass."""
    chat = to_chat({"model": "m", "input": [
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"type": "message", "role": "user", "content": "and?"},
    ]})
    assert [m["role"] for m in chat["messages"]] == ["user", "assistant", "tool", "user"]
