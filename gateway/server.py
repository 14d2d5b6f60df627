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

from gateway import __version__
from gateway.config import GatewayConfig


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


def raise_fd_limit(max_connections: int) -> None:
    """Raise the soft ``RLIMIT_NOFILE`` so ``max_connections`` clients (each may hold an engine
    connection too) fit: to ``2 × max_connections + 256`` or the hard limit, whichever is lower.
    A cap the limit cannot fit is logged (connections then fail at accept before the cap)."""
    if max_connections <= 0:
        return
    want = 2 * max_connections + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < want:
        logging.getLogger("speedgate.server").warning(
            "file descriptor limit %d is below the %d that server.max_connections=%d needs",
            target, want, max_connections)


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

    srv = config.server
    _configure_logging(srv.log_level)
    configure_access_log(config.telemetry.access_log_format)
    raise_fd_limit(srv.max_connections)
    sock = bind_listener(srv.host, srv.port)
    port = int(sock.getsockname()[1])
    print(startup_summary(config, port), file=sys.stderr, flush=True)
    common = dict(
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
            ucfg = uvicorn.Config(
                "gateway.app:create_app_from_env", factory=True, workers=srv.workers, **common
            )
            Multiprocess(ucfg, sockets=[sock]).run()
        else:
            uvicorn.Server(uvicorn.Config(create_app(config), **common)).run(sockets=[sock])
    finally:
        sock.close()
