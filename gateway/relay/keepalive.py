"""Keep-alive of a stream waiting for its first content event (a long prefill).

A 1M-token turn can spend minutes in prefill, and until the first content event the gateway
holds everything back (the status too: a failure is still retried on another replica, the
client none the wiser). A hop with an idle timeout (load balancers, corporate proxies; 60 s is
common) would cut such a silent stream. ``PrefillKeepalive`` commits the stream after
``timeouts.keepalive_after_s`` of silence, status 200 and the SSE headers sent, then writes the
API's keep-alive (``Protocol.keepalive``: an SSE comment, or Messages' ``event: ping``) every
``timeouts.keepalive_interval_s``, and at once for each keep-alive of the engine
(``heartbeat``). Retries and fallbacks before the first content event still happen, invisibly;
after the commit a final failure is one in-band error event (the caller's).

Costless for the streams that need none: one ``call_later`` timer, cancelled when the first
content event comes before it fires; the task that writes is only made when it fires.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


class PrefillKeepalive:
    """Commit-and-keep-alive of one stream request; ``arm()`` when the attempt starts,
    ``await stop()`` when it answered or failed (before anything else is sent): True when the
    stream was committed (the caller then sends no ``http.response.start``).

    ``send``: the ASGI send; ``headers``: the response headers at commit (the SSE headers and
    those known before a replica answers); ``keepalive``: the API's keep-alive event (bytes);
    ``after_s``/``interval_s``: seconds (``Timeouts.keepalive_after_s``, ``..._interval_s``).
    """

    __slots__ = ("_headers", "_keepalive", "_send", "_task", "_timer", "_wake", "after_s",
                 "committed", "interval_s")

    def __init__(self, send: Any, headers: list[tuple[bytes, bytes]], keepalive: bytes,
                 after_s: float, interval_s: float) -> None:
        self._send, self._headers, self._keepalive = send, headers, keepalive
        self.after_s, self.interval_s = after_s, interval_s
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self.committed = False

    def arm(self) -> None:
        """Start the silence timer (``after_s`` from now)."""
        self._timer = asyncio.get_running_loop().call_later(self.after_s, self._commit)

    def heartbeat(self) -> None:
        """The engine sent a keep-alive: relayed now (as the API's) once committed."""
        if self._wake is not None:
            self._wake.set()

    def _commit(self) -> None:
        self._timer = None
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(self._wake))

    async def _run(self, wake: asyncio.Event) -> None:
        """Commit, then one keep-alive now and every ``interval_s`` (or at a heartbeat) until
        ``stop``; never cancelled mid-``send`` (``stop`` sets the event and waits). A client
        gone already ends it: the attempt finds out by itself (``DisconnectWatch``)."""
        try:
            await self._send({"type": "http.response.start", "status": 200,
                              "headers": self._headers})
            self.committed = True
            while wake is self._wake:
                await self._send({"type": "http.response.body", "body": self._keepalive,
                                  "more_body": True})
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), self.interval_s)
                wake.clear()
        except Exception:  # the client is gone: the attempt learns it by itself
            return

    async def stop(self) -> bool:
        """No more keep-alives; True when the stream was committed."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task, wake = self._task, self._wake
        if task is not None and wake is not None:
            self._wake = None
            wake.set()
            await task
            self._task = None
        return self.committed
