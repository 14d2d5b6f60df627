"""``speedgate picker`` flags: a bad value is argparse's usage error (exit 2), no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("value", ["0", "-1"])
def test_picker_max_endpoints_0_is_a_clean_usage_error(tmp_path: Path, value: str) -> None:
    """``--max-endpoints`` below 1 died with a ValueError traceback (exit 1)."""
    cfg = tmp_path / "pk.yaml"
    cfg.write_text("models:\n  m:\n    tiers:\n      standard:\n        served_model_name: m\n"
                   "        endpoints: ['http://127.0.0.1:9']\n")
    p = subprocess.run([sys.executable, "-m", "gateway.cli", "picker", "--config", str(cfg),
                        "--host", "127.0.0.1", "--port", "0", "--max-endpoints", value],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr[-500:]
    assert "Traceback" not in p.stderr
    assert "--max-endpoints" in p.stderr
