"""Reading deploy/compose.yaml the way docker compose does: .env, interpolation, profiles.

No Docker engine here, so the tests resolve the file themselves: ``${VAR}``, ``${VAR:-default}``,
``${VAR-default}``, ``${VAR:?msg}``, ``$VAR`` and ``$$`` as in the compose spec, with variables
from deploy/.env plus explicit overrides (never the developer's shell, to stay deterministic).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.tools import DEPLOY

COMPOSE = DEPLOY / "compose.yaml"
ENV_FILE = DEPLOY / ".env"
PROFILE_SETS = (("cpu",), ("gpu",), ("cpu", "observability"), ("gpu", "observability"),
                ("picker",))

_VAR = re.compile(r"\$(?:(?P<dollar>\$)|\{(?P<braced>[^}]*)\}|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))")
_BRACED = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:-|-|:\?|\?)(?P<arg>.*))?$", re.S)


def read_env_file(path: Path = ENV_FILE) -> dict[str, str]:
    """``KEY=VALUE`` lines of a compose .env file (comments and blank lines skipped)."""
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path}: not KEY=VALUE: {line!r}"
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def interpolate(text: str, env: dict[str, str]) -> str:
    """One string with compose variable interpolation applied."""

    def sub(m: re.Match[str]) -> str:
        if m.group("dollar"):
            return "$"
        if m.group("plain"):
            return env.get(m.group("plain"), "")
        b = _BRACED.match(m.group("braced"))
        assert b, f"bad interpolation ${{{m.group('braced')}}}"
        name, op, arg = b.group("name"), b.group("op"), b.group("arg") or ""
        value = env.get(name)
        if op == ":-":
            return value if value else interpolate(arg, env)
        if op == "-":
            return value if value is not None else interpolate(arg, env)
        if op in (":?", "?") and (value is None or (op == ":?" and not value)):
            raise ValueError(f"required variable {name}: {arg}")
        return value or ""

    return _VAR.sub(sub, text)


def _resolve(obj: Any, env: dict[str, str]) -> Any:
    if isinstance(obj, str):
        return interpolate(obj, env)
    if isinstance(obj, list):
        return [_resolve(v, env) for v in obj]
    if isinstance(obj, dict):
        return {k: _resolve(v, env) for k, v in obj.items()}
    return obj


def variables_used(text: str) -> set[str]:
    """Names of the variables a compose file interpolates."""
    names = set()
    for m in _VAR.finditer(text):
        if m.group("plain"):
            names.add(m.group("plain"))
        elif m.group("braced"):
            names.add(_BRACED.match(m.group("braced")).group("name"))  # type: ignore[union-attr]
    return names


def load(**overrides: str) -> dict[str, Any]:
    """The compose document, interpolated with deploy/.env plus ``overrides``."""
    env = read_env_file() | overrides
    return _resolve(yaml.safe_load(COMPOSE.read_text()), env)


def active_services(doc: dict[str, Any], profiles: tuple[str, ...]) -> dict[str, dict]:
    """Services that run with ``profiles`` enabled (no ``profiles`` key = always)."""
    return {
        name: svc
        for name, svc in doc["services"].items()
        if not svc.get("profiles") or set(svc["profiles"]) & set(profiles)
    }


def aliases(svc: dict[str, Any]) -> set[str]:
    """Network aliases of a service on any network."""
    out: set[str] = set()
    nets = svc.get("networks") or {}
    if isinstance(nets, dict):
        for cfg in nets.values():
            out.update((cfg or {}).get("aliases", []))
    return out


def dns_names(services: dict[str, dict]) -> dict[str, set[str]]:
    """Every name that resolves on the compose network → the services answering to it."""
    names: dict[str, set[str]] = {}
    for name, svc in services.items():
        for n in {name, *aliases(svc)}:
            names.setdefault(n, set()).add(name)
    return names


def listen_port(svc: dict[str, Any]) -> int:
    """The port a service's server listens on: its ``--port`` flag, else its PORT variable."""
    cmd = [str(c) for c in svc.get("command", [])]
    if "--port" in cmd:
        return int(cmd[cmd.index("--port") + 1])
    env = svc.get("environment") or {}
    return int(env["PORT"])
