"""Client-supplied ids kept at a bounded size: an id longer than ``MAX_ID_CHARS`` characters is
replaced, everywhere the gateway keeps or logs it (session tables, the active-session ledger,
the auto tier's session table, usage totals, the access log, traces), by ``sha256:`` + the hex
SHA-256 of its UTF-8 bytes (71 characters). Short ids stay as they are (readable in logs and
``/v1/usage``); a long one is still found again: the same id always maps to the same digest.
"""

from __future__ import annotations

import hashlib

#: Longest id kept verbatim (characters); longer ones are kept as their digest.
MAX_ID_CHARS = 200


def bounded_id(raw: str) -> str:
    """``raw`` when at most ``MAX_ID_CHARS`` characters, else ``sha256:<64 hex>`` of it."""
    if len(raw) <= MAX_ID_CHARS:
        return raw
    return "sha256:" + hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()
