"""The console's routes in-process: the page (offline, one file, CSP by hash), the ``/``
redirect, and access to the JSON with auth on (admin key only, never echoed)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import re
import socket

import httpx
import pytest

from gateway.admit.auth import new_key
from gateway.app import create_app
from gateway.config import load_config
from gateway.console.routes import content_security_policy, load_page

ADMIN, ADMIN_DIGEST = new_key()
PLAIN, PLAIN_DIGEST = new_key()
SVG_NS = "http://www.w3.org/2000/svg"  # a namespace name in createElementNS, never fetched


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(auth: bool = True, **extra):
    url = f"http://127.0.0.1:{_closed_port()}"
    keys = [{"id": "ops", "hash": ADMIN_DIGEST, "admin": True},
            {"id": "app", "hash": PLAIN_DIGEST}]
    return load_config(
        health={"enabled": False},
        auth={"keys": keys} if auth else {},
        models={"m": {"tiers": {t: {"served_model_name": "m", "endpoints": [url],
                                    "routing": {"load_scrape_interval_s": 0}}
                                for t in ("standard", "fast")}}},
        **extra,
    )


@contextlib.asynccontextmanager
async def client(**kw):
    app = create_app(_config(**kw))
    async with app.api.router.lifespan_context(app.api):
        transport = httpx.ASGITransport(app=app, client=("198.51.100.7", 4242))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            yield c


def test_the_page_references_no_external_url() -> None:
    page = load_page()
    urls = set(re.findall(r"""(?:https?:)?//[A-Za-z0-9.\-]+[^\s"'`)<>]*""", page)) - {SVG_NS}
    assert urls == set()
    assert not re.search(r"<(link|img|iframe|object|embed|audio|video|source)\b", page, re.I)
    assert not re.search(r"\bsrc\s*=", page, re.I)  # every script inline
    assert "@import" not in page and "url(" not in page
    assert "innerHTML" not in page and "insertAdjacentHTML" not in page  # ids are text only
    assert 'fetch(STATE_URL' in page and 'const STATE_URL = "v1/console/state"' in page
    assert "sessionStorage" in page and "localStorage" not in page  # the tab only


def test_csp_allows_exactly_the_inline_blocks() -> None:
    page = load_page()
    csp = content_security_policy(page)
    for tag in ("script", "style"):
        (body,) = re.findall(rf"<{tag}>(.*?)</{tag}>", page, re.S)
        digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        assert f"{tag}-src 'sha256-{digest}'" in csp
    assert csp.startswith("default-src 'none';") and "connect-src 'self'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp


async def test_page_and_redirect() -> None:
    async with client(auth=True) as c:
        r = await c.get("/console")  # the page holds no data: no key needed
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert r.text == load_page()
        assert r.headers["content-security-policy"] == content_security_policy(load_page())
        assert r.headers["cache-control"] == "no-store"
        assert r.headers["x-frame-options"] == "DENY"
        r = await c.get("/", headers={"accept": "text/html,application/xhtml+xml,*/*;q=0.8"})
        assert r.status_code == 307 and r.headers["location"] == "/console"
        r = await c.get("/")  # curl's */*: no API asked for either
        assert r.status_code == 307
        r = await c.get("/", headers={"accept": "application/json"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        assert "/v1" in r.json()["error"]["message"]


async def test_state_needs_an_admin_key_and_never_echoes_one(caplog) -> None:
    caplog.set_level("INFO", logger="speedgate.audit")
    async with client(auth=True) as c:
        r = await c.get("/v1/console/state")
        assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
        r = await c.get("/v1/console/state", headers={"authorization": "Bearer sg-wrong"})
        assert r.status_code == 401 and "sg-wrong" not in r.text
        r = await c.get("/v1/console/state", headers={"authorization": f"Bearer {PLAIN}"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "admin_required"
        assert PLAIN not in r.text
        r = await c.get("/v1/console/state", headers={"authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
        doc = r.json()
        assert doc["object"] == "console.state" and doc["gateway"]["auth_enabled"] is True
        for secret in (ADMIN, PLAIN, ADMIN_DIGEST, PLAIN_DIGEST, ADMIN_DIGEST[7:]):
            assert secret not in r.text
        # a second read within the window is not audited again
        await c.get("/v1/console/state", headers={"authorization": f"Bearer {ADMIN}"})
    audit = [rec.getMessage() for rec in caplog.records if rec.name == "speedgate.audit"]
    assert sum('"console_read"' in line for line in audit) == 1
    assert any('"admin_required"' in line for line in audit)
    assert not any(ADMIN in line or PLAIN in line for line in audit)


async def test_window_parameter_is_checked() -> None:
    async with client(auth=False) as c:
        r = await c.get("/v1/console/state?window_s=60")
        assert r.status_code == 200 and r.json()["window_s"] == 60.0
        for bad in ("0", "-5", "abc", "inf", "nan"):
            r = await c.get(f"/v1/console/state?window_s={bad}")
            assert r.status_code == 400, bad
            assert r.json()["error"]["param"] == "window_s"


@pytest.mark.parametrize("path", ["/console", "/v1/console/state", "/"])
async def test_disabled_console_has_no_routes(path: str) -> None:
    async with client(auth=False, console={"enabled": False}) as c:
        assert (await c.get(path)).status_code == 404
