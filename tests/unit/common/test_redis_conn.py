"""One Redis connection and one circuit breaker per gateway, shared by the routing store, the
rate limiter and the usage store ("three breakers, one reported")."""

from __future__ import annotations

import socket

import httpx

from gateway.admit.auth import new_key
from gateway.app import create_app
from gateway.config import load_config

KEY, DIGEST = new_key()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when we return: connection refused


def _config():
    engine = f"http://127.0.0.1:{_closed_port()}"
    return load_config(
        health={"enabled": False},
        state={"redis_url": f"redis://127.0.0.1:{_closed_port()}/0", "redis_timeout_s": 0.2,
               "breaker_failures": 2, "breaker_cooldown_s": 60},
        rate_limits={"fail_mode": "closed"},
        auth={"keys": [{"id": "k1", "hash": DIGEST, "limits": {"requests_per_min": 100}}]},
        models={"m": {"tiers": {"standard": {"served_model_name": "m", "endpoints": [engine]}}}},
    )


async def test_three_redis_users_share_one_breaker_and_readyz_reports_it():
    """Redis refuses every connection. Only the rate limiter calls it (the request is refused
    at admission, before routing): its failures open the one breaker, so ``/readyz`` says
    degraded and ``speedgate_state_store_degraded`` is 1 while limited keys get 503; the
    routing store and the usage store skip Redis from then on without a call of their own."""
    app = create_app(_config())
    async with app.api.router.lifespan_context(app.api):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            auth = {"authorization": f"Bearer {KEY}"}
            for _ in range(2):
                r = await c.post("/v1/chat/completions", json=body, headers=auth)
                assert r.status_code == 503
                assert r.json()["error"]["code"] == "rate_limiter_unavailable"
            ready = (await c.get("/readyz")).json()
            assert ready["status"] == "degraded" and ready["degraded"] is True
            metrics = (await c.get("/metrics")).text
            assert "speedgate_state_store_degraded 1.0" in metrics
            assert "speedgate_state_store_circuit_opened_total 1.0" in metrics
        state = app.api.state.gateway
        routers = [p.router for p in state.pools.all()]
        breaker = app.hot["/v1/chat/completions"].gate.limiter.breaker
        assert all(r.store.breaker is breaker for r in routers)
        assert state.usage.breaker is breaker
        assert (breaker.failures_to_open, breaker.cooldown_s) == (2, 60)  # from state.*
        # the routing store now skips Redis at once: no lookup is attempted
        skipped = breaker.skipped
        assert await routers[0].store.lookup("m/standard", "s", [], []) is None
        assert breaker.skipped == skipped + 1
