"""The client's own timeouts, from its headers: they shorten the pool's, never extend them
(waiting longer than the client does is pointless).

- **total**: ``x-speedgate-timeout`` (seconds) and, when absent, ``x-stainless-timeout``, the
  whole-request timeout the Stainless TypeScript SDKs send (``openai``, ``@anthropic-ai/sdk``
  for Node: ``String(Math.trunc(timeout / 1000))``). Shortens the pool's ``total_s``.
- **read**: ``x-stainless-read-timeout``, what the Python SDKs send (``openai``,
  ``anthropic``: the httpx read timeout, default 600 s): the longest the client waits for the
  next bytes. Until the first byte that is the whole wait for the first token of a stream (the
  gateway answers headers with it) or for a JSON body; then the gap between events. So it
  bounds the wait for the first byte of the request (across retries) and the stall, not the
  total.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from gateway.errors import InvalidRequest

_SECONDS = re.compile(r"[0-9]+(\.[0-9]*)?|\.[0-9]+")  # plain decimal seconds, no "1_0" or "1e3"


def header_timeout_s(speedgate: str | None, stainless: str | None) -> float | None:
    """The per-request timeout in seconds from the headers, or None.

    Raises ``InvalidRequest`` (400) when ``x-speedgate-timeout`` is not a positive number; an
    unparsable ``x-stainless-timeout`` (not ours) is ignored.
    """
    if speedgate is not None:
        value = float(speedgate) if _SECONDS.fullmatch(speedgate.strip()) else math.nan
        if not (value > 0 and math.isfinite(value)):
            raise InvalidRequest(
                "x-speedgate-timeout must be a positive number of seconds",
                param="x-speedgate-timeout",
            )
        return value
    return _positive_seconds(stainless)


def _positive_seconds(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds > 0 and math.isfinite(seconds) else None


@dataclass(frozen=True, slots=True)
class ClientTimeouts:
    """The client's timeouts in seconds (None: not sent). ``total_s`` bounds the whole request
    (``total_timeout_s``); ``read_s`` the wait for the first byte and each later gap."""

    total_s: float | None = None
    read_s: float | None = None


def client_timeouts(
    speedgate: str | None, stainless: str | None, stainless_read: str | None
) -> ClientTimeouts:
    """``ClientTimeouts`` from ``x-speedgate-timeout``, ``x-stainless-timeout`` and
    ``x-stainless-read-timeout``. Raises ``InvalidRequest`` (400) for a bad
    ``x-speedgate-timeout``; unparsable SDK headers (not ours) are ignored."""
    return ClientTimeouts(header_timeout_s(speedgate, stainless), _positive_seconds(stainless_read))


def total_timeout_s(config_total_s: float, header_s: float | None) -> float:
    """Seconds allowed for the whole request."""
    return config_total_s if header_s is None else min(config_total_s, header_s)
