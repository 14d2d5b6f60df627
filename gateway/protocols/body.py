"""Request bodies: lenient validation and the rewrite of the fields the gateway owns.

The gateway forwards the bytes it received, changing only ``model`` (to the engine's served
name) and, for streams, ``stream_options.include_usage`` (so the engine reports usage). Long
agent conversations are several MiB; splicing the two fields into the received bytes avoids
re-serialising them. When a splice is not provably exact (the ``model`` key appears more than
once at any depth, the value is escaped differently, ``stream_options`` already exists), the body
is re-serialised from the parsed document instead: same JSON value, one extra copy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import InvalidRequest

# A JSON string token can only start after '{', ',', '[', ':' or whitespace; inside a string an
# unescaped quote cannot occur. So a match is a real "model" key somewhere in the document.
_MODEL_KEY = re.compile(rb'(?<=[{,\s])"model"\s*:\s*')
_STREAM_KEY = re.compile(rb'(?<=[{,\s])"stream"\s*:\s*')


@dataclass(slots=True)
class ParsedBody:
    """A validated request body. ``doc`` is the parsed JSON object, ``raw`` the bytes received.

    ``view``: the conversation in chat shape (``messages``, ``tools``, ``max_tokens``) for
    routing keys, token estimates and the auto tier, when the API's own shape differs (None:
    ``doc`` is that shape already; read it through ``conversation``). ``session_hint``: a
    session key the protocol derived (e.g. a Responses chain), used when the client sent no
    ``x-session-id``, for routing affinity. ``chain_root``: the first response id of the
    Responses chain the request belongs to (its own id on a first turn that will be stored),
    the session of a request that names none (``gateway.admit.session``). ``ext``: the
    protocol's own per-request state."""

    raw: bytes
    doc: dict[str, Any]
    view: dict[str, Any] | None = None
    session_hint: str | None = None
    chain_root: str | None = None
    ext: Any = None
    assemble: bool = False  # a JSON answer assembled from an upstream stream (staged timeouts)

    @property
    def upstream_stream(self) -> bool:
        """True when the engine is asked to stream: the client's stream, or a JSON answer the
        gateway assembles (``assemble``) so that TTFT, stall and resume apply to it too."""
        return self.stream or self.assemble

    @property
    def conversation(self) -> dict[str, Any]:
        """The chat-shaped document for routing and estimates (``view`` or ``doc``)."""
        return self.view if self.view is not None else self.doc

    @property
    def stream(self) -> bool:
        """True when the client asked for SSE streaming (``"stream": true``)."""
        return self.doc.get("stream") is True

    @property
    def client_wants_usage(self) -> bool:
        """True when a stream request set ``stream_options.include_usage``."""
        opts = self.doc.get("stream_options")
        return isinstance(opts, dict) and opts.get("include_usage") is True


def load_json_object(raw: bytes) -> dict[str, Any]:
    """``raw`` parsed as a JSON object (every API's request body). Raises ``InvalidRequest``
    (400, ``invalid_json``) for invalid JSON or any other JSON value."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise InvalidRequest(
            f"request body is not valid JSON: {e.msg}", code="invalid_json"
        ) from None
    if not isinstance(doc, dict):
        raise InvalidRequest("request body must be a JSON object", code="invalid_json")
    return doc


def parse_body(raw: bytes, kind: str) -> ParsedBody:
    """Parse and leniently validate an OpenAI request body.

    ``kind`` is ``"chat"`` (``messages`` must be a non-empty list of objects) or ``"completion"``
    (``prompt`` must be present). Unknown fields are kept untouched. Raises ``InvalidRequest``
    (400) with ``param`` naming the field.
    """
    doc = load_json_object(raw)
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' must be a non-empty string", param="model")
    if kind == "chat":
        msgs = doc.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise InvalidRequest("'messages' must be a non-empty array", param="messages")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise InvalidRequest(
                    f"messages[{i}] must be an object with a string 'role'",
                    param=f"messages[{i}]",
                )
    elif "prompt" not in doc:
        raise InvalidRequest("'prompt' is required", param="prompt")
    stream = doc.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean", param="stream")
    opts = doc.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise InvalidRequest("'stream_options' must be an object", param="stream_options")
    if isinstance(opts, dict) and not isinstance(opts.get("include_usage", False), bool):
        raise InvalidRequest(
            "'stream_options.include_usage' must be a boolean",
            param="stream_options.include_usage",
        )
    return ParsedBody(raw, doc)


def upstream_body(
    body: ParsedBody, served_model: str, *, add_usage: bool, priority: int | None = None,
    stream: bool = False,
) -> bytes:
    """The bytes to send upstream: ``model`` set to ``served_model``; with ``add_usage`` (the
    gateway asks for usage the client did not), ``stream_options.include_usage`` set to true
    and a ``continuous_usage_stats`` of the client's set to false; with ``priority`` (engines
    running vLLM's priority scheduling), vLLM's ``priority`` field set to it (the gateway owns
    it there: a client's own value would let it jump the band order). Everything else as
    received. ``stream``: the engine is asked to stream (``"stream": true`` set) although the
    client did not (a JSON answer the gateway assembles)."""
    raw = body.raw
    model = body.doc["model"]
    if priority is not None and "priority" in body.doc:
        return _reserialise(body, served_model, add_usage, priority, stream)
    if stream and body.doc.get("stream") is not True:
        spliced = _splice_stream(raw, "stream" in body.doc)
        if spliced is None:
            return _reserialise(body, served_model, add_usage, priority, stream)
        raw = spliced
    if model != served_model:
        spliced = _splice_model(raw, model, served_model)
        if spliced is None:
            return _reserialise(body, served_model, add_usage, priority, stream)
        raw = spliced
    if add_usage:
        if "stream_options" in body.doc:
            return _reserialise(body, served_model, add_usage, priority, stream)
        start = raw.index(b"{") + 1
        raw = raw[:start] + b'"stream_options":{"include_usage":true},' + raw[start:]
    if priority is not None:
        start = raw.index(b"{") + 1
        raw = raw[:start] + b'"priority":' + str(int(priority)).encode() + b"," + raw[start:]
    return raw


def splice_model(raw: bytes, old: str, new: str) -> bytes | None:
    """``raw`` with the one top-level-or-nested ``"model"`` value ``old`` replaced by ``new``,
    or None when that is not provably exact (several ``model`` keys, escaped differently)."""
    return _splice_model(raw, old, new)


def _splice_model(raw: bytes, old: str, new: str) -> bytes | None:
    matches = list(_MODEL_KEY.finditer(raw))
    if len(matches) != 1:
        return None
    value_start = matches[0].end()
    old_token = orjson.dumps(old)
    if raw[value_start : value_start + len(old_token)] != old_token:
        return None
    return raw[:value_start] + orjson.dumps(new) + raw[value_start + len(old_token) :]


def _splice_stream(raw: bytes, present: bool) -> bytes | None:
    """``raw`` with ``"stream": true``: inserted first when the key is absent, the one
    ``stream`` key's value replaced when it is ``false`` or ``null``; None when not provably
    exact (several ``stream`` keys at any depth)."""
    if not present:
        start = raw.index(b"{") + 1
        return raw[:start] + b'"stream":true,' + raw[start:]
    matches = list(_STREAM_KEY.finditer(raw))
    if len(matches) != 1:
        return None
    at = matches[0].end()
    for old in (b"false", b"null"):
        if raw[at : at + len(old)] == old:
            return raw[:at] + b"true" + raw[at + len(old) :]
    return None


def _reserialise(
    body: ParsedBody, served_model: str, add_usage: bool, priority: int | None = None,
    stream: bool = False,
) -> bytes:
    doc = dict(body.doc)
    doc["model"] = served_model
    if stream:
        doc["stream"] = True
    if priority is not None:
        doc["priority"] = int(priority)
    if add_usage:
        opts = dict(doc.get("stream_options") or {})
        opts["include_usage"] = True
        if opts.get("continuous_usage_stats"):
            # vLLM sends usage on every chunk only with include_usage, which the client did not
            # ask for: without it the client would get none, so neither does the engine send it
            opts["continuous_usage_stats"] = False
        doc["stream_options"] = opts
    return orjson.dumps(doc)
