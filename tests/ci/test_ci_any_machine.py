"""Hardening issue, item 1: CI passes on any machine of this kind.

- No server a test or benchmark starts depends on a port staying free: the simulator and the
  gateway bind port 0 and report the port they got (``--port-file``); only vLLM, which cannot,
  gets a port picked here, with a retry on a fresh one when it was taken meanwhile.
- The tiny model's output does not depend on the CPU's numerics (``engines.vllm.tinymodel``;
  proven against real vLLM in ``tests/integration_vllm``).
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import yaml

from engines.procs import spawn_reporting_port, stop_processes

ROOT = Path(__file__).resolve().parents[2]
# The only places allowed to pick a port before the server binds it: the definition, and
# callers that retry on a fresh port when the bind fails (vLLM, LiteLLM's proxy and smg cannot
# report a port they bound).
PICK_ALLOWED = {
    "engines/procs.py",
    "engines/vllm/launcher.py",
    "tests/deploy/test_engine_profiles.py",
    "loadtests/bench_race.py",
    "loadtests/bench_long_prompts.py",
}


def test_ci_any_machine_no_port_is_picked_before_its_server_binds_it() -> None:
    offenders = []
    for folder in ("engines", "gateway", "tests", "loadtests"):
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if rel in PICK_ALLOWED or rel == "tests/ci/test_ci_any_machine.py":
                continue
            if re.search(r"\bfree_port\(", path.read_text()):
                offenders.append(rel)
    assert offenders == [], f"pick a port, release it, bind it later: {offenders}"


def test_ci_any_machine_servers_bind_port_zero_and_report_it(tmp_path: Path) -> None:
    """A simulator and a gateway started while a listener holds some port both come up on
    ports they bound themselves and answer there."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    procs = []
    try:
        sim, sim_url = spawn_reporting_port(
            [sys.executable, "-m", "engines.sim", "--port", "0", "--time-scale", "0",
             "--served-model-name", "m"])
        procs.append(sim)
        assert int(sim_url.rsplit(":", 1)[1]) not in (0, taken)
        cfg = tmp_path / "gw.yaml"
        cfg.write_text(yaml.safe_dump({"server": {"port": 0}, "models": {"m": {"tiers": {
            "standard": {"served_model_name": "m", "endpoints": [sim_url]}}}}}))
        with (tmp_path / "gw.log").open("wb") as log:
            gw, gw_url = spawn_reporting_port(
                [sys.executable, "-m", "gateway", "serve", "-c", str(cfg)], stdout=log)
        procs.append(gw)
        assert int(gw_url.rsplit(":", 1)[1]) not in (0, taken)
        r = httpx.post(gw_url + "/v1/chat/completions", timeout=30, json={
            "model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        summary = (tmp_path / "gw.log").read_text()
        assert f"listening on {gw_url}" in summary
        assert "model m (default tier standard): standard: 1 replica" in summary
    finally:
        stop_processes(procs)
        holder.close()


def test_ci_any_machine_gateway_reports_a_taken_port_clearly(tmp_path: Path) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(yaml.safe_dump({"server": {"port": port}, "models": {"m": {"tiers": {
        "standard": {"served_model_name": "m", "endpoints": ["http://127.0.0.1:9"]}}}}}))
    try:
        r = subprocess.run([sys.executable, "-m", "gateway", "serve", "-c", str(cfg)],
                           capture_output=True, text=True, timeout=60)
    finally:
        holder.close()
    assert r.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr
    assert "Traceback" not in r.stderr


def test_ci_any_machine_vllm_replica_retries_on_a_fresh_port(tmp_path: Path) -> None:
    """``start_replica(port=None)``: when the server exits with "address already in use",
    ``wait_healthy`` starts it again on another port (a stand-in server: no vLLM needed)."""
    from engines.vllm import launcher

    script = tmp_path / "fake.py"
    # the first start fails as if its port was taken; the second serves /health
    script.write_text(
        "import sys, http.server, pathlib\n"
        "marker = pathlib.Path(sys.argv[1])\n"
        "port = int(sys.argv[sys.argv.index('--port') + 1])\n"
        "if not marker.exists():\n"
        "    marker.write_text('x'); print('OSError: [Errno 98] Address already in use');"
        " sys.exit(1)\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers()\n"
        "    def log_message(self, *a): pass\n"
        "http.server.HTTPServer(('127.0.0.1', port), H).serve_forever()\n"
    )
    marker = tmp_path / "first-start-done"

    def fake_args(tier: str, port: int, model_path: Path, name: str, host: str) -> list[str]:
        return [str(script), str(marker), "--port", str(port)]

    orig = launcher.serve_args
    launcher.serve_args = fake_args  # type: ignore[assignment]
    try:
        r = launcher.start_replica("standard", None, tmp_path / "run", python=Path(sys.executable),
                                   model_path=tmp_path)
        first_url = r.url
        r.wait_healthy(timeout_s=30)
        assert r.port_retries == 1
        assert r.url != first_url or marker.exists()
        assert httpx.get(r.url + "/health", timeout=5).status_code == 200
    finally:
        launcher.serve_args = orig  # type: ignore[assignment]
        r.stop(grace_s=2)
