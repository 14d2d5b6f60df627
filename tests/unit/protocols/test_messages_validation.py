"""Review finding: a malformed ``/v1/messages`` body (``system: 5``) reached the engine, crashed
the simulator (500) and, repeated, ejected the whole standard pool. A client's mistake is
refused by the gateway with Anthropic's 400, and the simulator refuses it as vLLM's schema does.
"""

from __future__ import annotations

import orjson
import pytest

from engines.sim.messages_api import SchemaError, to_chat
from gateway.errors import InvalidRequest
from gateway.protocols.messages.protocol import parse_messages

OK = {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(("patch", "param"), [
    ({"system": 5}, "system"),
    ({"system": [5]}, "system"),
    ({"system": [{"type": "text"}]}, "system"),
    ({"tools": 5}, "tools"),
    ({"tools": [5]}, "tools"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": [5]}]}, "messages.0.content"),
    ({"messages": [{"role": "user"}]}, "messages.0.content"),
    ({"messages": [{"role": "bogus", "content": "hi"}]}, "messages.0"),
    ({"max_tokens": "3"}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"model": 123}, "model"),
])
def test_review_malformed_messages_body_is_a_400_naming_the_field(patch: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_messages(orjson.dumps({**OK, **patch}), need_max_tokens=True)
    assert e.value.status == 400
    assert e.value.param == param


def test_review_max_tokens_message_says_what_is_wrong() -> None:
    with pytest.raises(InvalidRequest) as missing:
        parse_messages(orjson.dumps({k: v for k, v in OK.items() if k != "max_tokens"}),
                       need_max_tokens=True)
    assert "Field required" in missing.value.message
    with pytest.raises(InvalidRequest) as wrong:
        parse_messages(orjson.dumps({**OK, "max_tokens": -1}), need_max_tokens=True)
    assert "integer" in wrong.value.message and "required" not in wrong.value.message


def test_review_well_formed_messages_body_passes() -> None:
    body = {**OK, "system": [{"type": "text", "text": "be brief"}],
            "tools": [{"name": "t", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert parse_messages(orjson.dumps(body), need_max_tokens=True).doc["model"] == "m"


@pytest.mark.parametrize("patch", [{"system": 5}, {"tools": 5}])
def test_review_simulator_refuses_what_vllm_schema_refuses(patch: dict) -> None:
    with pytest.raises(SchemaError):
        to_chat({**OK, **patch})
