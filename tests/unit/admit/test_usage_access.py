"""``GET /v1/usage`` of sessions with auth on: a plain key reads its own sessions (a tree with
its subagents), another key's session and an unknown one are the same 404 in OpenAI's error
shape (ids never leak); and the access line of a refused request keeps the model, tier and
``stream`` the client sent."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from engines.sim.testing import start_sim
from gateway.admit.auth import new_key
from gateway.app import create_app
from gateway.config import load_config

A, A_HASH = new_key()
B, B_HASH = new_key()
ADMIN, ADMIN_HASH = new_key()


@pytest.fixture(scope="module")
def sim():
    with start_sim(time_scale=0, model="m") as s:
        yield s


def _config(url: str):
    pool = {"served_model_name": "m", "endpoints": [url]}
    return load_config(
        health={"enabled": False},
        telemetry={"access_log_format": "json"},
        auth={"keys": [{"id": "a", "hash": A_HASH}, {"id": "b", "hash": B_HASH},
                       {"id": "adm", "hash": ADMIN_HASH, "admin": True}]},
        models={"m": {"default_tier": "standard", "tiers": {"standard": pool}}})


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _not_found(r: httpx.Response) -> None:
    assert r.status_code == 404, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert (err["type"], err["code"], err["param"]) == (
        "invalid_request_error", "session_not_found", "session_id")


async def test_plain_keys_read_their_own_sessions_only(sim):
    app = create_app(_config(sim.url))
    async with app.api.router.lifespan_context(app.api):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            body = {"model": "m", "max_tokens": 4,
                    "messages": [{"role": "user", "content": "hi"}]}
            cc = {"x-claude-code-session-id": "cc-1"}
            for extra in ({}, {}, {"x-claude-code-agent-id": "sub"}):
                r = await c.post("/v1/chat/completions", json=body,
                                 headers=_auth(A) | cc | extra)
                assert r.status_code == 200, r.text
            r = await c.get("/v1/usage", params={"session_id": "cc-1"}, headers=_auth(A))
            assert r.status_code == 200, r.text
            doc = r.json()
            assert doc["requests"] == 3 and doc["own"]["requests"] == 2
            assert [k["session_id"] for k in doc["children"]] == ["cc-1/agent/sub"]
            assert doc["children"][0]["requests"] == 1
            assert "budget" in doc
            # its own key named explicitly: the same
            r = await c.get("/v1/usage", params={"session_id": "cc-1", "key_id": "a"},
                            headers=_auth(A))
            assert r.json()["requests"] == 3
            # another key: as unknown, whether it names the owner or not
            _not_found(await c.get("/v1/usage", params={"session_id": "cc-1"},
                                   headers=_auth(B)))
            _not_found(await c.get("/v1/usage", params={"session_id": "cc-1", "key_id": "a"},
                                   headers=_auth(B)))
            _not_found(await c.get("/v1/usage", params={"session_id": "nope"},
                                   headers=_auth(A)))
            # another key's totals: still an admin's
            r = await c.get("/v1/usage", params={"key_id": "a"}, headers=_auth(B))
            assert r.status_code == 403 and r.json()["error"]["code"] == "admin_required"
            r = await c.get("/v1/usage", params={"session_id": "cc-1", "key_id": "a"},
                            headers=_auth(ADMIN))
            assert r.status_code == 200 and r.json()["requests"] == 3
            _not_found(await c.get("/v1/usage", params={"session_id": "cc-1"},
                                   headers=_auth(ADMIN)))  # the admin's own key has none


async def test_a_session_named_beyond_ascii_is_read_by_its_text(sim):
    """``x-session-id: sess-é€`` (UTF-8 bytes in the header) is read back with
    ``?session_id=sess-é€`` (its text, as every HTTP client percent-encodes it) and answers
    with that id and the session's budget; it was a 404 (the header's bytes are stored as
    latin-1, the query was looked up as text)."""
    app = create_app(_config(sim.url))
    async with app.api.router.lifespan_context(app.api):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            r = await c.post("/v1/chat/completions", headers=[
                ("authorization", f"Bearer {A}"), ("x-session-id", "sess-é€".encode()),
                ("x-speedgate-session-budget-usd", "2")], json={
                "model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200, r.text
            r = await c.get("/v1/usage", params={"session_id": "sess-é€"}, headers=_auth(A))
            assert r.status_code == 200, r.text
            doc = r.json()
            assert doc["session_id"] == "sess-é€" and doc["requests"] == 1
            assert doc["budget"]["budget_usd"] == 2


async def test_refused_requests_keep_what_the_client_asked(sim, caplog):
    app = create_app(_config(sim.url))
    async with app.api.router.lifespan_context(app.api):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            caplog.set_level(logging.INFO, logger="speedgate.access")
            bad = {"model": "m", "stream": True, "max_tokens": -5,
                   "messages": [{"role": "user", "content": "hi"}]}
            r = await c.post("/v1/chat/completions", json=bad,
                             headers=_auth(A) | {"x-speedgate-tier": "fast"})
            assert r.status_code == 400
            r = await c.post("/v1/chat/completions", json=bad | {"max_tokens": 4},
                             headers={"authorization": "Bearer sg-wrong",
                                      "x-speedgate-tier": "fast"})
            assert r.status_code == 401
            r = await c.post("/v1/chat/completions", headers=_auth(A),
                             json={"model": "unknown-model", "stream": True, "messages": [
                                 {"role": "user", "content": "hi"}]})
            assert r.status_code == 404
    lines = [json.loads(m.getMessage()) for m in caplog.records
             if m.name == "speedgate.access"]
    got = [(x["status"], x["model"], x["tier_asked"], x["stream"]) for x in lines]
    assert got == [(400, "m", "fast", True),
                   (401, None, "fast", False),  # refused before its body is read
                   (404, "unknown-model", None, True)]
