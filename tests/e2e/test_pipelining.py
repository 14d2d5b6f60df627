"""Fixed: "a pipelining client that closes early is logged as an internal error": it is a
client disconnect (499), against a real gateway process with its default settings."""

from __future__ import annotations

import json
import socket
import time

import pytest

from tests.e2e.helpers import CHAT, metric, wait_for
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e


def test_pipelining_client_closing_early_is_a_499(stack: Stack):
    """Three pipelined streaming requests, then close after reading a little of the first:
    a client disconnect (499), not an internal error with a traceback."""
    stack.reset_sims()
    before_499 = metric(stack, "speedgate_requests_total", status="499")
    before_500 = metric(stack, "speedgate_requests_total", outcome="internal_error")
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                       "stream": True,
                       "sim_faults": {"chunks": ["w"] * 40, "chunk_interval_s": 0.05}}).encode()
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    host, port = stack.base_url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as c:
        c.sendall((head + body) * 3)
        assert c.recv(200).startswith(b"HTTP/1.1 200")
    assert wait_for(lambda: metric(stack, "speedgate_requests_total", status="499")
                    == before_499 + 1, timeout_s=10)
    time.sleep(2.5)  # the stream would have ended by now: nothing else may be recorded
    assert metric(stack, "speedgate_requests_total", outcome="internal_error") == before_500
    assert metric(stack, "speedgate_requests_total", status="499") == before_499 + 1
    log = stack.log()
    assert "Traceback" not in log and "internal error" not in log
    assert stack.sim_stats()["aborted"] >= 1  # the engine stopped generating
