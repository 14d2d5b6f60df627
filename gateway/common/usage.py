"""Token usage of one request, the value type shared by the relay, the access log, cost and the
usage store (tokens; the OpenAI ``usage`` object's fields)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Usage:
    """Token usage of one request: ``prompt`` (includes ``cached``), ``completion``; tokens."""

    prompt: int = 0
    completion: int = 0
    cached: int = 0

    @classmethod
    def from_openai(cls, usage: Any) -> Usage | None:
        """From an OpenAI ``usage`` object (``prompt_tokens_details.cached_tokens`` optional).
        None when absent or malformed (non-integer counts): the gateway then counts itself."""
        if not isinstance(usage, dict):
            return None
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else 0
        prompt, completion = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
        cached = cached or 0
        if not all(type(v) is int and v >= 0 for v in (prompt, completion, cached)):
            return None
        return cls(prompt, completion, min(cached, prompt))


def add_usage(a: Usage, b: Usage) -> Usage:
    """The sum of two usages (tokens of two attempts of one request)."""
    return Usage(a.prompt + b.prompt, a.completion + b.completion, a.cached + b.cached)
