"""A client that leaves mid-stream is an abort for the simulator, as for vLLM: counted, the
engine's sequence freed, and no "Error handling request" traceback in the server's log (seen
in the flow-control benchmark when the gateway cut streams at their deadline: aiohttp's write
to the closing transport raised before the handler's cancellation arrived)."""

from __future__ import annotations

import logging

import aiohttp
import pytest
from aiohttp.client_exceptions import ClientConnectionResetError
from aiohttp.test_utils import TestServer

from engines.sim import sse
from engines.sim.app import STATE, build_app
from engines.sim.config import SimConfig

pytestmark = pytest.mark.e2e


async def test_write_to_a_gone_client_is_a_quiet_abort(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    content = sse.EventWriter.content

    async def gone_after_first(self: sse.EventWriter, payload: bytes,
                               name: bytes | None = None) -> None:
        if self.content_events >= 1:  # what aiohttp raises writing to a closing transport
            raise ClientConnectionResetError("Cannot write to closing transport")
        await content(self, payload, name)

    monkeypatch.setattr(sse.EventWriter, "content", gone_after_first)
    app = build_app(SimConfig(model="m", time_scale=0.0))
    state = app[STATE]
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    async with TestServer(app) as server:
        url = str(server.make_url("/v1/chat/completions"))
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 50, "ignore_eos": True, "stream": True}
        async with aiohttp.ClientSession() as http:
            resp = await http.post(url, json=body)
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.read()  # the stream ends cut, never with a second answer
        assert state.counts.aborted == 1
        assert not state.engine.running
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
