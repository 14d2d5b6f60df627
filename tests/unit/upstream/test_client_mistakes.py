"""Fixed: "a 4xx-class mistake in the client's body must never count toward a replica's
outlier ejection, whatever the engine answers". The engines here answer every request with a
500 (as the simulator once did for ``"stop": 5``); the client's mistakes must be answered 400
by the gateway without reaching them, so no replica is ejected. The same engines' 500 to a
valid request is answered 502, and (both replicas failing it alike) is the body's fault under
the body rule, counted against neither (``test_body_rule``: a replica failing what another
serves still counts)."""

from __future__ import annotations

import httpx
import pytest

from engines.sim.testing import start_sim
from gateway.app import create_app
from gateway.config import load_config

MISTAKES = [
    {"stop": 5}, {"stop": True}, {"stop": ["ok", 1]}, {"n": 467_752_472}, {"n": 0},
    {"n": "2"}, {"n": 1.5}, {"max_tokens": "many"}, {"max_tokens": 0},
    {"max_completion_tokens": -1}, {"temperature": "hot"}, {"top_p": False}, {"seed": 1.5},
]


@pytest.fixture(scope="module")
def broken_sims():
    with start_sim(time_scale=0, model="m", faults={"status": 500}) as a, \
            start_sim(time_scale=0, model="m", faults={"status": 500}) as b:
        yield [a, b]


def _config(urls: list[str]):
    pool = {"served_model_name": "m", "endpoints": urls, "retry": {"max_attempts": 2},
            "outlier": {"consecutive_failures": 2, "max_ejection_percent": 100}}
    return load_config(health={"enabled": False}, models={"m": {"tiers": {"standard": pool}}})


async def _requests_seen(sims) -> int:
    async with httpx.AsyncClient() as c:
        return sum([len((await c.get(s.url + "/sim/requests")).json()) for s in sims])


async def test_client_mistake_never_counts_toward_outlier_ejection(broken_sims):
    async with httpx.AsyncClient() as c:
        for s in broken_sims:
            (await c.post(s.url + "/sim/reset")).raise_for_status()
    app = create_app(_config([s.url for s in broken_sims]))
    async with app.api.router.lifespan_context(app.api):
        pool = app.api.state.gateway.pools.get("m", "standard")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            for extra in MISTAKES:
                for stream in (False, True):
                    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                            "stream": stream, **extra}
                    r = await c.post("/v1/chat/completions", json=body)
                    assert r.status_code == 400, (extra, r.text)
                    err = r.json()["error"]
                    assert err["type"] == "invalid_request_error"
                    assert err["param"] == next(iter(extra))
            assert await _requests_seen(broken_sims) == 0
            assert all(r.outlier.consecutive_failures == 0 for r in pool.replicas)
            assert all(r.outlier.ejections_total == 0 for r in pool.replicas)
            # the same engines fail a valid request alike: answered, counted against neither
            ok = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stop": "x"}
            assert (await c.post("/v1/chat/completions", json=ok)).status_code == 502
            assert await _requests_seen(broken_sims) == 2
            assert sum(r.outlier.consecutive_failures for r in pool.replicas) == 0
