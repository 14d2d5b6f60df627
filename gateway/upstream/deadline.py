"""The request's total deadline: config ``total_s``, shortened per request by headers.

``x-speedgate-timeout`` (seconds) and, when absent, the OpenAI SDK's ``x-stainless-timeout``
(seconds; the client's own timeout, so waiting longer is pointless). A header can only shorten
the pool's ``total_s``, never extend it.
"""

from __future__ import annotations

import math
import re

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
    if stainless is not None:
        try:
            value = float(stainless)
        except ValueError:
            return None
        if value > 0 and math.isfinite(value):
            return value
    return None


def total_timeout_s(config_total_s: float, header_s: float | None) -> float:
    """Seconds allowed for the whole request."""
    return config_total_s if header_s is None else min(config_total_s, header_s)
