"""The auto tier through a real gateway and simulators: at light load ``auto`` goes
fast; once the fast pool is saturated new sessions go standard, while a session whose long
conversation is cached on fast stays there (the re-prefill would cost more than the gain).
Reasons in ``x-speedgate-auto-reason``, the serving tier in ``x-speedgate-tier`` and
``service_tier``.

Saturation is made unambiguous, so that a loaded machine cannot flip a decision: the fast pool
holds ``HELD`` streams in flight (the in-flight count the decision reads as the pool's load),
each emitting one event a second, so they cost next to no CPU and none finishes before the
decisions; then ``PROBES`` fast requests finish at that load with a token every ``SLOW_TPOT_S``
(the simulator's ``chunk_interval_s``: the slowness a saturated pool shows, several times the
CPU noise of a busy machine), so the estimator has measured fast at high load as well as idle.
The test waits on conditions (every held stream streaming, the probes counted as finished),
never a fixed time. Exploration is off (``explore_stale_s`` an hour): a stale pool's random
exploration, which a slow machine could trigger, is tested in
``tests/unit/plan/test_auto_tier.py``."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator

import aiohttp
import httpx
import pytest

from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e


#: Streams held in flight on the one fast replica: at this load the fast pool's predicted time for
#: a short request is ~2× the idle standard pool's (its load slope, ``RELATIVE_SLOPE``), while a
#: session with ~22k tokens cached on fast still finishes sooner there (standard re-prefills).
HELD = 80
#: Fast requests measured at that load, and their seconds per output token (vs ~6 ms idle).
PROBES = 3
SLOW_TPOT_S = 0.03


@pytest.fixture(scope="module")
def auto_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # one replica per tier at real speed (time-scale 1): 12 ms/token standard, ~6 fast idle
    s = Stack(
        tmp_path_factory.mktemp("auto"),
        replicas_per_tier=1,
        sim_args=("--time-scale", "1", "--output-tokens", "32"),
        config_extra={},
        model_overrides={"auto": {"explore_stale_s": 3600}},
    )
    s.start()
    try:
        yield s
    finally:
        s.stop()


def _doc(content: str, stream: bool = False) -> dict:
    return {"model": MODEL, "stream": stream, "max_tokens": 32,
            "messages": [{"role": "system", "content": "You are terse."},
                         {"role": "user", "content": content}]}


async def _post(http: aiohttp.ClientSession, url: str, doc: dict, tier: str,
                session: str | None = None) -> tuple[int, dict[str, str], bytes]:
    headers = {"x-speedgate-tier": tier}
    if session:
        headers["x-session-id"] = session
    async with http.post(url + "/v1/chat/completions", json=doc, headers=headers) as r:
        return r.status, dict(r.headers), await r.read()


async def _finished(http: aiohttp.ClientSession, url: str, tier: str) -> float:
    """Requests the gateway has accounted as finished on ``tier`` (``speedgate_requests_total``;
    the auto estimator learns from each in the same step)."""
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("speedgate_requests_total{") and f'tier="{tier}"' in line)


async def _scenario(url: str) -> dict[str, tuple[str, str, str]]:
    out: dict[str, tuple[str, str, str]] = {}
    long_ctx = "the build log says: test passed, module ok. " * 2000  # ~90k chars ≈ 22k tokens
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120),
                                     connector=aiohttp.TCPConnector(limit=0)) as http:
        # warm both pools' estimates at light load (streams: TTFT and decode measured)
        for i in range(4):
            for tier in ("standard", "fast"):
                st, _, _ = await _post(http, url, _doc(f"warm {tier} {i}", True), tier)
                assert st == 200

        async def auto(name: str, doc: dict, session: str) -> None:
            st, h, body = await _post(http, url, doc, "auto", session)
            assert st == 200, body
            service_tier = json.loads(body)["service_tier"]
            out[name] = (h["x-speedgate-tier"], h.get("x-speedgate-auto-reason", ""),
                         service_tier)

        await auto("idle", _doc("hello"), "new-1")
        await auto("long-1", _doc(long_ctx), "long")  # its 22k-token prefix now cached on fast

        stop = asyncio.Event()
        streaming: list[int] = []
        all_streaming = asyncio.Event()
        # one event a second for 50 s: in flight through the decisions, never stalled (3 s)
        held = {**_doc("busy", True), "sim_faults": {"chunks": ["x"] * 50,
                                                     "chunk_interval_s": 1.0}}

        async def hold(i: int) -> None:  # one stream in flight on the fast pool until stopped
            async with http.post(url + "/v1/chat/completions", json=held,
                                 headers={"x-speedgate-tier": "fast"}) as r:
                assert r.status == 200, await r.read()
                assert (await r.content.readline()).startswith(b"data: ")
                streaming.append(i)
                if len(streaming) == HELD:
                    all_streaming.set()
                await stop.wait()  # leaving the block hangs up: the gateway aborts upstream

        holds = [asyncio.create_task(hold(i)) for i in range(HELD)]
        try:
            waiting = asyncio.ensure_future(all_streaming.wait())
            await asyncio.wait([waiting, *holds], return_when=asyncio.FIRST_COMPLETED)
            assert all_streaming.is_set(), [t.exception() for t in holds if t.done()]
            finished = await _finished(http, url, "fast")
            slow = {**_doc("measured at high load", True),
                    "sim_faults": {"chunks": ["y"] * 32, "chunk_interval_s": SLOW_TPOT_S}}
            probes = await asyncio.gather(*(_post(http, url, slow, "fast")
                                            for _ in range(PROBES)))
            assert all(st == 200 for st, _, _ in probes), probes
            for _ in range(600):  # the gateway accounts a request just after its end
                if await _finished(http, url, "fast") >= finished + PROBES:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the probes were never accounted as finished")
            await auto("saturated", _doc("a new task"), "new-2")
            await auto("long-2", _doc(long_ctx + " next turn"), "long")
        finally:
            stop.set()
            for t in holds:
                with contextlib.suppress(Exception):
                    await t
    return out


def test_auto_goes_fast_when_idle_and_standard_when_fast_is_saturated(auto_stack: Stack):
    out = asyncio.run(_scenario(auto_stack.base_url))
    assert out["idle"] == ("fast", "fast-faster", "priority"), out
    assert out["long-1"][0] == "fast", out
    assert out["saturated"] == ("standard", "fast-saturated", "default"), out
    # the long session keeps its cache: standard, idle, would re-prefill its 22k tokens; with
    # equal caches standard would win (hence the reason), and no hysteresis is needed for it
    assert out["long-2"] == ("fast", "prefix-on-fast", "priority"), out
    text = httpx.get(auto_stack.base_url + "/metrics").text
    assert 'speedgate_auto_decisions_total{model="mymodel",reason="fast-saturated",' \
           'tier="standard"}' in text
    assert "speedgate_auto_estimated_output_tokens_per_second" in text
    assert "speedgate_auto_estimate_ratio_bucket" in text
