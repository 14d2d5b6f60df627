"""Claude Code (two versions), Codex and OpenCode for the agent tests, and the Node SDKs of the
client matrix: pinned npm packages installed once into a cache outside the repo (a folder per
set of pins under ``~/.cache/speedgate/agents``, or ``$SPEEDGATE_AGENTS_DIR``), reused while
its stamp names the pinned versions and every executable is there. A folder per set of pins:
checkouts pinning different versions share the cache without reinstalling over each other.

``python -m tests.agents.install`` installs (``.ci/run`` calls it); :func:`ensure_agents`
does the same from the tests and returns None (with the reason) only when npm cannot be run
or the registry cannot be reached.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

# pinned: the versions these tests were written against (npm view <pkg> version, 2026-12-02;
# opencode-ai 2026-12-04); the agents, and the Node SDKs of the client matrix
# (tests/clients/node_matrix.mjs). Claude Code twice: @latest, and 2.1.197, what
# `npm install -g @anthropic-ai/claude-code` picks on node 20 (2.1.332 needs node 22),
# under an npm alias so both install side by side.
CLAUDE_NODE20 = "claude-code-node20"
PACKAGES = {"@anthropic-ai/claude-code": "2.1.332",
            CLAUDE_NODE20: "npm:@anthropic-ai/claude-code@2.1.197",
            "@openai/codex": "0.171.0", "opencode-ai": "1.18.33",
            "openai": "7.59.0", "@anthropic-ai/sdk": "1.15.0", "ai": "7.0.173",
            "@ai-sdk/openai": "4.0.118"}
INSTALL_TIMEOUT_S = 600


def cache_dir() -> Path:
    """Where the agents live: a folder named by the pins (``pins-`` and 12 hex digits of their
    SHA-256) under ``$SPEEDGATE_AGENTS_DIR`` or ``~/.cache/speedgate/agents``."""
    env = os.environ.get("SPEEDGATE_AGENTS_DIR")
    base = Path(env) if env else Path.home() / ".cache" / "speedgate" / "agents"
    pins = hashlib.sha256(json.dumps(PACKAGES, sort_keys=True).encode()).hexdigest()[:12]
    return base / f"pins-{pins}"


@dataclass(frozen=True)
class Agents:
    """Paths of the installed executables (``claude``: Claude Code @latest, ``claude_node20``:
    the version npm picks on node 20) and of the ``node_modules`` folder."""

    claude: Path
    codex: Path
    node_modules: Path
    claude_node20: Path
    opencode: Path

    def executables(self) -> tuple[Path, ...]:
        """Every agent's executable."""
        return self.claude, self.claude_node20, self.codex, self.opencode


def _installed(root: Path) -> Agents | None:
    mods = root / "node_modules"
    bins = mods / ".bin"
    agents = Agents(bins / "claude", bins / "codex", mods,
                    mods / CLAUDE_NODE20 / "bin" / "claude.exe", bins / "opencode")
    stamp = root / "stamp.json"
    try:
        valid = json.loads(stamp.read_text()) == PACKAGES
    except (OSError, ValueError):
        valid = False
    return agents if valid and all(p.exists() for p in agents.executables()) else None


def ensure_agents() -> tuple[Agents | None, str]:
    """The installed agents (installing them when the cache is absent or stale), or
    ``(None, reason)`` when npm is missing or cannot reach the registry. Raises
    ``RuntimeError`` when npm reaches the registry but the install fails (a real failure)."""
    root = cache_dir()
    found = _installed(root)
    if found is not None:
        return found, ""
    npm = shutil.which("npm")
    if npm is None:
        return None, "npm is not installed"
    probe = subprocess.run([npm, "view", "@openai/codex", "version"], capture_output=True,
                           text=True, timeout=60)
    if probe.returncode != 0:
        return None, f"npm cannot reach its registry: {probe.stderr.strip()[-300:]}"
    root.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="agents-", dir=root.parent))
    specs = [f"{name}@{version}" for name, version in PACKAGES.items()]  # alias@npm:pkg@v too
    done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(work),
                           *specs], capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    if done.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        raise RuntimeError(f"npm install {' '.join(specs)} failed:\n{done.stderr[-2000:]}")
    (work / "stamp.json").write_text(json.dumps(PACKAGES))
    if root.exists():
        shutil.rmtree(root)
    work.rename(root)  # whole or absent: a stamp only ever sits beside a finished install
    found = _installed(root)
    if found is None:
        raise RuntimeError(f"npm install finished but the executables are missing in {root}")
    return found, ""


def main() -> None:
    """Install (or validate) the cached agents; exit 1 when they cannot be had."""
    agents, reason = ensure_agents()
    if agents is None:
        print(f"agents not installed: {reason}", file=sys.stderr)
        sys.exit(1)
    print(f"agents ready in {cache_dir()}: {PACKAGES}")


if __name__ == "__main__":
    main()
