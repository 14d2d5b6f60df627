"""The Responses API's front door refuses, before any replica, what it cannot serve faithfully:
input items of unknown types, ``max_output_tokens: 0``, a ``conversation`` (no Conversations
API here), and on ``POST /v1/responses/input_tokens`` the same bodies ``POST /v1/responses``
refuses; each in the OpenAI error shape naming the Responses field."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e


def _attempted(stack: Stack, request_id: str) -> str:
    """The ``attempts=`` of the access log line of ``request_id`` (replicas tried)."""
    line = next(ln for ln in stack.log().splitlines()
                if "speedgate.access" in ln and f"request_id={request_id}" in ln)
    return line.split(" attempts=")[1].split()[0]


def test_unknown_input_item_is_refused_not_dropped(stack: Stack) -> None:
    """An input item of an unknown type is a 400 naming ``input...`` (OpenAI answers 400
    ``input[0].type``, vLLM's pydantic union refuses it), not forwarded for the engine to drop
    (which passed against the simulator and failed on a real engine)."""
    r = httpx.post(stack.base_url + "/v1/responses", timeout=30, json={
        "model": MODEL, "max_output_tokens": 8,
        "input": [{"type": "weird"}, {"role": "user", "content": "hi"}]})
    assert r.status_code == 400, r.text[:200]
    assert (r.json()["error"]["param"] or "").startswith("input")


def test_unknown_input_item_alone_is_refused_before_any_replica(stack: Stack) -> None:
    """``input: [{"type": "weird"}]`` never reaches a replica, so the client never sees the
    engine's chat error naming a field it did not send (``messages``)."""
    r = httpx.post(stack.base_url + "/v1/responses", timeout=30, json={
        "model": MODEL, "max_output_tokens": 8, "input": [{"type": "weird"}]})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] != "messages" and "messages" not in err["message"], err
    assert _attempted(stack, r.headers["x-request-id"]) == "0"


def test_max_output_tokens_zero_names_the_responses_field(stack: Stack) -> None:
    """``max_output_tokens: 0`` is a 400 naming ``max_output_tokens`` before any replica (the
    engine would name its chat field, ``max_tokens``)."""
    r = httpx.post(stack.base_url + "/v1/responses", timeout=30,
                   json={"model": MODEL, "input": "hi", "max_output_tokens": 0})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "max_output_tokens", r.json()
    assert _attempted(stack, r.headers["x-request-id"]) == "0"


@pytest.mark.parametrize("extra", [
    {"tools": 1.5},
    {"service_tier": {}},
])
def test_input_tokens_validates_the_body_as_responses_does(stack: Stack, extra: dict) -> None:
    """``POST /v1/responses/input_tokens`` refuses (400) a body ``POST /v1/responses`` refuses,
    as Messages' ``count_tokens`` refuses what Messages does."""
    body = {"model": MODEL, "input": "hi", **extra}
    create = httpx.post(stack.base_url + "/v1/responses", json=body, timeout=30)
    assert create.status_code == 400
    count = httpx.post(stack.base_url + "/v1/responses/input_tokens", json=body, timeout=30)
    assert count.status_code == 400, count.text[:200]


def test_conversation_is_refused_like_background(stack: Stack) -> None:
    """``conversation`` (OpenAI's Conversations API state) is refused with 400 naming
    ``conversation``, as ``background: true`` is: the gateway serves no ``/v1/conversations``
    and would otherwise answer without the conversation the client asked for."""
    r = httpx.post(stack.base_url + "/v1/responses", timeout=30, json={
        "model": MODEL, "input": "continue", "max_output_tokens": 4, "conversation": "conv_123"})
    assert r.status_code in (400, 404), r.text[:200]
    assert r.json()["error"]["param"] == "conversation"
