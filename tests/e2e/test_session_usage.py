"""Per-session usage totals (``GET /v1/usage?session_id=``) are scoped by API key, as session
budgets are: two keys sending one session id have two totals."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from gateway.admit.auth import new_key
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e


def _key(key_id: str, **entry: object) -> tuple[str, dict]:
    key, digest = new_key()
    return key, {"id": key_id, "hash": digest, **entry}


KEYS = {"a": _key("a"), "b": _key("b"), "admin": _key("adm", admin=True)}


@pytest.fixture(scope="module")
def keyed_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("session-usage"), replicas_per_tier=1,
              tiers=("standard",),
              config_extra={"auth": {"keys": [e for _, e in KEYS.values()]}})
    try:
        yield s.start()
    finally:
        s.stop()


def _get(stack: Stack, **params: str) -> httpx.Response:
    return httpx.get(stack.base_url + "/v1/usage", timeout=10, params=params,
                     headers={"authorization": f"Bearer {KEYS['admin'][0]}"})


def _usage(stack: Stack, **params: str) -> dict:
    u = _get(stack, **params)
    assert u.status_code == 200, u.text
    return u.json()


def test_session_usage_totals_are_scoped_by_api_key(keyed_stack: Stack) -> None:
    """Keys a and b send the same session id (an agent's own id): `/v1/usage?session_id=S&
    key_id=a` counts only key a's request, key b's session its two (sessions.md: "The first of
    these a request carries is its session (within its API key)"); an admin without `key_id`
    reads its own key's session of that id: none here, a 404."""
    for name in ("a", "b", "b"):
        r = httpx.post(keyed_stack.base_url + "/v1/chat/completions", timeout=30,
                       headers={"authorization": f"Bearer {KEYS[name][0]}",
                                "x-claude-code-session-id": "shared-session"},
                       json={"model": MODEL, "max_tokens": 3,
                             "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200
    assert _usage(keyed_stack, session_id="shared-session", key_id="a")["requests"] == 1
    assert _usage(keyed_stack, session_id="shared-session", key_id="b")["requests"] == 2
    r = _get(keyed_stack, session_id="shared-session")
    assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
