"""Stand-in for the `vllm` executable in tests of the launch scripts.

Checks the command vllm-serve.sh builds - `serve MODEL --config FILE --flag value ...`, every flag
(on the command line and in the --config file) a real `vllm serve` flag - records what it was
given, then becomes the engine simulator on the requested port, standard or speculative by the
speculative-config, so the script's process handling and health waits run for real.

    fake_vllm.py serve MODEL [flags]      (FAKE_VLLM_RECORD=DIR: write DIR/<port>.json)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.deploy.vllm_flags import SERVE_FLAGS, SPECULATIVE_KEYS


def parse(argv: list[str]) -> tuple[str, dict[str, object]]:
    """``serve MODEL --a 1 --flag ...`` → (MODEL, {a: "1", flag: True}); CLI over --config."""
    if len(argv) < 2 or argv[0] != "serve" or argv[1].startswith("-"):
        sys.exit(f"fake vllm: expected `serve MODEL ...`, got {argv}")
    model, rest, cli = argv[1], argv[2:], {}
    i = 0
    while i < len(rest):
        flag = rest[i]
        if not flag.startswith("--"):
            sys.exit(f"fake vllm: stray argument {flag!r}")
        if i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            cli[flag[2:]] = rest[i + 1]
            i += 2
        else:
            cli[flag[2:]] = True
            i += 1
    flags = dict(yaml.safe_load(Path(str(cli["config"])).read_text())) if "config" in cli else {}
    flags.update(cli)
    unknown = set(flags) - SERVE_FLAGS
    if unknown:
        sys.exit(f"fake vllm: not vllm serve flags: {sorted(unknown)}")
    spec = flags.get("speculative-config")
    if isinstance(spec, str):
        spec = json.loads(spec)
    if spec is not None and set(spec) - SPECULATIVE_KEYS:
        sys.exit(f"fake vllm: unknown speculative-config keys {set(spec) - SPECULATIVE_KEYS}")
    flags["speculative-config"] = spec
    return model, flags


def main() -> None:
    model, flags = parse(sys.argv[1:])
    port = str(flags.get("port", "8000"))
    record = os.environ.get("FAKE_VLLM_RECORD")
    if record:
        Path(record, f"{port}.json").write_text(json.dumps({
            "model": model, "flags": flags,
            "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }))
    spec = flags["speculative-config"]
    argv = [sys.executable, "-m", "engines.sim", "--host", str(flags.get("host", "0.0.0.0")),
            "--port", port, "--served-model-name", str(flags.get("served-model-name", model)),
            "--time-scale", "0", "--mode", "speculative" if spec else "standard"]
    if spec:
        argv += ["--num-speculative-tokens", str(spec["num_speculative_tokens"])]
    for flag in ("max-num-seqs", "max-num-batched-tokens", "max-model-len"):
        if flag in flags:
            argv += [f"--{flag}", str(flags[flag])]
    os.execv(sys.executable, argv)


if __name__ == "__main__":
    main()
