"""Fixed: "long session ids grow memory without bound": a long ``x-session-id`` is kept as a
fixed-size digest everywhere (routing session table, active-session ledger, the auto tier's
session table, usage totals, the access log), and the tables are bounded by bytes as well as
entries."""

from __future__ import annotations

import gc
import os
import tracemalloc

import httpx
import pytest

from engines.sim.testing import start_sim
from gateway.app import create_app
from gateway.config import load_config
from gateway.routing.session_ledger import SessionLedger
from gateway.routing.table import AffinityTable

LONG = 30_000  # characters per session id, as in the issue


@pytest.fixture(scope="module")
def sim():
    with start_sim(time_scale=0, model="m") as s:
        yield s


def _config(url: str):
    pool = {"served_model_name": "m", "endpoints": [url]}
    return load_config(health={"enabled": False}, models={"m": {
        "default_tier": "auto", "tiers": {"standard": pool, "fast": pool}}})


@pytest.mark.slow
async def test_long_session_ids_keep_a_fixed_size_digest_everywhere(sim):
    app = create_app(_config(sim.url))
    async with app.api.router.lifespan_context(app.api):
        state = app.api.state.gateway
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            async def turn(sid: str) -> None:
                r = await c.post("/v1/chat/completions", headers={"x-session-id": sid}, json={
                    "model": "m", "max_tokens": 4,
                    "messages": [{"role": "user", "content": "hi"}]})
                assert r.status_code == 200, r.text

            for i in range(5):  # warm-up: lazy state, first connections
                await turn(f"warm-{i}" * 5000)
            gc.collect()
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(200):
                await turn(os.urandom(LONG // 2).hex())
            for p in state.pools.all():
                await p.router.drain()
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
            tracemalloc.stop()
            # the same id finds its usage totals again by its digest
            sid = "z" * LONG
            await turn(sid)
            doc = (await c.get("/v1/usage", params={"session_id": sid})).json()
            assert doc["requests"] == 1
        # raw ids kept 6.0 MiB here (200 × 30 kB, one string shared by the tables); digests
        # keep ~0.3 MiB (a few hundred bytes per table entry)
        assert grown < 2 * 1024 * 1024, f"{grown / 2**20:.1f} MiB kept for 200 requests"
        keys: list[str] = []
        for p in state.pools.all():
            keys += list(p.router.store._sessions[p.key]._d) + list(p.router.ledger._d)
        keys += list(state.auto.sessions["m"]._d)
        keys += list(state.usage._sessions)
        assert len(keys) > 600 and max(len(k) for k in keys) <= 80


def test_tables_are_bounded_by_memory_as_well_as_entries():
    from gateway.routing.table import entry_bytes

    cap = 1024 * 1024
    table = AffinityTable(max_entries=100_000, ttl_s=3600, max_bytes=cap)
    ledger = SessionLedger(idle_s=120, max_entries=100_000, max_bytes=cap)
    for i in range(1000):
        key = f"h:{i}-" + "x" * LONG  # as if a caller kept raw ids: still bounded
        table.put(key, "m/standard/0")
        ledger.touch(key, "m/standard/0", now=1.0)
    for t in (table, ledger):
        assert t.bytes <= cap and 0 < len(t) < 40
    assert table.bytes == sum(entry_bytes(k) for k in table._d)
    assert ledger.counts(now=1.0) == {"m/standard/0": len(ledger)}
    assert table.get(f"h:999-{'x' * LONG}") == "m/standard/0"  # the newest stays
