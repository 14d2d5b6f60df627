"""A real headless browser for end-to-end tests: Chromium driven over the Chrome DevTools
Protocol (CDP) with aiohttp's websocket client, no extra dependency.

``Chromium.launch()`` starts ``chromium --headless --remote-debugging-port=0`` in its own
process group (dying with the test process); Chromium binds a free port itself and writes it to
``DevToolsActivePort`` in its profile directory, which is read back (no port picked before its
bind). One browser serves many tests: ``new_page()`` opens a fresh tab (its own session
storage) driven over its own websocket, closed by ``Page.close()``; the ``chromium`` fixture of
``tests/e2e/conftest.py`` launches one per test session, since a launch costs a second or more
of CPU on a loaded 2-core machine. ``Page`` offers what the tests need: navigate, evaluate
JavaScript in the page, type into an input, a full-page PNG screenshot. ``find_chromium()`` is
None when no browser is installed (the tests then skip; ``.ci/run`` installs Debian's
``chromium``).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

from engines.procs import die_with_parent, stop_processes

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """Path of an installed Chromium (or Chrome), else None."""
    for name in NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class Page:
    """One tab, driven over its CDP websocket (``close()`` closes the tab and the socket)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse,
                 http: aiohttp.ClientSession | None = None, close_url: str | None = None) -> None:
        self.ws = ws
        self._http = http
        self._close_url = close_url
        self._ids = itertools.count(1)
        self._events: list[dict[str, Any]] = []

    async def close(self) -> None:
        """Close the tab (when the browser opened it for this page) and its HTTP session."""
        if self._http is None:
            return
        try:
            await self.ws.close()
            if self._close_url:
                async with self._http.get(self._close_url) as r:
                    await r.read()
        finally:
            await self._http.close()
            self._http = None

    async def call(self, method: str, timeout_s: float = 30.0, **params: Any) -> dict[str, Any]:
        """Send one CDP command and return its ``result`` (events that arrive meanwhile are
        kept). Raises ``RuntimeError`` on a protocol error."""
        msg_id = next(self._ids)
        await self.ws.send_json({"id": msg_id, "method": method, "params": params})
        deadline = time.monotonic() + timeout_s
        while True:
            msg = await self.ws.receive_json(timeout=max(0.1, deadline - time.monotonic()))
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self._events.append(msg)

    async def navigate(self, url: str, timeout_s: float = 30.0) -> None:
        """Load ``url`` and wait for its ``load`` event."""
        await self.call("Page.enable")
        self._events.clear()
        await self.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout_s
        while not any(e.get("method") == "Page.loadEventFired" for e in self._events):
            msg = await self.ws.receive_json(timeout=max(0.1, deadline - time.monotonic()))
            if "method" in msg:
                self._events.append(msg)

    async def js(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited when it is a promise)."""
        res = await self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                              awaitPromise=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"page script failed: {res['exceptionDetails']}")
        return res["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float, interval_s: float = 0.2) -> float:
        """Poll a JavaScript expression until it is truthy; the seconds it took. Raises
        ``TimeoutError`` after ``timeout_s``."""
        t0 = time.monotonic()
        while True:
            if await self.js(expression):
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"not true within {timeout_s} s: {expression}")
            await asyncio.sleep(interval_s)

    async def type_into(self, selector: str, text: str) -> None:
        """Focus the element ``selector`` and type ``text`` as key events would."""
        await self.js(f"document.querySelector({selector!r}).focus()")
        await self.call("Input.insertText", text=text)

    async def screenshot(self, path: Path, width: int = 1440) -> None:
        """A PNG of the whole page (its full height) at ``width`` CSS pixels."""
        height = int(await self.js("document.documentElement.scrollHeight"))
        await self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                        deviceScaleFactor=1, mobile=False)
        shot = await self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        await asyncio.to_thread(_write, path, base64.b64decode(shot["data"]))


class Chromium:
    """A headless Chromium process; tabs are opened with ``new_page()``."""

    def __init__(self, executable: str, profile: Path, width: int = 1440, height: int = 1000):
        self.executable = executable
        self.profile = profile
        self.size = (width, height)
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None

    def launch(self, timeout_s: float = 30.0) -> None:
        """Start the browser (blocking until its DevTools endpoint answers: the port it bound
        is read from ``DevToolsActivePort``). Raises ``RuntimeError`` when it does not start
        within ``timeout_s`` seconds."""
        args = [self.executable, "--headless=new", "--disable-gpu", "--no-first-run",
                "--no-default-browser-check", "--disable-extensions", "--mute-audio",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--remote-debugging-port=0",
                "--remote-debugging-address=127.0.0.1", f"--user-data-dir={self.profile}",
                f"--window-size={self.size[0]},{self.size[1]}", "about:blank"]
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium refuses to run its sandbox as root
        self.profile.mkdir(parents=True, exist_ok=True)
        self.proc = _launch(args, self.profile.parent / "chromium.log")
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("chromium did not start its DevTools endpoint")
            time.sleep(0.05)
        self.port = int(port_file.read_text().split()[0])

    async def new_page(self) -> Page:
        """A new blank tab in the running browser, with its own CDP websocket."""
        if self.port is None:
            raise RuntimeError("launch() the browser first")
        http = aiohttp.ClientSession()
        try:
            # PUT: Chromium ≥ 111 refuses GET on /json/new
            async with http.put(f"http://127.0.0.1:{self.port}/json/new?about:blank") as r:
                target = await r.json(content_type=None)
            ws = await http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0)
        except BaseException:
            await http.close()
            raise
        return Page(ws, http, f"http://127.0.0.1:{self.port}/json/close/{target['id']}")

    def close(self) -> None:
        """Stop the browser's process group (every tab with it)."""
        if self.proc is not None:
            stop_processes([self.proc])
            self.proc = None


def _launch(args: list[str], log_path: Path) -> subprocess.Popen:
    """Start the browser in its own process group, dying with this process."""
    with log_path.open("wb") as log:
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=die_with_parent)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
