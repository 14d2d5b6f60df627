"""``python -m engines.vllm prepare | serve``: install the vLLM venv and build the tiny model
(what CI runs before the tests), or run one real vLLM replica in the foreground."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (1 when vLLM cannot be installed or started)."""
    p = argparse.ArgumentParser(prog="python -m engines.vllm", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare", help="install or reuse the vLLM venv; build or reuse the model")
    s = sub.add_parser("serve", help="run one vLLM replica for a tier until Ctrl-C")
    s.add_argument("--tier", choices=["standard", "fast"], default="standard")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--served-model-name", default="mymodel")
    args = p.parse_args(argv)

    from engines.vllm import prepare
    from engines.vllm.launcher import start_replica

    try:
        python, model = prepare()
    except RuntimeError as e:
        print(f"engines.vllm: {e}", file=sys.stderr)
        return 1
    print(f"vLLM venv: {python}\ntiny model: {model}")
    if args.cmd == "prepare":
        return 0
    run_dir = Path(tempfile.mkdtemp(prefix=f"speedgate-vllm-{args.tier}-"))
    r = start_replica(args.tier, args.port, run_dir, python=python, model_path=model,
                      served_model_name=args.served_model_name, host=args.host)
    try:
        print(f"{args.tier} replica healthy on {r.url} after {r.wait_healthy():.0f}s "
              f"(log: {r.log_path}); Ctrl-C stops it", flush=True)
        r.proc.wait()
        print(r.log(), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except RuntimeError as e:
        print(f"engines.vllm: {e}", file=sys.stderr)
        return 1
    finally:
        r.stop()


if __name__ == "__main__":
    sys.exit(main())
