"""The body rule of outlier ejection: an engine 500 that a second replica answers alike is the
body's fault (answered, not retried further, counted against nobody); a 500 that another
replica does not share still counts, so a broken replica is still ejected."""

from __future__ import annotations

import orjson
from aiohttp import web

from tests.unit.upstream.engine_double import completion, gateway_on

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
POOL = {"retry": {"max_attempts": 3, "budget_percent": 100, "budget_min_retries": 100},
        "outlier": {"consecutive_failures": 2, "max_ejection_percent": 100}}


def _error(status: int) -> web.Response:
    return web.Response(status=status, content_type="application/json", body=orjson.dumps(
        {"error": {"message": "boom", "type": "InternalServerError", "code": status}}))


async def test_a_body_every_replica_fails_alike_counts_against_none():
    async def script(request: web.Request, i: int) -> web.StreamResponse:
        return _error(500)

    async with gateway_on(script, replicas=3, pool=POOL) as bench:
        for _ in range(6):  # three times what would eject both replicas asked
            r = await bench.client.post("/v1/chat/completions", json=BODY)
            assert r.status_code == 502
        assert len(bench.seen) == 12  # two replicas per request, never the third
        assert bench.failures() == [0, 0, 0]
        assert all(r.outlier.ejections_total == 0 for r in bench.pool.replicas)


async def test_a_replica_that_fails_what_another_serves_is_still_ejected():
    async def script(request: web.Request, i: int) -> web.StreamResponse:
        if i == 0:
            return _error(500)
        return web.json_response(completion())

    async with gateway_on(script, replicas=2, pool=POOL) as bench:
        for n in range(40):  # distinct conversations: routed over both replicas
            body = {**BODY, "messages": [{"role": "user", "content": f"conversation {n}"}]}
            r = await bench.client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200
        assert any(s.replica == 0 for s in bench.seen)
        assert bench.pool.replicas[0].outlier.ejections_total >= 1
        assert bench.pool.replicas[1].outlier.ejections_total == 0


async def test_a_second_failure_of_another_kind_counts_the_first():
    async def script(request: web.Request, i: int) -> web.StreamResponse:
        return _error(500 if i == 0 else 503)

    pool = {**POOL, "retry": {**POOL["retry"], "max_attempts": 2}}
    async with gateway_on(script, replicas=2, pool=pool) as bench:
        r = await bench.client.post("/v1/chat/completions", json=BODY)
        assert r.status_code in (502, 503)
        assert bench.failures() == [1, 1]
