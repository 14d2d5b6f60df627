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
import psutil
import pytest

from engines.procs import die_with_parent, stop_processes, wait_port_file
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
