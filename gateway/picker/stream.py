"""One ``ext_proc`` stream: one HTTP request through Envoy, from its headers to its response's
end (``envoy.service.ext_proc.v3.ExternalProcessor/Process``).

Request body modes (the filter's ``processing_mode``, which Envoy announces in the first
message's ``protocol_config``):

- ``FULL_DUPLEX_STREAMED``: Envoy sends the headers and the body chunks without waiting; the
  picker keeps the body (up to ``server.max_body_bytes``: 413 past it, at once), decides at
  its end, then answers the headers with the pick and streams the upstream body back in
  chunks of at most 62,000 bytes;
- ``BUFFERED``: Envoy waits for the headers' answer (passed on unchanged), then sends the
  whole body (its own ``per_stream_buffer_limit_bytes`` bounds it); the pick comes with the
  body's answer;
- a request without a body is decided on its headers (its protocol then answers 400).

The request's headers are checked as soon as they come (``Picker.admit_head``: the path's
client API, 404; the key, 401; a ``content-length`` over ``server.max_body_bytes``, 413): a
refused request is answered on its headers and no byte of its body is kept.

The stream's messages come in one order: the request's headers, its body chunks up to the one
that ends it (or its trailers), the pick, then the response's headers, body and trailers. A
message that would start a second request or a second pick on the stream (request headers
again, request body after its end, response headers before the pick or twice) ends the stream
with gRPC ``FAILED_PRECONDITION`` (``OutOfOrder``); the pick made is finished once, as at every
stream's end.

A ``Content-Encoding`` body (gzip, deflate, br, zstd; all the header's field lines as one list,
like the proxy) is decoded as it arrives, large chunks off the event loop, with the
proxy's own decoder (``gateway.common.body_codings``: the decoded size bounded by
``server.max_body_bytes`` and the inflation bound, 413 past either, 400 for a corrupt stream,
415 for an unknown coding). The engine gets the decoded body (vLLM does not decode compressed
requests): ``content-encoding`` is removed and ``content-length`` set to the decoded size.

``STREAMED`` and ``BUFFERED_PARTIAL`` cannot carry a pick made on the whole body: they are
answered 500 with a message naming the setting. Responses: headers always (the served
endpoint and status go to the ledgers, the tier and replica headers to the client), body when
Envoy sends it (echoed in full-duplex mode, passed on otherwise; usage read on the way).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as pm
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from gateway.admit.auth import ApiKey
from gateway.admit.request import ClientRequest
from gateway.common.body_codings import BodyDecoder, body_decoder, decode_chunk
from gateway.errors import BodyTooLarge, GatewayError
from gateway.picker import messages as msg
from gateway.picker.decide import Pick, Picker
from gateway.picker.usage_tap import UsageTap
from gateway.protocols.base import Protocol
from gateway.protocols.error_shapes import OPENAI_ERRORS
from gateway.telemetry.record import RequestRecord

log = logging.getLogger("speedgate.picker")

FULL_DUPLEX = pm.ProcessingMode.FULL_DUPLEX_STREAMED
BUFFERED = pm.ProcessingMode.BUFFERED


class OutOfOrder(Exception):
    """A message the stream's order does not allow (module docstring); the stream ends with
    gRPC ``FAILED_PRECONDITION``."""


class PickerStream:
    """The state of one stream; ``run`` maps Envoy's messages to the picker's answers.
    ``phase``: ``headers`` (nothing yet), ``body`` (reading the request body), ``picked``,
    ``response`` (the response's headers seen)."""

    def __init__(self, picker: Picker) -> None:
        self.picker = picker
        self.phase = "headers"
        self.headers: dict[str, str] = {}
        self.request: ClientRequest | None = None
        self.rec: RequestRecord | None = None
        self.key: ApiKey | None = None
        self.subset: list[str] | None = None
        self.body_mode = FULL_DUPLEX
        self.response_mode = pm.ProcessingMode.NONE
        self.body = bytearray()
        self.decoder: BodyDecoder | None = None  # the body's Content-Encoding, if any
        self.pick: Pick | None = None
        self.tap: UsageTap | None = None
        self.done = False  # an immediate response was sent: nothing more to do

    async def run(
        self, requests: AsyncIterator[ep.ProcessingRequest]
    ) -> AsyncIterator[ep.ProcessingResponse]:
        """Answer each message of the stream; the request's ledgers are settled when the
        stream ends however it ends (response over, client gone, Envoy reset, a message out
        of order: ``OutOfOrder`` raised after)."""
        try:
            async for req in requests:
                for out in await self._on(req):
                    yield out
                if self.done:
                    return
        finally:
            if self.pick is not None:
                await self.picker.finish(self.pick, self.tap.usage() if self.tap else None)

    def _expect(self, kind: str, *phases: str) -> None:
        if self.phase not in phases:
            log.warning("ext_proc %s out of order (stream at %s) on %s: stream ended", kind,
                        self.phase, self.headers.get(":path"))
            raise OutOfOrder(f"{kind} not expected after {self.phase}")

    async def _on(self, req: ep.ProcessingRequest) -> list[ep.ProcessingResponse]:
        kind = req.WhichOneof("request")
        if req.HasField("protocol_config"):
            self.body_mode = req.protocol_config.request_body_mode
            self.response_mode = req.protocol_config.response_body_mode
        if kind == "request_headers":
            self._expect(kind, "headers")
            return await self._on_request_headers(req)
        if kind == "request_body":
            self._expect(kind, "body")
            return await self._on_request_body(req.request_body)
        if kind == "request_trailers":
            if self.pick is None:  # the body ended with trailers
                self._expect(kind, "body")
                out = await self._decide(trailers=True)
                return out if self.done else [*out, msg.continue_request_trailers()]
            return [msg.continue_request_trailers()]
        if kind == "response_headers":
            self._expect(kind, "picked")
            self.phase = "response"
            return await self._on_response_headers(req)
        if kind == "response_body":
            return self._on_response_body(req.response_body)
        if kind == "response_trailers":
            return [msg.continue_response_trailers()]
        return []

    async def _on_request_headers(self, req: ep.ProcessingRequest) -> list[ep.ProcessingResponse]:
        """The request's head: checked (path, key, declared size) before any body is kept;
        a request without a body is decided now."""
        pairs = msg.header_pairs(req.request_headers.headers)
        self.headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in pairs}
        self.subset = msg.subset_hint(req)
        self.phase = "body"
        path = self.headers.get(":path", "").split("?", 1)[0].rstrip("/")
        self.request = ClientRequest.from_headers(
            path, [(k, v) for k, v in pairs if not k.startswith(b":")])
        limit = self.picker.runtime.config.server.max_body_bytes
        try:
            self.rec, self.key = self.picker.admit_head(self.request)
            length = self.headers.get("content-length", "")
            if length.isdigit() and int(length) > limit:
                raise BodyTooLarge(f"request body of {length} bytes exceeds the limit of "
                                   f"{limit} bytes")
            if req.request_headers.end_of_stream:
                return await self._decide(trailers=False)
            # every content-encoding field line, as one list (RFC 9110)
            self.decoder = body_decoder(
                [v.decode("latin-1") for k, v in pairs if k == b"content-encoding"], limit)
        except GatewayError as e:
            return self._fail(e)
        if self.body_mode == BUFFERED:
            return [msg.continue_request_headers()]
        if self.body_mode != FULL_DUPLEX:
            return self._fail(GatewayError(
                "speedgate picker needs the ext_proc filter's request_body_mode "
                "FULL_DUPLEX_STREAMED or BUFFERED", status=500, code="picker_config"))
        return []

    async def _on_request_body(self, body: ep.HttpBody) -> list[ep.ProcessingResponse]:
        """Keep (decoding) one body chunk; decide at the body's end."""
        limit = self.picker.runtime.config.server.max_body_bytes
        try:
            self.body += (body.body if self.decoder is None
                          else await decode_chunk(self.decoder, body.body))
        except GatewayError as e:
            return self._fail(e)
        if len(self.body) > limit:
            return self._fail(GatewayError(
                f"request body larger than {limit} bytes", status=413,
                type="invalid_request_error", code="request_too_large"))
        if body.end_of_stream:
            return await self._decide(trailers=False)
        return []

    async def _decide(self, trailers: bool) -> list[ep.ProcessingResponse]:
        self.phase = "picked"
        if self.decoder is not None:
            try:
                self.body += self.decoder.finish()
            except GatewayError as e:
                return self._fail(e)
        raw = bytes(self.body)
        self.body = bytearray()
        assert self.request is not None and self.rec is not None
        try:
            self.pick = pick = await self.picker.pick(self.request.with_body(raw), self.key,
                                                      self.rec, self.subset)
        except GatewayError as e:
            return self._fail(e)
        except Exception:
            log.exception("picker error on %s", self.headers.get(":path"))
            return self._fail(GatewayError("internal picker error", code="internal_error"))
        remove = ["content-encoding"] if self.decoder is not None else []
        if self.body_mode == BUFFERED and raw:
            return [msg.request_body_pick(pick.destination, [], pick.payload, remove)]
        size = len(pick.payload) if raw else None
        out = [msg.request_headers_pick(pick.destination, [], size, remove)]
        if raw:
            out += msg.streamed_body(pick.payload, end=not trailers)
        return out

    def _protocol(self) -> Protocol | None:
        path = self.request.path if self.request is not None else ""
        return self.picker.protocols.get(path)

    def _fail(self, err: GatewayError) -> list[ep.ProcessingResponse]:
        """The error as the client API's own error response, sent by Envoy at once."""
        self.done = True
        protocol = self._protocol()
        shape = protocol.errors if protocol is not None else OPENAI_ERRORS
        rid = self.request.request_id if self.request is not None else ""
        headers = [(k.decode().lower(), v.decode()) for k, v in shape.headers(err)]
        if rid:
            headers.append(("x-request-id", rid))
        return [msg.immediate(shape.status(err), shape.body(err, rid), headers)]

    async def _on_response_headers(self, req: ep.ProcessingRequest) -> list[ep.ProcessingResponse]:
        headers = msg.header_map(req.response_headers.headers)
        pick = self.pick
        if pick is None:
            return [msg.continue_response_headers()]
        status = _status(headers.get(":status", ""))
        if not status:
            log.warning("unparseable response :status %r on %s", headers.get(":status"),
                        pick.rec.request_id)
        added = await self.picker.served(pick, msg.served_endpoint(req), status)
        self.tap = UsageTap(pick.protocol, headers.get("content-type", ""))
        return [msg.response_headers_with(added)]

    def _on_response_body(self, body: ep.HttpBody) -> list[ep.ProcessingResponse]:
        if self.tap is not None:
            self.tap.feed(body.body)
        if self.response_mode == FULL_DUPLEX:
            return [msg.streamed_response_body(body.body, body.end_of_stream)]
        return [msg.continue_response_body()]


def _status(value: str) -> int:
    """A response ``:status`` as an HTTP status code; 0 when it is not one (three digits)."""
    return int(value) if len(value) == 3 and value.isdigit() and value.isascii() else 0
