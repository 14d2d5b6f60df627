"""Resume and assembly are optional capabilities of a client API (``base.Resumable``,
``base.Assembling``), not members of the base ``Protocol``: each registered API has exactly
the ones it implements, and an API without them is never continued nor assembled."""

from __future__ import annotations

from gateway.config import load_config
from gateway.protocols.base import (
    Assembling,
    Protocol,
    Resumable,
    Rewrite,
    assembler,
    resume_point,
)
from gateway.protocols.body import ParsedBody
from gateway.protocols.openai.chat import ChatProtocol
from gateway.protocols.registry import build_protocols, response_store


def test_each_api_has_the_capabilities_it_implements() -> None:
    config = load_config(models={"m": {"tiers": {"standard": {
        "served_model_name": "m", "endpoints": ["http://127.0.0.1:9"]}}}})
    protocols = build_protocols(response_store(config))
    caps = {path: (isinstance(p, Resumable), isinstance(p, Assembling))
            for path, p in protocols.items()}
    assert caps["/v1/chat/completions"] == (True, True)
    assert caps["/v1/completions"] == (True, True)
    assert caps["/v1/responses"] == (True, False)
    assert caps["/v1/messages"] == (True, False)


def test_the_base_protocol_has_neither_capability() -> None:
    for name in ("resume_point", "continuation_body", "assembler", "assemble"):
        assert not hasattr(Protocol, name), name


class _Plain(Protocol):
    """An API without resume or assembly (as a future one may start)."""

    name, path, operation = "plain", "/v1/plain", "chat"


def test_an_api_without_the_capabilities_is_never_continued_nor_assembled() -> None:
    body = ChatProtocol().parse(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}')
    assert isinstance(body, ParsedBody)
    plain = _Plain()
    assert not isinstance(plain, Resumable) and not isinstance(plain, Assembling)
    assert resume_point(plain, body, [b"{}"]).blocker == "protocol"
    assert assembler(plain, body, Rewrite("m", "standard", "standard")) is None
