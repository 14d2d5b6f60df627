"""Reading the Dockerfile and .dockerignore without Docker."""

from __future__ import annotations

import fnmatch
import json
import shutil
from pathlib import Path

from tests.deploy.tools import REPO

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"


def instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def final_stage(instrs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The instructions of the last stage (from its FROM on)."""
    last = max(i for i, (word, _) in enumerate(instrs) if word == "FROM")
    return instrs[last:]


def exec_form(instrs: list[tuple[str, str]], word: str) -> list[str]:
    """The JSON array of the last ``word`` instruction (ENTRYPOINT, CMD)."""
    args = [a for w, a in instrs if w == word][-1]
    return json.loads(args)


def _ignore_rules() -> list[tuple[bool, str]]:
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keep = line.startswith("!")
            rules.append((keep, line.lstrip("!").rstrip("/")))
    return rules


def _matches(pattern: str, rel: str) -> bool:
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]  # a dir matches its contents
    if pattern.startswith("**/"):
        tail = pattern[3:]
        return any(fnmatch.fnmatchcase(p, tail) for p in parts) or fnmatch.fnmatchcase(rel, tail)
    return any(fnmatch.fnmatchcase(p, pattern) for p in prefixes)


def in_context(rel: str) -> bool:
    """True when ``rel`` (a path relative to the repo) is sent to ``docker build`` (last rule
    that matches wins, as in Docker)."""
    included = True
    for keep, pattern in _ignore_rules():
        if _matches(pattern, rel):
            included = keep
    return included


def copy_build_context(dest: Path) -> list[str]:
    """Copy the files .dockerignore admits into ``dest``, as docker build would send them;
    returns their relative paths."""
    copied = []
    for path in sorted(REPO.rglob("*")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith((".git/", ".venv/")) or not path.is_file() or not in_context(rel):
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        copied.append(rel)
    return copied
