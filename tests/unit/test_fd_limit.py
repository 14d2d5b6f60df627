"""``raise_fd_limit``: the soft descriptor limit raised to fit ``server.max_connections``, a
default cap sized from a hard limit too low for it (a default start logs no warning), an
operator's cap kept with a warning."""

from __future__ import annotations

import logging

import pytest

from gateway import server as srvmod
from gateway.config import ServerConfig


class _Limits:
    """``resource.getrlimit``/``setrlimit`` of RLIMIT_NOFILE for one test, without touching the
    test process's real limits."""

    def __init__(self, soft: int, hard: int) -> None:
        self.soft, self.hard = soft, hard

    def getrlimit(self, which: int) -> tuple[int, int]:
        assert which == srvmod.resource.RLIMIT_NOFILE
        return self.soft, self.hard

    def setrlimit(self, which: int, limits: tuple[int, int]) -> None:
        assert which == srvmod.resource.RLIMIT_NOFILE
        soft, hard = limits
        assert hard == self.hard and soft <= hard  # an unprivileged raise, within the hard limit
        self.soft = soft


@pytest.fixture
def limits(monkeypatch: pytest.MonkeyPatch):
    def make(soft: int, hard: int) -> _Limits:
        lim = _Limits(soft, hard)
        monkeypatch.setattr(srvmod.resource, "getrlimit", lim.getrlimit)
        monkeypatch.setattr(srvmod.resource, "setrlimit", lim.setrlimit)
        return lim
    return make


def test_default_cap_under_a_low_hard_limit_is_sized_from_it_without_a_warning(limits, caplog):
    lim = limits(1024, 20000)  # the machine where `make demo` warned at every start
    with caplog.at_level(logging.DEBUG, logger="speedgate.server"):
        out = srvmod.raise_fd_limit(ServerConfig())
    assert lim.soft == 20000  # raised to the hard limit
    assert out.max_connections == (20000 - srvmod.FD_RESERVE) // 2 == 9872
    # nearly the default: a DEBUG line only (it was an INFO line at every start)
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []
    assert any("9872" in r.getMessage() for r in caplog.records)


def test_a_low_cap_is_logged_at_info_with_the_fix(limits, caplog):
    limits(1024, 1024)  # a container runtime's default hard limit
    with caplog.at_level(logging.INFO, logger="speedgate.server"):
        out = srvmod.raise_fd_limit(ServerConfig())
    assert out.max_connections == (1024 - srvmod.FD_RESERVE) // 2 == 384
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO] == [
        "server.max_connections 384 (default 10000) to fit the file descriptor limit 1024; "
        "raise the hard limit (ulimit -Hn, systemd LimitNOFILE) to 20256 for the default"]


def test_cap_that_fits_is_kept_and_the_soft_limit_raised_to_what_it_needs(limits, caplog):
    lim = limits(1024, 1 << 20)
    srv = ServerConfig()
    with caplog.at_level(logging.INFO, logger="speedgate.server"):
        assert srvmod.raise_fd_limit(srv) is srv
    assert lim.soft == 2 * 10_000 + srvmod.FD_RESERVE
    assert caplog.records == []


def test_an_operators_cap_is_kept_with_a_warning_when_the_limit_cannot_fit_it(limits, caplog):
    lim = limits(1024, 4096)
    srv = ServerConfig(max_connections=5000)
    with caplog.at_level(logging.INFO, logger="speedgate.server"):
        assert srvmod.raise_fd_limit(srv) is srv
    assert lim.soft == 4096
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["file descriptor limit 4096 is below the 10256 that "
                        "server.max_connections=5000 needs"]


def test_no_cap_and_a_higher_soft_limit_are_left_alone(limits):
    lim = limits(50_000, 60_000)
    srv = ServerConfig()
    assert srvmod.raise_fd_limit(srv) is srv and lim.soft == 50_000  # never lowered
    lim = limits(1024, 2048)
    srv = ServerConfig(max_connections=0)
    assert srvmod.raise_fd_limit(srv) is srv and lim.soft == 1024
    inf = srvmod.resource.RLIM_INFINITY  # an unlimited soft limit is never set to a number
    lim = limits(inf, inf)
    assert srvmod.raise_fd_limit(ServerConfig()).max_connections == 10_000 and lim.soft == inf
