"""Small helpers shared by the end-to-end tests."""

from __future__ import annotations

import time

import httpx

from tests.e2e.stack import Stack

CHAT = "/v1/chat/completions"


def stream_events(client: httpx.Client, body: dict, headers: dict | None = None):
    """POST a streaming request; yield (arrival time, data bytes) per SSE event."""
    t0 = time.monotonic()
    with client.stream("POST", CHAT, json=body, headers=headers or {}) as r:
        assert r.status_code == 200, r.read()
        buf = b""
        for chunk in r.iter_raw():
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                if ev.startswith(b"data: "):
                    yield time.monotonic() - t0, ev[6:], r
        assert buf == b"", f"stream ended inside an event: {buf!r}"


def metric(stack: Stack, name: str, **labels: str) -> float:
    """Sum of the gateway's Prometheus samples of ``name`` matching ``labels``."""
    text = httpx.get(stack.base_url + "/metrics").text
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_for(predicate, timeout_s: float = 5.0, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()
