"""Client connections: the limits uvicorn's httptools protocol lacks, in a subclass of it
(``GuardedHttpToolsProtocol``, passed to uvicorn as its ``http`` protocol class).

uvicorn bounds an idle keep-alive connection (``timeout_keep_alive``: ``server.
keepalive_timeout_s``) and nothing else: a client that connects and sends nothing, sends its
headers or its body a byte a second, or announces ``Content-Length: 100`` and sends no body,
holds its connection (and a file descriptor) forever, and ``limit_concurrency`` is only checked
once headers are complete, so it caps none of these. Here, per connection (Apache
mod_reqtimeout's scheme and defaults):

- **header-read timeout**: from the accept (or the first byte of a later request on a
  keep-alive connection) until the headers are complete, ``server.header_timeout_s``;
- **body-read timeout with a minimum rate**: from the headers until the body is complete,
  ``server.body_timeout_s`` plus one second per ``server.body_min_rate_bytes_per_s`` bytes
  received (a slow but steady upload of a large conversation passes; a trickle does not);
- **cap on open connections**: past ``server.max_connections`` per worker, a new connection is
  answered 503 (``Retry-After: 1``) and closed at once.

An expired client is answered 408 (``request_timeout``, OpenAI's error shape, ``Connection:
close``) when no response has started, else simply disconnected; a request the gateway was
reading is recorded as 408 (``scope["speedgate.client_timeout"]``, read by
``gateway.asgi.read_body``). Each is counted: ``speedgate_client_timeouts_total{stage}``,
``speedgate_connections_refused_total``, and ``speedgate_open_connections``.

The subclass also fixes how a pipelining client's disconnect reaches the app: uvicorn marks only
the *last parsed* request as disconnected, so the request being served (an earlier one of the
pipeline) kept writing to the closed transport (uvloop's ``RuntimeError``, logged as an
internal error with status 200). Here the request being served is marked disconnected too (a
499, no traceback) and the queued ones are dropped.

Over-long URLs: httptools' URL parser (``parse_url``) refuses a URL over 65535 bytes, which
uvicorn answers with a plain-text 400 ("Invalid HTTP request received."), not the API's error.
No route or id of the API is anywhere near that long (a response id has at most 133
characters), so a URL over ``MAX_URL_BYTES`` has each path segment over ``MAX_SEGMENT_BYTES``
cut to that length and its query dropped (the gateway never reads the query) before it is
parsed: the request gets the answer its segment would have got (a 404 in the API's shape, e.g.
``response_not_found``), and the URL kept in memory is bounded too.

The limits and counters (``ConnectionGuard``) reach each connection through the ASGI lifespan
state (``GUARD_KEY``): without one the protocol behaves as uvicorn's, pipelining fix included.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from gateway.asgi import DISCONNECT_KEY, DisconnectSignal
from gateway.config import ServerConfig

#: Key of the ``ConnectionGuard`` in the ASGI lifespan state (uvicorn's ``app_state``).
GUARD_KEY = "speedgate.connection_guard"
#: Scope key set on a request whose body was too slow (``gateway.asgi.read_body`` reads it).
TIMEOUT_SCOPE_KEY = "speedgate.client_timeout"


class ConnectionGuard:
    """The connection limits of one worker process (from ``ServerConfig``) and what they did:
    ``timeouts[stage]`` (``header`` | ``body``), ``refused``, ``open`` connections."""

    def __init__(self, server: ServerConfig) -> None:
        self.header_timeout_s = server.header_timeout_s
        self.body_timeout_s = server.body_timeout_s
        self.body_min_rate = server.body_min_rate_bytes_per_s
        self.max_connections = server.max_connections
        self.timeouts: dict[str, int] = {"header": 0, "body": 0}
        self.refused = 0
        self.open = 0

    def collector(self) -> Collector:
        """Prometheus collector of the counters (register it in the gateway's registry)."""
        return _GuardCollector(self)


class _GuardCollector(Collector):
    def __init__(self, guard: ConnectionGuard) -> None:
        self.guard = guard

    def collect(self) -> Iterator[Metric]:
        g = self.guard
        t = CounterMetricFamily(
            "speedgate_client_timeouts",
            "Client connections closed for sending their request headers or body too slowly "
            "(408 when no response had started)", labels=["stage"],
        )
        for stage, n in sorted(g.timeouts.items()):
            t.add_metric([stage], float(n))
        yield t
        yield CounterMetricFamily(
            "speedgate_connections_refused",
            "Client connections refused (503, closed) over server.max_connections",
            value=float(g.refused),
        )
        yield GaugeMetricFamily(
            "speedgate_open_connections", "Open client connections of this worker",
            value=float(g.open),
        )


def _response(status: int, phrase: bytes, code: str, message: str, extra: bytes = b"") -> bytes:
    body = orjson.dumps({"error": {"message": message, "type": "invalid_request_error"
                                   if status < 500 else "server_error",
                                   "param": None, "code": code}})
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n%s\r\n" % (status, phrase, len(body), extra)) + body


REQUEST_TIMEOUT = {
    stage: _response(408, b"Request Timeout", "request_timeout",
                     f"the request {stage} did not arrive in time")
    for stage in ("headers", "body")
}
TOO_MANY_CONNECTIONS = _response(
    503, b"Service Unavailable", "too_many_connections",
    "the gateway holds its maximum of open connections; retry shortly", b"retry-after: 1\r\n",
)


#: URLs longer than this (bytes) are shortened before parsing (module docstring).
MAX_URL_BYTES = 8192
#: Length (bytes) a path segment of an over-long URL is cut to: longer than any id or route.
MAX_SEGMENT_BYTES = 1024


def shorten_url(url: bytes) -> bytes:
    """``url`` with its query dropped and each path segment cut to ``MAX_SEGMENT_BYTES``, at
    most ``MAX_URL_BYTES`` in all (module docstring)."""
    path = url.split(b"?", 1)[0]
    out = b"/".join(seg[:MAX_SEGMENT_BYTES] for seg in path.split(b"/"))
    return out[:MAX_URL_BYTES]


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the header/body timeouts, the connection cap and the
    pipelining-disconnect fix described in the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard: ConnectionGuard | None = self.app_state.get(GUARD_KEY)
        self._stage: str | None = None  # "header" | "body" while a read deadline runs
        self._stage_start = 0.0
        self._body_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # loop time the pending timer fires at
        self._running: RequestResponseCycle | None = None  # the request being served
        self._counted = False

    # -- connections -----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        g = self.guard
        if g is None:
            return
        g.open += 1
        self._counted = True
        if g.max_connections and len(self.connections) > g.max_connections:
            g.refused += 1
            transport.write(TOO_MANY_CONNECTIONS)
            transport.close()
            return
        self._arm("header")

    def connection_lost(self, exc: Exception | None) -> None:
        self._stage = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._counted and self.guard is not None:
            self.guard.open -= 1
            self._counted = False
        running = self._running
        if running is not None and running is not self.cycle and not running.response_complete:
            # a pipelined earlier request is being served: uvicorn only tells the last one
            running.disconnected = True
            running.message_event.set()
            _signal(running).fire()
        if self.cycle is not None and not self.cycle.response_complete:
            _signal(self.cycle).fire()
        self.pipeline.clear()  # queued requests of a closed connection never start
        super().connection_lost(exc)

    # -- request stages --------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._stage != "header":  # a new request on a keep-alive connection
            self._arm("header")

    def on_url(self, url: bytes) -> None:
        if len(self.url) <= MAX_URL_BYTES:  # past it the rest is cut anyway (bounded memory)
            self.url += url

    def on_headers_complete(self) -> None:
        self._disarm()
        if len(self.url) > MAX_URL_BYTES:
            self.url = shorten_url(self.url)
        super().on_headers_complete()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        self._running = cycle
        # how the request learns its client left, without a watcher task (gateway.asgi)
        cycle.scope[DISCONNECT_KEY] = DisconnectSignal()  # type: ignore[literal-required]
        super()._start_asgi_task(cycle, app)
        if cycle.more_body and not cycle.response_complete:
            self._arm("body")  # the body of the request now served (a queued one's was paused)

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._stage == "body":
            self._disarm()
        super().on_message_complete()

    # -- deadlines -------------------------------------------------------------------------
    # One timer per connection, reused: arming for a deadline later than the pending timer
    # keeps that timer (when it fires, ``_check`` re-arms for the real deadline) and disarming
    # only clears the stage, so a keep-alive connection serving many requests creates about one
    # timer per timeout period rather than two per request (a uvloop timer costs microseconds).
    def _arm(self, stage: str) -> None:
        if self.guard is None:
            return
        self._stage, self._stage_start, self._body_bytes = stage, self.loop.time(), 0
        due = self._due()
        if self._timer is not None:
            if self._timer_at <= due:
                return
            self._timer.cancel()
        self._timer, self._timer_at = self.loop.call_at(due, self._check), due

    def _disarm(self) -> None:
        self._stage = None

    def _due(self) -> float:
        g = self.guard
        assert g is not None
        if self._stage == "header":
            return self._stage_start + g.header_timeout_s
        rate = g.body_min_rate
        extra = self._body_bytes / rate if rate else 0.0
        return self._stage_start + g.body_timeout_s + extra

    def _check(self) -> None:
        self._timer = None
        if self._stage is None or self.transport.is_closing():
            return
        due = self._due()
        if self.loop.time() < due:  # an earlier timer, or the body kept coming
            self._timer, self._timer_at = self.loop.call_at(due, self._check), due
            return
        self._expire(self._stage)

    def _expire(self, stage: str) -> None:
        """The client was too slow at ``stage``. Headers: 408, unless a response to an earlier
        request is still going out (then it is cut). Body: 408 when the request being read has
        no response yet (it is recorded as 408), else just close (its response is complete, or
        going out and cut)."""
        assert self.guard is not None
        self.guard.timeouts[stage] += 1
        self._stage = None
        running = self._running
        if running is None or running.response_complete:
            if stage == "header":
                self.transport.write(REQUEST_TIMEOUT["headers"])
        else:
            if stage == "body" and not running.response_started:
                # a speedgate key in uvicorn's typed scope, read back by the app
                running.scope[TIMEOUT_SCOPE_KEY] = "body"  # type: ignore[literal-required]
                self.transport.write(REQUEST_TIMEOUT["body"])
            running.disconnected = True  # the app's receive() says so; its sends are dropped
            running.message_event.set()
        self.transport.close()


def _signal(cycle: RequestResponseCycle) -> DisconnectSignal:
    """The request's ``DisconnectSignal`` (a fresh, unwatched one if it never started)."""
    signal = cycle.scope.get(DISCONNECT_KEY)
    return signal if isinstance(signal, DisconnectSignal) else DisconnectSignal()
