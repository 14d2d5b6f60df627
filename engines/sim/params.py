"""Sampling parameters checked the way vLLM checks them, so the simulator answers bad input
with vLLM's 400 instead of failing inside (a ``TypeError`` is a 500) or trying to generate an
absurd request.

Two layers, as in vLLM: the request schema (pydantic in lax mode: ``stop`` is a string, a list of
strings or null; ``n`` an integer, where ``true``, ``2.0`` and ``"2"`` coerce and ``2.5``,
``"x"`` do not), whose failures vLLM answers as 400 type ``Bad Request`` with param
``body.<field>``; then ``SamplingParams`` checks (``n`` in ``[1, VLLM_MAX_N_SEQUENCES]``, 16384
unless that environment variable says otherwise; ``n`` 1 under greedy sampling, temperature
below 1e-5; no empty stop string), answered as 400 ``BadRequestError``. Source: vLLM's
``vllm/entrypoints/openai/chat_completion/protocol.py`` (``n: int | None``, ``stop: str |
list[str] | None``) and ``vllm/sampling_params.py`` (``_verify_num_sequences``,
``_verify_args``, ``_verify_greedy_sampling``, ``_SAMPLING_EPS``).
"""

from __future__ import annotations

import math
import os
from typing import Any

#: vLLM's default ``VLLM_MAX_N_SEQUENCES`` (``vllm/envs.py``).
DEFAULT_MAX_N = 16384
#: Temperatures below this are greedy sampling in vLLM (``_SAMPLING_EPS``).
SAMPLING_EPS = 1e-5


class InvalidParam(ValueError):
    """A 400 in vLLM's terms: ``message``, ``param`` (``body.<field>`` for schema errors, else
    None) and ``type_`` (``Bad Request`` for schema errors, ``BadRequestError`` otherwise)."""

    def __init__(self, message: str, param: str | None = None, type_: str = "BadRequestError"
                 ) -> None:
        super().__init__(message)
        self.message, self.param, self.type_ = message, param, type_


def max_n() -> int:
    """The largest ``n`` accepted: ``VLLM_MAX_N_SEQUENCES`` from the environment, else 16384."""
    try:
        return int(os.environ.get("VLLM_MAX_N_SEQUENCES", DEFAULT_MAX_N))
    except ValueError:
        return DEFAULT_MAX_N


def _schema_error(field: str, expected: str, value: Any) -> InvalidParam:
    return InvalidParam(
        f"1 validation error for request body: {field}: input should be {expected}, got "
        f"{type(value).__name__} {value!r:.50}", param=f"body.{field}", type_="Bad Request",
    )


def lax_int(field: str, value: Any) -> int:
    """``value`` as pydantic's lax ``int`` takes it (bools, integral floats, numeric strings),
    else the schema error."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise _schema_error(field, "a valid integer", value)


def check_stop(body: dict[str, Any]) -> list[str]:
    """The request's stop strings (``stop``: a string, a list of strings or null)."""
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = stop
    else:
        raise _schema_error("stop", "a string or a list of strings", stop)
    if any(not s for s in stops):
        raise InvalidParam("stop cannot contain an empty string.")
    return stops


def check_n(body: dict[str, Any]) -> int:
    """The number of choices ``n`` (default 1), within vLLM's limits."""
    raw = body.get("n")
    n = 1 if raw is None else lax_int("n", raw)
    if n < 1:
        raise InvalidParam(f"n must be at least 1, got {n}.")
    limit = max_n()
    if n > limit:
        raise InvalidParam(f"n must be at most {limit}, got {n} (the VLLM_MAX_N_SEQUENCES limit).")
    temperature = body.get("temperature")
    if n > 1 and isinstance(temperature, int | float) and temperature < SAMPLING_EPS:
        raise InvalidParam(f"n must be 1 when using greedy sampling, got {n}.")
    return n
