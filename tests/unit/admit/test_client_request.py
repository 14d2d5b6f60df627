"""The request value both edges hand to admission (``ClientRequest``), and the handle of what
admission lent (``Lent``): read once from headers, given back once."""

from __future__ import annotations

import json
from types import SimpleNamespace

from gateway.admit.admission import build_admission
from gateway.admit.auth import new_key
from gateway.admit.gate import Gate
from gateway.admit.lent import Lent
from gateway.admit.path import admit_and_plan
from gateway.admit.request import ClientRequest
from gateway.config import GatewayConfig
from gateway.fleet.pools import PoolRegistry
from gateway.plan.auto.service import AutoTier
from gateway.plan.tiers import ModelIndex
from gateway.protocols.openai.chat import ChatProtocol
from gateway.telemetry.record import RequestRecord

KEY, DIGEST = new_key()


def test_from_headers_reads_credentials_hints_and_the_agents_session() -> None:
    """First value of a repeated header, a sane request id or a fresh one, the session by the
    proxy's precedence, values outside latin-1 read as their bytes (never raising)."""
    req = ClientRequest.from_headers("/v1/chat/completions", [
        (b"authorization", b"Bearer a"), (b"authorization", b"Bearer b"),
        (b"x-request-id", "r\u20ac".encode()), (b"x-speedgate-tier", b"fast"),
        (b"session_id", b"codex-1"), (b"x-claude-code-session-id", "cc-\u20ac".encode()),
    ])
    assert req.path == "/v1/chat/completions" and req.authorization == "Bearer a"
    assert req.tier == "fast" and req.request_id != "r\u20ac" and len(req.request_id) == 32
    assert req.session_src == "claude-code"
    assert req.session_id == "cc-\u20ac".encode().decode("latin-1")
    assert req.with_body(b"{}").size == 2 and req.size == 0
    scope = {"type": "http", "path": "/v1/messages", "client": ("10.0.0.1", 5),
             "headers": [(b"x-api-key", b"k")], "speedgate.request_id": "rid"}
    req = ClientRequest.from_scope(scope)
    assert (req.api_key, req.client, req.request_id) == ("k", "10.0.0.1:5", "rid")


async def test_lent_gives_everything_back_once() -> None:
    """After ``admit_and_plan`` the handle holds the key's ``concurrent`` lease, the ticket and
    (picker mode) a replica's in-flight count; ``release`` twice gives each back once."""
    cfg = GatewayConfig(
        models={"m": {"tiers": {"standard": {"served_model_name": "m",
                                             "endpoints": ["http://127.0.0.1:9"]}}}},
        auth={"keys": [{"id": "k", "hash": DIGEST, "limits": {"concurrent": 1}}]},
    )
    pools = PoolRegistry(cfg)
    deps = SimpleNamespace(config=cfg, models=ModelIndex(cfg), pools=pools,
                           admission=build_admission(cfg, pools), auto=AutoTier(cfg, pools))
    gate = Gate(cfg)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = ClientRequest.from_headers("/v1/chat/completions", [
        (b"authorization", f"Bearer {KEY}".encode())]).with_body(body)
    rec = RequestRecord(request_id=request.request_id, path=request.path)
    lent = Lent(gate, deps.admission)
    admitted = await admit_and_plan(deps, gate, ChatProtocol(), request,  # type: ignore[arg-type]
                                    gate.check_key(request, rec), rec, lent)
    assert admitted.lent is lent and lent.reservation is not None and lent.ticket is not None
    assert any(k == b"x-speedgate-priority" for k, _ in lent.headers)
    replica = pools.replicas()[0]
    lent.hold(replica, pools.get("m", "standard"))
    assert replica.inflight == 1 and gate.limiter.inflight("k") == 1  # type: ignore[attr-defined]
    await lent.release(rec)
    await lent.release(rec)
    assert replica.inflight == 0 and gate.limiter.inflight("k") == 0  # type: ignore[attr-defined]
    await gate.close()
