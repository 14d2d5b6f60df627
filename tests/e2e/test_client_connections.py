"""Fixed: "slow and idle clients hold the gateway forever": header and body read timeouts
and the connection cap, against a real gateway process (raw sockets).

The gateway here gives a client 1 s for its headers and 1 s plus one second per 200 bytes for
its body, and holds at most 12 connections. Every wait below is a bound far above those limits
(a socket read timeout of 10 s): before the limits existed the reads hit that bound instead.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.helpers import CHAT, metric, wait_for
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e

SERVER = {"port": 0, "header_timeout_s": 1.0, "body_timeout_s": 1.0,
          "body_min_rate_bytes_per_s": 200, "max_connections": 12}
BOUND_S = 10.0  # how long a test waits for the gateway to act; the limits are ~1 s


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("conns"), replicas_per_tier=1,
              config_extra={"server": SERVER}).start()
    try:
        yield s
    finally:
        s.stop()


def _connect(stack: Stack) -> socket.socket:
    host, port = stack.base_url.removeprefix("http://").rsplit(":", 1)
    c = socket.create_connection((host, int(port)), timeout=BOUND_S)
    c.settimeout(BOUND_S)
    return c


def _read_until_closed(c: socket.socket) -> bytes:
    """Everything the gateway sends until it closes the connection (raises ``TimeoutError``
    after ``BOUND_S`` of silence: the connection was held)."""
    out = b""
    while True:
        try:
            chunk = c.recv(65536)
        except ConnectionResetError:
            return out
        if not chunk:
            return out
        out += chunk


def _body(extra: dict | None = None) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                       **(extra or {})}).encode()


def _head(length: int) -> bytes:
    return (f"POST {CHAT} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def _status(raw: bytes) -> int:
    assert raw.startswith(b"HTTP/1.1 "), raw[:100]
    return int(raw.split(b" ", 2)[1])


def _refused(stack: Stack) -> float:
    """``speedgate_connections_refused_total`` (a counter without labels)."""
    for line in httpx.get(stack.base_url + "/metrics").text.splitlines():
        if line.startswith("speedgate_connections_refused_total "):
            return float(line.split()[1])
    raise AssertionError("speedgate_connections_refused_total not exported")


def _timeouts(stack: Stack, stage: str) -> float:
    return metric(stack, "speedgate_client_timeouts_total", stage=stage)


def test_idle_client_is_answered_408_and_closed(stack: Stack):
    """Connects and sends nothing at all."""
    before = _timeouts(stack, "header")
    t0 = time.monotonic()
    with _connect(stack) as c:
        raw = _read_until_closed(c)
    assert _status(raw) == 408 and b'"code":"request_timeout"' in raw
    assert b"connection: close" in raw.lower()
    assert time.monotonic() - t0 < 5
    assert wait_for(lambda: _timeouts(stack, "header") == before + 1)


def test_slow_headers_are_answered_408(stack: Stack):
    """Sends its headers a byte every 0.1 s: never complete within the header timeout."""
    before = _timeouts(stack, "header")
    head = _head(10) + b"x-filler: " + b"a" * 200
    with _connect(stack) as c:
        t0 = time.monotonic()
        sent = 0
        try:
            while time.monotonic() - t0 < BOUND_S:
                c.send(head[sent : sent + 1])
                sent += 1
                time.sleep(0.1)
        except OSError:  # the gateway closed the connection
            pass
        raw = _read_until_closed(c)
    assert time.monotonic() - t0 < 5 and sent < len(head)
    assert raw == b"" or _status(raw) == 408
    assert wait_for(lambda: _timeouts(stack, "header") == before + 1)


def test_content_length_without_body_is_answered_408_and_counted(stack: Stack):
    """Announces ``Content-Length: 100`` and sends no body: 408, recorded as a request."""
    before = _timeouts(stack, "body")
    before_408 = metric(stack, "speedgate_requests_total", status="408")
    t0 = time.monotonic()
    with _connect(stack) as c:
        c.sendall(_head(100))
        raw = _read_until_closed(c)
    assert _status(raw) == 408 and b"body" in raw
    assert time.monotonic() - t0 < 5
    assert wait_for(lambda: _timeouts(stack, "body") == before + 1)
    assert wait_for(lambda: metric(
        stack, "speedgate_requests_total", status="408", outcome="request_timeout"
    ) == before_408 + 1)


def test_body_below_the_minimum_rate_is_answered_408(stack: Stack):
    """A byte of body every 0.1 s (10 B/s, under the 200 B/s minimum)."""
    body = _body()
    before = _timeouts(stack, "body")
    with _connect(stack) as c:
        c.sendall(_head(len(body)))
        t0 = time.monotonic()
        sent = 0
        try:
            while sent < len(body) and time.monotonic() - t0 < BOUND_S:
                c.send(body[sent : sent + 1])
                sent += 1
                time.sleep(0.1)
        except OSError:
            pass
        raw = _read_until_closed(c)
    assert sent < len(body) and time.monotonic() - t0 < 5
    assert _status(raw) == 408
    assert wait_for(lambda: _timeouts(stack, "body") == before + 1)


def test_a_steady_body_above_the_minimum_rate_is_served(stack: Stack):
    """3 s of upload at ~2 KB/s: longer than the body timeout, but its rate keeps extending it."""
    body = _body({"metadata_padding": "p" * 6000, "max_tokens": 2})
    with _connect(stack) as c:
        c.sendall(_head(len(body)))
        for i in range(0, len(body), 200):
            c.sendall(body[i : i + 200])
            time.sleep(0.1)
        raw = c.recv(65536)
    assert _status(raw) == 200


def test_connections_over_the_cap_are_refused(stack: Stack):
    """15 connections at once, 12 allowed: the 3 over the cap get 503 and are closed at once
    (the others are held until their header timeout)."""
    cap = SERVER["max_connections"]
    before = _refused(stack)
    held = [_connect(stack) for _ in range(cap + 3)]
    try:
        time.sleep(0.3)  # well under the 1 s header timeout
        answered = {}
        for i, c in enumerate(held):
            c.setblocking(False)
            try:
                answered[i] = c.recv(65536)
            except BlockingIOError:
                pass
        assert sorted(answered) == [cap, cap + 1, cap + 2]
        for raw in answered.values():
            assert _status(raw) == 503 and b"too_many_connections" in raw
            assert b"retry-after: 1" in raw.lower()
    finally:
        for c in held:
            c.close()
    assert wait_for(lambda: _refused(stack) == before + 3)
    # once they are gone, new clients are served again
    assert wait_for(lambda: httpx.get(stack.base_url + "/healthz").status_code == 200)
