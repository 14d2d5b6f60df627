"""The app's lifespan pairs each start with its stop: a start that fails stops everything that
had already started (the upstream session, health probes, telemetry, the stores), and a clean
shutdown stops them all."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from gateway.app import create_app
from gateway.config import load_config


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _app() -> Any:
    url = f"http://127.0.0.1:{_closed_port()}"
    return create_app(load_config(models={"m": {"tiers": {
        t: {"served_model_name": "m", "endpoints": [url],
            "routing": {"load_scrape_interval_s": 0}} for t in ("standard", "fast")}}}))


def _record_stops(monkeypatch: pytest.MonkeyPatch, state: Any, stopped: list[str]) -> None:
    """Wrap the stops of what the lifespan starts so each call is recorded in ``stopped``."""
    for name, obj, method in (("upstream", state.upstream, "close"),
                              ("health", state.health, "stop"),
                              ("telemetry", state.telemetry, "shutdown"),
                              ("usage", state.usage, "close"),
                              ("admission", state.admission, "close")):
        original = getattr(obj, method)

        async def stop(*, _name: str = name, _original: Any = original) -> None:
            stopped.append(_name)
            await _original()

        monkeypatch.setattr(obj, method, stop)


async def test_a_start_that_fails_stops_what_already_started(
        monkeypatch: pytest.MonkeyPatch) -> None:
    app = _app()
    state = app.api.state.gateway
    stopped: list[str] = []
    _record_stops(monkeypatch, state, stopped)

    def fail() -> None:
        raise RuntimeError("auto tier failed to start")

    monkeypatch.setattr(state.auto, "start", fail)  # after the upstream, health and telemetry
    with pytest.raises(RuntimeError, match="auto tier failed"):
        async with app.api.router.lifespan_context(app.api):
            pytest.fail("the lifespan must not serve after a failed start")
    assert sorted(stopped) == ["admission", "health", "telemetry", "upstream", "usage"]
    # reverse order of start: health (started last of these) first, the stores last
    assert stopped.index("health") < stopped.index("telemetry") < stopped.index("upstream")
    assert stopped.index("upstream") < stopped.index("usage") < stopped.index("admission")
    assert state.upstream._session is None or state.upstream._session.closed


async def test_a_clean_shutdown_stops_everything_once(monkeypatch: pytest.MonkeyPatch) -> None:
    app = _app()
    state = app.api.state.gateway
    stopped: list[str] = []
    _record_stops(monkeypatch, state, stopped)
    async with app.api.router.lifespan_context(app.api) as lifespan_state:
        assert lifespan_state  # the connection guard, handed to the protocols
        assert stopped == []
    assert sorted(stopped) == ["admission", "health", "telemetry", "upstream", "usage"]
