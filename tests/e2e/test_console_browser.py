"""The console in a real browser: headless Chromium loads ``/console`` from
``speedgate demo`` under a little traffic; the rendered DOM shows every replica of both pools
with its health and the tier charts with points, and a replica stopped during the test turns
unhealthy on the page within seconds (screenshot: ``reports/console.png``). The admin-key
prompt is tested in a real browser too, in ``test_console.py`` (its stack has auth on).

Skipped only when no Chromium is installed (``.ci/run`` installs Debian's ``chromium``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import psutil
import pytest
from aiohttp import web

from engines.procs import die_with_parent, stop_processes, wait_port_file
from gateway.console.routes import load_page
from tests.e2e.browser import Chromium

pytestmark = pytest.mark.e2e

REPORTS = Path(__file__).resolve().parents[2] / "reports"
#: The demo probes /health every 2 s and marks a replica down after 2 failed probes; the page
#: polls every 2 s: the stopped replica shows within ~6 s, allowed 20 on a loaded machine.
UNHEALTHY_WITHIN_S = 20.0
ROWS = "[...document.querySelectorAll('tr[data-replica]')]"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """``speedgate demo`` (2 simulated replicas per tier) on a port it binds itself."""
    tmp = tmp_path_factory.mktemp("demo")
    port_file, log_path = tmp / "port", tmp / "demo.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "demo", "--port", "0", "--port-file",
             str(port_file), "--replicas", "2", "--time-scale", "0.2"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=die_with_parent, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        base = f"http://127.0.0.1:{wait_port_file(port_file, proc, timeout_s=90)}"
        deadline = time.monotonic() + 60
        while "Ctrl-C stops everything" not in log_path.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, log_path.read_text()
            time.sleep(0.1)
        banner = log_path.read_text()
        pools = {tier: re.search(rf"{tier} pool[^:]*: (.+)", banner).group(1).split(", ")  # type: ignore[union-attr]
                 for tier in ("standard", "fast")}
        yield {"base": base, "banner": banner, "pools": pools, "proc": proc}
    finally:
        stop_processes([proc], grace_s=15)


def _agent(base: str, s: int, turns: int = 6) -> None:
    """One agent session ``agent-<s>``: ``turns`` streamed turns of a growing conversation,
    over the standard, fast and auto tiers in turn."""
    history: list[dict] = []
    with httpx.Client(base_url=base, timeout=60) as c:
        for turn in range(turns):
            i = turn * 4 + s
            history.append({"role": "user", "content": f"step {i}: " + "tool output " * 60})
            body = {"model": ("mymodel", "mymodel-fast", "mymodel-auto")[i % 3], "stream": True,
                    "max_tokens": 24, "messages": history}
            with c.stream("POST", "/v1/chat/completions", json=body,
                          headers={"x-session-id": f"agent-{s}"}) as r:
                assert r.status_code == 200
                for _ in r.iter_lines():
                    pass
            history.append({"role": "assistant", "content": "done"})


def _traffic(base: str) -> None:
    """A little traffic: 4 agent sessions of 6 streamed turns each, side by side (as agents
    run), spread over the standard, fast and auto tiers."""
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for done in [pool.submit(_agent, base, s) for s in range(4)]:
            done.result()


def _listening_child(demo_pid: int, port: int) -> psutil.Process:
    """The demo's child process listening on ``port`` (a simulator it started)."""
    for child in psutil.Process(demo_pid).children():
        if any(c.laddr.port == port and c.status == psutil.CONN_LISTEN
               for c in child.net_connections(kind="tcp")):
            return child
    raise LookupError(f"no child of {demo_pid} listens on {port}")


def test_demo_prints_the_console_url(demo: dict) -> None:
    assert f"console: {demo['base']}/console" in demo["banner"]
    assert f"API:     {demo['base']}/v1" in demo["banner"]


def _long_run(state: dict) -> dict:
    """``state`` (a real ``/v1/console/state``) as after a long agent run: its sessions with
    UUID ids, a key id, millions of tokens and hundreds of dollars (the widest figures)."""
    for rank in ("most_active", "most_expensive"):
        for i, x in enumerate(state["sessions"][rank]):
            x.update(session_id=f"3f2b8c1e-9a4d-4e7b-b0c5-{i:012d}", key_id="research-agents-prod",
                     turns=1234, prompt_tokens=12_345_678, completion_tokens=234_567,
                     cost_usd=123.4567, usd_per_hour=1234.56, requests_per_min=123.4)
    return state


async def test_session_tables_fit_a_1400_px_window(demo: dict, chromium: Chromium) -> None:
    """The "Most expensive now" table's cost columns were cut off at a 1400-px window (the
    table ran 390 px past it with a long run's figures): every column of both sessions
    tables now ends inside the window, the session and key ids cut with an ellipsis."""
    base = demo["base"]
    await asyncio.to_thread(_agent, base, 0, 2)
    async with httpx.AsyncClient(base_url=base) as client:
        state = _long_run((await client.get("/v1/console/state")).json())
    assert state["sessions"]["most_expensive"]
    app = web.Application()
    app.router.add_get("/console", lambda _: web.Response(text=load_page(),
                                                           content_type="text/html"))
    app.router.add_get("/v1/console/state", lambda _: web.Response(
        body=orjson.dumps(state), content_type="application/json"))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    page = await chromium.new_page()
    try:
        await page.call("Emulation.setDeviceMetricsOverride", width=1400, height=900,
                        deviceScaleFactor=1, mobile=False)
        await page.navigate(f"http://127.0.0.1:{runner.addresses[0][1]}/console")
        await page.wait_for("document.querySelector('table[data-sessions=expensive]') !== null",
                            timeout_s=20)
        edges = await page.js("""(() => {
          const right = (t, n) => Math.max(...[...document.querySelectorAll(
            `table[data-sessions=${t}] tr > :nth-last-child(${n})`)].map(
            c => c.getBoundingClientRect().right));
          return {viewport: document.documentElement.clientWidth,
                  page: document.documentElement.scrollWidth,
                  cost: right("expensive", 2), rate: right("expensive", 1),
                  active: right("active", 1)};
        })()""")
        assert edges["cost"] <= edges["rate"] <= edges["viewport"], edges
        assert edges["active"] <= edges["viewport"] and edges["page"] == edges["viewport"], edges
        await page.screenshot(REPORTS / "console-1400.png", width=1400)
    finally:
        await page.close()
        await runner.cleanup()


async def test_console_shows_replicas_charts_and_a_replica_going_down(
        demo: dict, chromium: Chromium) -> None:
    base = demo["base"]
    await asyncio.to_thread(_traffic, base)
    page = await chromium.new_page()
    try:
        await page.navigate(base + "/console")
        await page.wait_for(f"{ROWS}.length === 4", timeout_s=20)
        rows = await page.js(f"{ROWS}.map(r => [r.dataset.replica, r.dataset.state, "
                             "r.querySelector('td[data-health]').textContent, "
                             "r.querySelector('td').title])")
        assert sorted(r[0] for r in rows) == [f"mymodel/{t}/{i}" for t in ("fast", "standard")
                                              for i in (0, 1)]
        assert all(state == "ok" and health.startswith("healthy") for _, state, health, _ in rows)
        assert {r[3] for r in rows} == {*demo["pools"]["standard"], *demo["pools"]["fast"]}
        for chart in ("ttft", "tps"):
            for tier in ("standard", "fast"):
                n = await page.js(f"document.querySelectorAll('svg[data-chart={chart}] "
                                  f"circle.pt[data-tier={tier}]').length")
                assert n > 0, (chart, tier)
        assert await page.js("document.querySelectorAll('[data-auto=share] > i').length") >= 1
        assert await page.js("document.querySelectorAll('svg[data-chart=auto] circle.pt')"
                             ".length") > 0
        assert not await page.js("document.getElementById('keyprompt').hidden === false")
        # stop one replica of the fast pool: its row turns unhealthy, marked sick
        url = demo["pools"]["fast"][0]
        name = next(r[0] for r in rows if r[3] == url)
        _listening_child(demo["proc"].pid, int(url.rsplit(":", 1)[1])).send_signal(signal.SIGKILL)
        row = f"document.querySelector('tr[data-replica=\"{name}\"]')"
        took = await page.wait_for(f"{row}.dataset.state === 'unhealthy'",
                                   timeout_s=UNHEALTHY_WITHIN_S)
        print(f"replica {name} shown unhealthy {took:.1f} s after it was stopped")
        assert await page.js(f"{row}.classList.contains('sick')")
        assert "UNHEALTHY" in await page.js(f"{row}.querySelector('td[data-health]').textContent")
        others = await page.js(f"{ROWS}.filter(r => r.dataset.state !== 'ok').length")
        assert others == 1
        await page.screenshot(REPORTS / "console.png")
        assert (REPORTS / "console.png").stat().st_size > 10_000
    finally:
        await page.close()
