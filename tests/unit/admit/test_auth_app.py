"""The app in-process with auth on: key-leak, body-shapes (auth parts), input limits, and a
bounded hypothesis fuzz run (no 5xx from the gateway itself, every error OpenAI-shaped)."""

from __future__ import annotations

import contextlib
import logging
import socket

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.admit.auth import new_key
from gateway.app import create_app
from gateway.config import load_config

KEY, DIGEST = new_key()
STD_KEY, STD_DIGEST = new_key()
SECRET = "hunter2-engine-pw"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when we return: connection refused


def _config(**extra):
    url = f"http://admin:{SECRET}@127.0.0.1:{_closed_port()}"
    return load_config(
        health={"enabled": False},
        server={"max_body_bytes": 64 * 1024, "max_header_bytes": 8192},
        auth={"keys": [{"id": "k1", "hash": DIGEST},
                       {"id": "k2", "hash": STD_DIGEST, "tiers": ["standard"]}]},
        models={"m": {"aliases": {"m-fast": "fast"}, "fallback": {"fast": "standard"},
                      "tiers": {t: {"served_model_name": "m", "endpoints": [url],
                                    "retry": {"max_attempts": 1},
                                    "timeouts": {"connect_s": 1}}
                                for t in ("standard", "fast")}}},
        **extra,
    )


@contextlib.asynccontextmanager
async def client(**extra):
    app = create_app(_config(**extra))
    async with app.api.router.lifespan_context(app.api):
        transport = httpx.ASGITransport(app=app, client=("198.51.100.7", 4242))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            yield c


def _shaped(r: httpx.Response) -> dict:
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and isinstance(err["type"], str)
    assert "x-request-id" in r.headers
    return err


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def test_key_leak_no_key_or_engine_credential_in_logs_or_errors(caplog):
    caplog.set_level(logging.DEBUG)
    bodies = []
    async with client() as c:
        for headers in ({"authorization": f"Bearer {KEY}x"},  # a near miss
                        {"authorization": f"Bearer {KEY}"},  # good key, engine refuses
                        {"authorization": f"Basic {KEY}"}):
            r = await c.post("/v1/chat/completions", json=CHAT, headers=headers)
            bodies.append(r.text)
            _shaped(r)
        r = await c.post("/v1/chat/completions", json={**CHAT, "stream": True},
                         headers={"authorization": f"Bearer {KEY}"})
        bodies.append(r.text)
    assert [b for b in bodies if KEY in b or SECRET in b] == []
    text = caplog.text + "".join(str(r.__dict__) for r in caplog.records)
    assert KEY not in text and SECRET not in text and DIGEST not in text
    assert "auth_failed" in text and "key_fingerprint" in text  # a fingerprint, never the key


@pytest.mark.parametrize(
    "content,headers,status,code",
    [
        (b'{"model": "m"', {"content-type": "application/json"}, 401, "missing_api_key"),
        (b"x", {"content-type": "text/plain", "authorization": f"Bearer {KEY}"}, 415,
         "unsupported_media_type"),
        (b"{", {"content-type": "application/json", "authorization": f"Bearer {KEY}"}, 400,
         "invalid_json"),
        (b"[" * 100 + b"]" * 100, {"content-type": "application/json",
                                   "authorization": f"Bearer {KEY}"}, 400, "invalid_json"),
        (b'{"model":"m","messages":[{"role":"user","content":' + b"[" * 80 + b"]" * 80
         + b"}]}", {"content-type": "application/json", "authorization": f"Bearer {KEY}"},
         400, "invalid_json"),
        (b"x" * 70_000, {"content-type": "application/json", "authorization": f"Bearer {KEY}"},
         413, "request_too_large"),
        (b"{}", {"content-type": "application/json", "x-big": "v" * 9000}, 431,
         "request_header_fields_too_large"),
    ],
)
async def test_body_shapes_gateway_errors_with_auth(content, headers, status, code):
    async with client() as c:
        r = await c.post("/v1/chat/completions", content=content, headers=headers)
        assert r.status_code == status, r.text
        assert _shaped(r)["code"] == code


async def test_explicit_fast_refused_auto_allowed_in_process():
    async with client() as c:
        h = {"authorization": f"Bearer {STD_KEY}"}
        r = await c.post("/v1/chat/completions", json={**CHAT, "model": "m-fast"}, headers=h)
        assert r.status_code == 403 and _shaped(r)["code"] == "tier_not_allowed"
        r = await c.post("/v1/chat/completions", json=CHAT, headers={**h, "x-speedgate-tier":
                                                                     "auto"})
        assert r.status_code == 502  # entitled; the engine port is closed


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                               max_size=4),
    max_leaves=20,
)
_field = st.sampled_from(["model", "messages", "prompt", "stream", "stream_options",
                          "service_tier", "max_tokens", "tools", "n"])
_bodies = st.one_of(
    st.dictionaries(_field, _json, max_size=6),
    st.fixed_dictionaries({"model": st.sampled_from(["m", "m-fast", "nope", ""]),
                           "messages": st.lists(st.dictionaries(
                               st.sampled_from(["role", "content", "tool_calls", "name"]), _json,
                               max_size=4), max_size=3),
                           "service_tier": _json, "stream": _json, "max_tokens": _json}),
    _json,
)
_headers = st.fixed_dictionaries({}, optional={
    "authorization": st.sampled_from([f"Bearer {KEY}", f"Bearer {STD_KEY}", "Bearer ", "bearer x",
                                      f"Bearer {KEY} extra", "Basic abc", "Bearer " + "a" * 300]),
    "x-speedgate-tier": st.sampled_from(["fast", "auto", "standard", "FAST", "bogus", ""]),
    "content-type": st.sampled_from(["application/json", "text/plain", "application/json; x=1"]),
    "x-speedgate-timeout": st.sampled_from(["0", "-1", "abc", "1e9", "0.5"]),
})


@pytest.mark.slow
@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=_bodies, headers=_headers, path=st.sampled_from(
    ["/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/usage"]))
async def test_fuzz_no_gateway_5xx_and_every_error_openai_shaped(body, headers, path):
    async with client() as c:
        if path in ("/v1/models", "/v1/usage"):
            r = await c.get(path, params={"key_id": str(body)[:20]}, headers=headers)
        else:
            r = await c.post(path, json=body, headers=headers)
    # 502/503/504 are the (closed) engine's, not the gateway's own failure
    assert r.status_code not in (500, 501), r.text
    if r.status_code >= 400 and not r.headers.get("content-type", "").startswith("text/event"):
        _shaped(r)
