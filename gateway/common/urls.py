"""URL helpers that keep credentials out of logs, error bodies and spans."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def redact_url(url: str) -> str:
    """``url`` with any ``user:password@`` replaced by ``***@`` and the query string dropped.

    ``http://u:secret@host:8000/v1?key=x`` → ``http://***@host:8000/v1``.
    """
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
