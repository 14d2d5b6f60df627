"""A shutdown past ``server.graceful_shutdown_s`` is documented behaviour, so
it answers the requests still open (503 before headers, one in-band error on a started stream)
and logs it at WARNING: no traceback, nothing at ERROR."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import orjson
import pytest

from tests.e2e.helpers import CHAT, wait_for
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e


def test_item4_shutdown_past_grace_logs_no_traceback_at_error(tmp_path):
    stack = Stack(tmp_path, replicas_per_tier=1, health={"enabled": False},
                  config_extra={"server": {"graceful_shutdown_s": 1}}).start()
    got: dict[str, tuple[int, bytes]] = {}
    try:
        def call(name: str, body: dict) -> None:
            with httpx.Client(base_url=stack.base_url, timeout=30) as c:
                r = c.post(CHAT, json=body)
                got[name] = (r.status_code, r.content)

        msgs = [{"role": "user", "content": "hi"}]
        bodies = {
            "stream": {"model": MODEL, "messages": msgs, "stream": True,
                       "sim_faults": {"chunk_interval_s": 1.0, "output_tokens": 20}},
            "json": {"model": MODEL, "messages": msgs, "sim_faults": {"headers_delay_s": 20}},
        }
        threads = [threading.Thread(target=call, args=item) for item in bodies.items()]
        for t in threads:
            t.start()
        assert wait_for(lambda: len(stack.sim_requests()) == 2, timeout_s=10)
        time.sleep(0.5)  # the stream has started
        assert stack.gateway is not None
        stack.gateway.send_signal(signal.SIGTERM)
        # uvicorn exits by re-raising the signal it caught, once shutdown is done
        assert stack.gateway.wait(15) in (0, -signal.SIGTERM)
        for t in threads:
            t.join(10)
    finally:
        stack.stop()
    log = stack.log()
    assert "Traceback" not in log, log
    assert [ln for ln in log.splitlines() if " ERROR " in ln] == [], log
    assert log.count("cut short by shutdown") == 2, log
    status, body = got["json"]
    assert status == 503 and orjson.loads(body)["error"]["code"] == "shutdown"
    status, body = got["stream"]
    assert status == 200 and b"[DONE]" not in body
    last = orjson.loads(body.rstrip(b"\n").split(b"\n\n")[-1][6:])
    assert last["error"]["code"] == "shutdown"
