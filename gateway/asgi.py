"""Raw ASGI helpers for the hot path: read a bounded body, send a response, watch for the
client going away. No per-chunk allocation beyond the message dict ASGI requires."""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import MutableMapping
from types import TracebackType
from typing import Any

from gateway.common.body_codings import body_decoder, decode_chunk
from gateway.errors import (
    BodyTooLarge,
    ClientTimeout,
    GatewayError,
    InvalidRequest,
    UnsupportedMediaType,
)

Scope = MutableMapping[str, Any]  # as Starlette declares it (request.scope)
Message = dict[str, Any]


class ClientDisconnected(Exception):
    """The client closed its connection before the response was complete (recorded as 499)."""


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of header ``name`` (lower-case bytes), decoded as latin-1, or None."""
    for k, v in scope["headers"]:
        if k == name:
            return v.decode("latin-1")
    return None


def header_values(scope: Scope, name: bytes) -> list[str]:
    """Every value of header ``name`` (lower-case bytes) in the order received, latin-1."""
    return [v.decode("latin-1") for k, v in scope["headers"] if k == name]


#: Decoded bodies at least this long are joined in a worker thread (a copy of ~2-5 GB/s:
#: 4 MiB is ~1-2 ms on the event loop).
_JOIN_OFF_LOOP = 4 * 1024 * 1024


async def read_body(scope: Scope, receive: Any, limit: int) -> bytes:
    """Read the whole request body, refusing more than ``limit`` bytes.

    A ``Content-Encoding`` body (gzip, deflate, br, zstd; every field line of the header, as
    one list) is decoded as it arrives, large chunks off the event loop, the decoded size
    bounded by ``limit`` too (``gateway.common.body_codings``); the bytes returned are the
    decoded body.

    Raises ``UnsupportedMediaType`` (415) unless the content type is ``application/json`` or for
    an unsupported coding, ``BodyTooLarge`` (413) as soon as the body (or its
    ``Content-Length``, or its decoded size) exceeds ``limit``, ``InvalidRequest`` (400) for a
    corrupt coded body,
    ``InvalidRequest`` (400) for an empty body, ``ClientDisconnected`` if the client leaves,
    ``ClientTimeout`` (408) if the connection guard cut it for sending the body too slowly.
    """
    ctype = header(scope, b"content-type")
    if ctype is None or ctype.split(";", 1)[0].strip().lower() != "application/json":
        raise UnsupportedMediaType(
            "Content-Type must be application/json", param="content-type"
        )
    decoder = body_decoder(header_values(scope, b"content-encoding"), limit)
    length = header(scope, b"content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise BodyTooLarge(f"request body of {length} bytes exceeds the limit of {limit} bytes")
    parts: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            if scope.get("speedgate.client_timeout"):  # gateway.admit.connections
                raise ClientTimeout(f"request body not received in time ({size} bytes read)")
            raise ClientDisconnected()
        chunk = msg.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
            parts.append(chunk if decoder is None else await decode_chunk(decoder, chunk))
        if not msg.get("more_body", False):
            break
    if decoder is not None and size:
        parts.append(decoder.finish())
    if not size:
        raise InvalidRequest("request body is empty", code="invalid_json")
    if len(parts) == 1:
        return parts[0]
    if sum(map(len, parts)) >= _JOIN_OFF_LOOP:
        return await asyncio.to_thread(b"".join, parts)
    return b"".join(parts)


async def send_response(
    send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    """Send a complete JSON response with ``headers`` (lower-case byte pairs)."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def send_error(
    send: Any, err: GatewayError, headers: list[tuple[bytes, bytes]]
) -> None:
    """Send ``err`` as an OpenAI-shaped error response."""
    extra = [(k.encode(), v.encode()) for k, v in err.headers().items()]
    await send_response(send, err.status, err.to_bytes(), [*headers, *extra])


#: Scope key of a request's ``DisconnectSignal`` (set by ``admit.connections``' protocol).
DISCONNECT_KEY = "speedgate.disconnect"


class DisconnectSignal:
    """Fired by the server's connection protocol when a request's client goes away
    (``gateway.admit.connections``, in ``scope[DISCONNECT_KEY]``): lets ``DisconnectWatch``
    cancel the request without a watcher task per request. ``fire()`` runs the callback once."""

    __slots__ = ("callback", "fired")

    def __init__(self) -> None:
        self.callback: Any = None
        self.fired = False

    def fire(self) -> None:
        """The client's connection is lost: run the registered callback (once)."""
        if not self.fired:
            self.fired = True
            callback, self.callback = self.callback, None
            if callback is not None:
                callback()


class DisconnectWatch:
    """Async context manager: cancels the current task when the client disconnects and turns
    that cancellation into ``ClientDisconnected``, like ``asyncio.timeout`` turns its
    cancellation into ``TimeoutError``.

    With a ``DisconnectSignal`` in ``scope`` (the gateway's own server protocol) it registers a
    callback; otherwise (any other ASGI server) one watcher task per request reads ``receive``
    until ``http.disconnect``, so the request body must have been read already.
    """

    __slots__ = ("_receive", "_signal", "_task", "_watcher", "disconnected")

    def __init__(self, receive: Any, scope: Scope | None = None) -> None:
        self._receive = receive
        self.disconnected = False
        self._task: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._signal: DisconnectSignal | None = (
            scope.get(DISCONNECT_KEY) if scope is not None else None
        )

    async def __aenter__(self) -> DisconnectWatch:
        self._task = asyncio.current_task()
        signal = self._signal
        if signal is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())
        elif signal.fired:  # gone already: cancelled at the next await
            self._gone()
        else:
            signal.callback = self._gone
        return self

    async def _watch(self) -> None:
        while True:
            msg = await self._receive()
            if msg["type"] == "http.disconnect":
                break
        self._gone()

    def _gone(self) -> None:
        self.disconnected = True
        if self._task is not None:
            self._task.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._task is not None
        # a cancelled watcher keeps its CancelledError, whose traceback holds ``_watch``'s
        # frame and so this object, and the signal holds ``_gone``: dropping the references
        # here leaves no reference cycle for the cyclic GC (telemetry.gcstats)
        watcher, task, self._watcher, self._task = self._watcher, self._task, None, None
        if self._signal is not None:
            self._signal.callback = None
            self._signal = None
        if watcher is not None:
            watcher.cancel()
        if self.disconnected and exc_type is asyncio.CancelledError:
            if task.uncancel() == 0:
                raise ClientDisconnected() from None


_REQUEST_ID_OK = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def request_id(scope: Scope) -> str:
    """The client's ``x-request-id`` when it is a sane token (≤ 128 of ``[A-Za-z0-9._:-]``),
    else 32 random hex digits (128 bits, like a UUID4's hex; ``secrets.token_hex`` costs a
    third of ``uuid.uuid4().hex``)."""
    for k, v in scope["headers"]:
        if k == b"x-request-id":
            return checked_request_id(v)
    return secrets.token_hex(16)


def checked_request_id(value: bytes | None) -> str:
    """``value`` (an ``x-request-id`` header's bytes) when it is a sane token, else a fresh
    id (``request_id``)."""
    if value is not None:
        rid = value.decode("latin-1")
        if _REQUEST_ID_OK.match(rid):
            return rid
    return secrets.token_hex(16)


class RequestIdMiddleware:
    """For the FastAPI routes: a request id in ``scope["speedgate.request_id"]`` and an
    ``x-request-id`` header on every response (the hot path sets its own)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id(scope)
        scope["speedgate.request_id"] = rid
        rid_header = (b"x-request-id", rid.encode())

        async def send_with_id(msg: dict[str, Any]) -> None:
            if msg["type"] == "http.response.start":
                msg["headers"] = [*msg.get("headers", ()), rid_header]
            await send(msg)

        await self.app(scope, receive, send_with_id)
