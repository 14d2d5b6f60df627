"""Client connections: ``GuardedHttpToolsProtocol``, uvicorn's httptools protocol (passed to
uvicorn as its ``http`` protocol class) with a fix of how a pipelining client's disconnect
reaches the app.

uvicorn marks only the *last parsed* request of a connection as disconnected when the client
goes away; with pipelined requests the one being served is an earlier one, which then kept
writing to the closed transport (uvloop's ``RuntimeError``, logged as an internal error with
status 200, and the engine kept generating). Here the request being served is marked
disconnected too (the handler's disconnect watch fires: a 499, no traceback, the upstream
request aborted) and the queued ones, which never started, are dropped.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the pipelining-disconnect fix described above."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._running: RequestResponseCycle | None = None  # the request being served

    def connection_lost(self, exc: Exception | None) -> None:
        running = self._running
        if running is not None and running is not self.cycle and not running.response_complete:
            # a pipelined earlier request is being served: uvicorn only tells the last one
            running.disconnected = True
            running.message_event.set()
        self.pipeline.clear()  # queued requests of a closed connection never start
        super().connection_lost(exc)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        self._running = cycle
        super()._start_asgi_task(cycle, app)
