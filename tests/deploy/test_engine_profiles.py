"""engines/profiles: the vLLM launch profiles, vllm-serve.sh and local-pool.sh.

No GPU and no vLLM here: the profiles are checked against the list of real `vllm serve` flags
(tests/deploy/vllm_flags.py), and the scripts run with a fake `vllm` that validates the command it
is given and then serves it with the engine simulator.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from engines.procs import free_port
from tests.deploy.processes import start_on_port0, stop_processes, wait_http
from tests.deploy.tools import BIN, PROFILES, venv_tool
from tests.deploy.vllm_flags import SERVE_FLAGS, SPECULATIVE_KEYS, SPECULATIVE_METHODS

SERVE = PROFILES / "vllm-serve.sh"
POOL = PROFILES / "local-pool.sh"
FAST = sorted(PROFILES.glob("fast-*.yaml"))
# Keys the fast profiles set differently from standard.yaml, on purpose (see their comments).
FAST_DIFFERS = {"max-num-seqs", "max-num-batched-tokens", "speculative-config"}


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_profiles_use_only_real_vllm_flags() -> None:
    for path in [PROFILES / "standard.yaml", *FAST]:
        assert set(load(path)) <= SERVE_FLAGS, path.name


def test_standard_profile_enables_what_the_gateway_relies_on() -> None:
    std = load(PROFILES / "standard.yaml")
    assert std["enable-prefix-caching"] is True  # prefix affinity
    assert std["enable-prompt-tokens-details"] is True  # cached_tokens for billing
    assert "speculative-config" not in std


@pytest.mark.parametrize("path", FAST, ids=lambda p: p.name)
def test_fast_profiles_are_standard_plus_speculation(path: Path) -> None:
    std, fast = load(PROFILES / "standard.yaml"), load(path)
    assert set(fast) == set(std) | {"speculative-config"}
    same = {k for k in std if k not in FAST_DIFFERS}
    assert {k: fast[k] for k in same} == {k: std[k] for k in same}
    assert fast["max-num-seqs"] < std["max-num-seqs"], "fast keeps batches small"
    spec = fast["speculative-config"]
    assert set(spec) <= SPECULATIVE_KEYS
    method = path.stem.removeprefix("fast-")
    assert spec["method"] == method and method in SPECULATIVE_METHODS
    assert 1 <= spec["num_speculative_tokens"] <= 8
    if method == "eagle3":
        assert spec["model"], "EAGLE-3 needs the draft head of the target model"


def dry_run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SERVE), *args], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], "DRY_RUN": "1", **env})


def test_vllm_serve_builds_the_command() -> None:
    r = dry_run("standard", MODEL="org/m", SERVED_MODEL_NAME="mymodel", PORT="8123", TP="4")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "vllm", "serve", "org/m", "--config", str(PROFILES / "standard.yaml"),
        "--served-model-name", "mymodel", "--host", "0.0.0.0", "--port", "8123",
        "--tensor-parallel-size", "4",
    ]


def test_vllm_serve_optional_flags_and_fast_method() -> None:
    r = dry_run("fast", MODEL="m", SPEC_METHOD="eagle3", MAX_MODEL_LEN="1048576",
                KV_CACHE_DTYPE="fp8", VLLM_EXTRA_ARGS="--trust-remote-code  --max-num-seqs 8")
    assert r.returncode == 0, r.stderr
    argv = r.stdout.splitlines()
    assert argv[argv.index("--config") + 1] == str(PROFILES / "fast-eagle3.yaml")
    assert argv[argv.index("--served-model-name") + 1] == "m", "defaults to MODEL"
    assert argv[-7:] == ["--max-model-len", "1048576", "--kv-cache-dtype", "fp8",
                         "--trust-remote-code", "--max-num-seqs", "8"]
    assert set(a[2:] for a in argv if a.startswith("--")) <= SERVE_FLAGS
    default = dry_run("fast", MODEL="m").stdout.splitlines()
    assert default[default.index("--config") + 1] == str(PROFILES / "fast-ngram.yaml")


@pytest.mark.parametrize(("args", "env"), [
    ((), {"MODEL": "m"}),
    (("turbo",), {"MODEL": "m"}),
    (("fast",), {"MODEL": "m", "SPEC_METHOD": "medusa"}),
    (("standard",), {}),
])
def test_vllm_serve_refuses_bad_input(args: tuple[str, ...], env: dict[str, str]) -> None:
    r = dry_run(*args, **env)
    assert r.returncode != 0 and r.stderr


def test_shell_scripts_pass_shellcheck() -> None:
    r = subprocess.run([venv_tool("shellcheck"), str(SERVE), str(POOL)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


@pytest.fixture
def fake_vllm(tmp_path: Path) -> Path:
    exe = tmp_path / "vllm"
    fake = Path(__file__).with_name("fake_vllm.py")
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{fake}" "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_local_pool_start_serve_stop(tmp_path: Path, fake_vllm: Path) -> None:
    run_dir, record = tmp_path / "pool", tmp_path / "record"
    record.mkdir()

    def pool(cmd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(POOL), cmd], env=env, capture_output=True,
                              text=True, timeout=90)

    procs = []
    try:
        # The pool script serves on the ports it is given (as in production: vLLM cannot bind
        # port 0 and report it), so a port picked free here can be taken before the replica
        # binds it: then start again on fresh ports.
        for attempt in range(3):
            std_port, fast_port = free_port(), free_port()
            env = {
                **os.environ, "MODEL": "org/model", "SERVED_MODEL_NAME": "mymodel", "TP": "2",
                "GPUS": "0,1,2,3", "STANDARD_PORT": str(std_port), "FAST_PORT": str(fast_port),
                "RUN_DIR": str(run_dir), "VLLM_BIN": str(fake_vllm),
                "FAKE_VLLM_RECORD": str(record), "HEALTH_TIMEOUT_S": "60",
            }
            r = pool("start")
            if r.returncode == 0:
                break
            logs = "".join(p.read_text(errors="replace") for p in run_dir.glob("*.log"))
            pool("stop")
            assert attempt < 2 and "address already in use" in logs.lower(), r.stdout + r.stderr
        assert r.returncode == 0, r.stdout + r.stderr
        pids = [int(p.read_text()) for p in run_dir.glob("*.pid")]
        assert len(pids) == 2
        assert "running" in pool("status").stdout

        # Each replica got its own GPUs (TP=2 of 4) and the tier's profile.
        seen = {int(p.stem): json.loads(p.read_text()) for p in record.glob("*.json")}
        assert seen[std_port]["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert seen[fast_port]["CUDA_VISIBLE_DEVICES"] == "2,3"
        assert seen[std_port]["flags"]["speculative-config"] is None
        assert seen[fast_port]["flags"]["speculative-config"]["method"] == "ngram"

        # The gateway config it wrote is valid and serves both tiers.
        config = run_dir / "gateway.yaml"
        check = subprocess.run([str(BIN / "speedgate"), "check-config", str(config)],
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
        tiers = yaml.safe_load(check.stdout)["models"]["mymodel"]["tiers"]
        urls = {t: [u.rstrip("/") for u in pool["endpoints"]] for t, pool in tiers.items()}
        assert urls == {"standard": [f"http://127.0.0.1:{std_port}"],
                        "fast": [f"http://127.0.0.1:{fast_port}"]}
        log = tmp_path / "gw.log"
        gw, gw_port = start_on_port0([str(BIN / "speedgate"), "serve", "-c", str(config),
                                      "--port", "0"], log)
        procs.append(gw)
        base = f"http://127.0.0.1:{gw_port}"
        wait_http(base + "/readyz", procs[0], log)
        r2 = httpx.post(base + "/v1/chat/completions", timeout=30, json={
            "model": "mymodel-fast", "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}]})
        assert r2.status_code == 200 and r2.headers["x-speedgate-tier"] == "fast", r2.text

        assert pool("stop").returncode == 0
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.killpg(pid, 0)  # the whole process group is gone
        assert not list(run_dir.glob("*.pid"))
    finally:
        stop_processes(procs)
        pool("stop")


def test_local_pool_checks_gpu_count_before_starting(tmp_path: Path) -> None:
    r = subprocess.run(
        ["bash", str(POOL), "start"], capture_output=True, text=True, timeout=30,
        env={**os.environ, "MODEL": "m", "GPUS": "0", "TP": "1", "RUN_DIR": str(tmp_path)},
    )
    assert r.returncode == 2 and "need 2 GPUs" in r.stderr
    assert not list(tmp_path.glob("*.pid"))
