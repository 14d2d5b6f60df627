"""The client's sampling parameters checked against the OpenAI API's schema before anything is
sent upstream, so that a mistake in the client's body is answered 400 by the gateway and never
reaches an engine: an engine that answers it with a 5xx, a reset or a hang (the simulator once
raised a ``TypeError`` on ``"stop": 5``, and generated for minutes on ``"n": 467752472``) would
otherwise have the client's mistake counted toward its outlier ejection (and retried on every
other replica, ejecting them in turn). Whatever the engine would answer, a request that fails
here costs no replica anything.

Checked (OpenAI API reference, "Create chat completion" and "Create completion"; vLLM's request
schema agrees): ``stop`` a string, an array of strings or null; ``n`` an integer from 1 to
``MAX_N`` (vLLM's default ``VLLM_MAX_N_SEQUENCES``: no engine accepts more by default);
``max_tokens`` and ``max_completion_tokens`` integers of at least 1, except ``max_tokens: 0``
with ``echo`` true on ``/v1/completions`` (``echo_only``); ``temperature``, ``top_p``,
``presence_penalty`` and ``frequency_penalty`` numbers; ``seed`` an integer; each may be null.
Types follow JSON Schema: a boolean is not a number, ``2.0`` is an integer. Ranges beyond these
are the engine's to judge (its 4xx is passed through and, being the client's fault, never
counted either). Other fields, vLLM's extras included, are forwarded unchecked.

Echo without generation: the legacy Completions API answers ``echo: true, max_tokens: 0`` with
the prompt alone (OpenAI's completions reference; lm-evaluation-harness scores loglikelihoods
this way, with ``logprobs``). vLLM accepts exactly that case on ``/v1/completions``
(``CompletionRequest``: ``echo and max_tokens == 0``, "echo without generation"), its ``echo``
a pydantic ``bool`` (so ``1`` or ``"true"`` count as true); its chat endpoint still refuses 0.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import TypeAdapter, ValidationError

from gateway.errors import InvalidRequest

#: Largest ``n`` accepted: vLLM's default ``VLLM_MAX_N_SEQUENCES`` (``vllm/envs.py``).
MAX_N = 16384

_NUMBERS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _is_integer(v: Any) -> bool:
    return _is_number(v) and float(v).is_integer()


_BOOL: TypeAdapter[bool] = TypeAdapter(bool)


def echo_only(doc: dict[str, Any], operation: str) -> bool:
    """Whether ``doc`` asks for the prompt echoed with no generation: a ``text_completion``
    with ``max_tokens`` 0 and ``echo`` true as vLLM's pydantic ``bool`` reads it."""
    if operation != "text_completion" or doc.get("max_tokens") != 0:
        return False
    try:
        return _BOOL.validate_python(doc.get("echo"))
    except ValidationError:
        return False


def check_sampling_params(doc: dict[str, Any], operation: str = "chat") -> None:
    """Raise ``InvalidRequest`` (400, ``param`` naming the field, code ``invalid_type`` or
    ``invalid_value``) when a sampling parameter of ``doc`` breaks the OpenAI schema above.
    ``operation``: the protocol's (``chat`` or ``text_completion``: ``echo_only`` applies to
    the latter)."""
    stop = doc.get("stop")
    if stop is not None and not isinstance(stop, str) and not (
        isinstance(stop, list) and all(isinstance(s, str) for s in stop)
    ):
        raise InvalidRequest(
            "'stop' must be a string, an array of strings or null", param="stop",
            code="invalid_type",
        )
    n = doc.get("n")
    if n is not None:
        if not _is_integer(n):
            raise InvalidRequest("'n' must be an integer", param="n", code="invalid_type")
        if not 1 <= n <= MAX_N:
            raise InvalidRequest(f"'n' must be from 1 to {MAX_N}, got {int(n)}", param="n",
                                 code="invalid_value")
    for name in ("max_tokens", "max_completion_tokens"):
        v = doc.get(name)
        if v is None:
            continue
        if not _is_integer(v):
            raise InvalidRequest(f"'{name}' must be an integer", param=name, code="invalid_type")
        if v < 1 and not (name == "max_tokens" and echo_only(doc, operation)):
            raise InvalidRequest(f"'{name}' must be at least 1, got {int(v)}", param=name,
                                 code="invalid_value")
    for name in _NUMBERS:
        v = doc.get(name)
        if v is not None and not _is_number(v):
            raise InvalidRequest(f"'{name}' must be a number", param=name, code="invalid_type")
    seed = doc.get("seed")
    if seed is not None and not _is_integer(seed):
        raise InvalidRequest("'seed' must be an integer", param="seed", code="invalid_type")
