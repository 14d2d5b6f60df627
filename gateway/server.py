"""Serving the app: bind the listening socket (port 0 allowed, reported back), print the startup
summary, run uvicorn (uvloop + httptools) with one or more workers until SIGINT/SIGTERM.
Used by ``speedgate serve`` and ``speedgate demo``."""

from __future__ import annotations

import logging
import os
import resource
import socket
import sys
from collections.abc import Callable
from typing import Any

from gateway import __version__
from gateway.config import GatewayConfig, ServerConfig


class _GraceExpiredIsAWarning(logging.Filter):
    """uvicorn logs the end of the graceful shutdown period (``server.graceful_shutdown_s``)
    at ERROR: it is documented behaviour (the requests still open end with an error), so it
    is logged as a WARNING."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR and "timeout graceful shutdown exceeded" in str(
            record.msg
        ):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    uvicorn_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _GraceExpiredIsAWarning) for f in uvicorn_log.filters):
        uvicorn_log.addFilter(_GraceExpiredIsAWarning())


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: a port the kernel picks; read it back
    with ``getsockname()``), IPv6 when ``host`` has a colon. Clients connecting before the app
    is up wait in the backlog (2048) rather than being refused. Raises ``OSError`` when the
    address is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(2048)  # connections queue from now on, before the app has started
    sock.set_inheritable(True)
    return sock


#: File descriptors kept for everything but client connections and their engine connections
#: (listening socket, log files, Redis, health probes, the tokenizer's files).
FD_RESERVE = 256
#: A default connection cap sized below this share of itself by the file descriptor limit is
#: worth a line at start (INFO); above it, only at DEBUG.
LOW_CAP_SHARE = 0.5


def raise_fd_limit(server: ServerConfig) -> ServerConfig:
    """Raise the soft ``RLIMIT_NOFILE`` so ``server.max_connections`` clients fit, each with an
    engine connection: to ``2 × max_connections + FD_RESERVE`` descriptors, or the hard limit
    when that is lower. Returns the server config to serve with.

    Where the hard limit cannot fit the cap: a cap left at its default is sized from the limit,
    ``(limit − FD_RESERVE) // 2`` connections, and the config returned carries it, logged at
    INFO with the fix only when that is a low cap (under ``LOW_CAP_SHARE`` of the default: a
    hard limit of 1024 leaves 384), at DEBUG otherwise (20,000 leaves 9,872: nothing to act
    on, and it was a line at every start); a cap the operator set is kept and a WARNING says
    the limit is too low (connections then fail at accept before the cap). A raise of the soft
    limit is logged at DEBUG. ``max_connections: 0`` (no
    cap) changes nothing. Raises ``OSError`` only if the kernel refuses a raise within the hard
    limit, which ``setrlimit(2)`` does not do for an unprivileged process.
    """
    if server.max_connections <= 0:
        return server
    want = 2 * server.max_connections + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return server
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    log = logging.getLogger("speedgate.server")
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        log.debug("file descriptor soft limit raised from %d to %d", soft, target)
    else:
        target = soft  # never lower a limit the operator raised
    if target >= want:
        return server
    if "max_connections" in server.model_fields_set:
        log.warning("file descriptor limit %d is below the %d that server.max_connections=%d "
                    "needs", target, want, server.max_connections)
        return server
    fit = max(1, (target - FD_RESERVE) // 2)
    low = fit < LOW_CAP_SHARE * server.max_connections
    log.log(logging.INFO if low else logging.DEBUG,
            "server.max_connections %d (default %d) to fit the file descriptor limit %d%s",
            fit, server.max_connections, target,
            f"; raise the hard limit (ulimit -Hn, systemd LimitNOFILE) to {want} for the "
            "default" if low else "")
    return server.model_copy(update={"max_connections": fit})


def startup_summary(config: GatewayConfig, port: int) -> str:
    """One line per model naming its tiers and replica counts, after the listening address:
    what ``serve`` prints at startup (endpoint credentials redacted)."""
    srv = config.server
    lines = [f"speedgate {__version__}: listening on http://{srv.host}:{port} "
             f"({srv.workers} worker{'s' if srv.workers > 1 else ''})"]
    for name, model in config.models.items():
        pools = ", ".join(
            f"{tier}: DNS {pool.discovery.host}:{pool.discovery.port}" if pool.discovery
            else f"{tier}: {len(pool.endpoints)} replica{'s' if len(pool.endpoints) != 1 else ''}"
            for tier, pool in model.tiers.items()
        )
        lines.append(f"  model {name} (default tier {model.default_tier}): {pools}")
    return "\n".join(lines)


def run_server(
    config: GatewayConfig,
    config_path: str | None = None,
    port_file: str | None = None,
    on_listen: Callable[[int], None] | None = None,
) -> None:
    """Serve ``config`` with uvicorn (uvloop + httptools) until SIGINT/SIGTERM.

    The listening socket is bound here (``server.port`` 0: a port the kernel picks), its port
    written to ``port_file`` when given (``engines.procs.write_port_file``: how tests and
    benchmarks find a gateway without choosing a port beforehand) and printed in the startup
    summary. With ``server.workers > 1`` each worker process loads ``config_path`` itself
    (uvicorn needs an import string to fork workers) and shares the socket, so a config given
    only as overrides needs one worker. ``on_listen(port)`` runs once the socket is bound.
    Raises ``OSError`` when the address is taken.
    """
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from engines.procs import write_port_file
    from gateway.admit.connections import GuardedHttpToolsProtocol
    from gateway.app import create_app
    from gateway.telemetry.access_log import configure_access_log

    _configure_logging(config.server.log_level)
    configure_access_log(config.telemetry.access_log_format)
    srv = raise_fd_limit(config.server)
    if srv is not config.server:  # the cap sized from the fd limit: served with it
        config = config.model_copy(update={"server": srv})
    sock = bind_listener(srv.host, srv.port)
    port = int(sock.getsockname()[1])
    print(startup_summary(config, port), file=sys.stderr, flush=True)
    common: dict[str, Any] = dict(
        host=srv.host,
        port=port,
        loop="uvloop",
        # httptools with read timeouts, a connection cap, a pipelining fix (admit.connections)
        http=GuardedHttpToolsProtocol,
        log_level=srv.log_level,
        access_log=False,  # speedgate writes its own access log line per request
        timeout_keep_alive=srv.keepalive_timeout_s,
        timeout_graceful_shutdown=srv.graceful_shutdown_s,
        log_config=None,
    )
    if port_file:
        write_port_file(port_file, port)
    if on_listen is not None:
        on_listen(port)
    try:
        if srv.workers > 1 and config_path is not None:
            os.environ["SPEEDGATE_CONFIG"] = os.path.abspath(config_path)
            # each worker loads the file itself; the environment overrides it with the cap
            # sized from the descriptor limit (or the same value, when it fits)
            os.environ["SPEEDGATE_SERVER__MAX_CONNECTIONS"] = str(srv.max_connections)
            ucfg = uvicorn.Config(
                "gateway.app:create_app_from_env", factory=True, workers=srv.workers, **common
            )
            Multiprocess(ucfg, sockets=[sock]).run()
        else:
            uvicorn.Server(uvicorn.Config(create_app(config), **common)).run(sockets=[sock])
    finally:
        sock.close()
