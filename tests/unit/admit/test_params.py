"""Sampling parameters checked at admission (gateway/admit/params.py): echo without generation
(``max_tokens: 0`` with ``echo``) is accepted exactly where vLLM accepts it."""

from __future__ import annotations

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.admit.params import check_sampling_params, echo_only
from gateway.app import create_app
from gateway.config import load_config
from gateway.errors import InvalidRequest


@pytest.mark.parametrize("echo", [True, 1, "true"])
def test_echo_without_generation_is_accepted_on_completions(echo):
    doc = {"prompt": "p", "max_tokens": 0, "echo": echo}
    assert echo_only(doc, "text_completion")
    check_sampling_params(doc, "text_completion")


@pytest.mark.parametrize(("doc", "operation", "param"), [
    ({"max_tokens": 0}, "text_completion", "max_tokens"),  # no echo: generation of nothing
    ({"max_tokens": 0, "echo": False}, "text_completion", "max_tokens"),
    ({"max_tokens": 0, "echo": "maybe"}, "text_completion", "max_tokens"),
    ({"max_tokens": -1, "echo": True}, "text_completion", "max_tokens"),
    ({"max_tokens": 0, "echo": True}, "chat", "max_tokens"),  # vLLM's chat refuses 0
    ({"max_completion_tokens": 0, "echo": True}, "text_completion", "max_completion_tokens"),
])
def test_zero_output_is_refused_elsewhere(doc, operation, param):
    with pytest.raises(InvalidRequest) as e:
        check_sampling_params(doc, operation)
    assert e.value.param == param


async def test_echo_only_completion_reaches_the_engine_and_comes_back():
    """Regression: the gateway answered 400 to what vLLM serves (lm-eval's loglikelihood)."""
    seen: list[dict] = []

    async def completions(request: web.Request) -> web.Response:  # vLLM's echo-only answer
        body = await request.json()
        seen.append(body)
        return web.json_response({
            "id": "cmpl-1", "object": "text_completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "text": body["prompt"], "finish_reason": "length",
                         "logprobs": None}],
            "usage": {"prompt_tokens": 2, "completion_tokens": 0, "total_tokens": 2}})

    engine = web.Application()
    engine.router.add_post("/v1/completions", completions)
    async with TestServer(engine, host="127.0.0.1") as server:
        cfg = load_config(health={"enabled": False}, models={"m": {"tiers": {"standard": {
            "served_model_name": "m", "endpoints": [str(server.make_url("")).rstrip("/")],
            "max_inflight_per_replica": 2}}}})
        app = create_app(cfg)
        async with app.api.router.lifespan_context(app.api):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
                r = await c.post("/v1/completions", json={
                    "model": "m", "prompt": "to be", "max_tokens": 0, "echo": True,
                    "logprobs": 1})
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["text"] == "to be"
                assert seen[0]["max_tokens"] == 0 and seen[0]["echo"] is True
                chat = await c.post("/v1/chat/completions", json={
                    "model": "m", "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 0, "echo": True})
                assert chat.status_code == 400 and len(seen) == 1
