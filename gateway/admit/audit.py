"""The audit log: admin actions and authentication/authorisation failures, one JSON object
per line on the logger ``speedgate.audit`` (level WARNING for failures, INFO for admin actions).

Fields: ``ts`` (Unix seconds), ``event`` (``auth_failed`` | ``permission_denied`` |
``admin_action``), ``code``, ``request_id``, ``key_id`` (a configured id, never a key),
``key_fingerprint`` (first 8 hex of an unknown key's SHA-256, see ``auth.fingerprint``),
``client`` (peer address), ``path``, and event details (``model``, ``tier``, ``action``).
Never a key, a header value or request content.

A flood of bad keys must not flood the log: at most ``max_per_s`` lines per second are written;
the rest are counted and the count is reported on the next line written (``suppressed``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson

audit_log = logging.getLogger("speedgate.audit")


class AuditLog:
    """Writes audit events, rate-limited to ``max_per_s`` lines per second."""

    def __init__(self, max_per_s: int = 50, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_per_s = max_per_s
        self._clock = clock
        self._second = -1
        self._written = 0
        self.suppressed = 0  # events not written since the last line

    def event(self, event: str, *, level: int = logging.WARNING, **fields: Any) -> None:
        """Record one event; ``fields`` must hold no secret (ids and codes only)."""
        if not audit_log.isEnabledFor(level):
            return
        sec = int(self._clock())
        if sec != self._second:
            self._second, self._written = sec, 0
        if self._written >= self.max_per_s:
            self.suppressed += 1
            return
        self._written += 1
        doc: dict[str, Any] = {"ts": round(time.time(), 3), "event": event}
        doc.update((k, v) for k, v in fields.items() if v is not None)
        if self.suppressed:
            doc["suppressed"], self.suppressed = self.suppressed, 0
        audit_log.log(level, "%s", orjson.dumps(doc).decode())


def client_addr(scope: Mapping[str, Any]) -> str | None:
    """``host:port`` of the peer from an ASGI scope, or None."""
    client = scope.get("client")
    if not client:
        return None
    return f"{client[0]}:{client[1]}"
