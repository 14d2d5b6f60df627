"""Picker mode decodes ``Content-Encoding`` request bodies as the proxy does
(``gateway.common.body_codings``) and forwards the decoded body, its coding header removed;
an unknown coding is the proxy's 415."""

from __future__ import annotations

import gzip
import json

from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from tests.unit.picker.test_picker_grpc import (  # noqa: F401  (picker: the fixture)
    _body,
    _chat,
    _destination,
    _headers,
    _process,
    picker,
)


def _encoded_headers(coding: str) -> ep.ProcessingRequest:
    req = _headers()
    req.request_headers.headers.headers.add(key="content-encoding", raw_value=coding.encode())
    return req


async def test_picker_gzip_body_is_picked_as_the_proxy_accepts_it(picker) -> None:  # noqa: F811
    """A gzip body is decoded before it is parsed; the engine gets the decoded JSON with
    ``content-encoding`` removed and ``content-length`` its decoded size."""
    _, stub, _ = picker
    out = await _process(stub, [_encoded_headers("gzip"), _body(gzip.compress(_chat()))])
    assert not any(r.HasField("immediate_response") for r in out), out[-1]
    header, meta = _destination(out[0])
    assert header and header == meta
    mutation = out[0].request_headers.response.header_mutation
    assert "content-encoding" in mutation.remove_headers
    sent = b"".join(r.request_body.response.body_mutation.streamed_response.body
                    for r in out[1:] if r.HasField("request_body"))
    assert json.loads(sent)["messages"]
    length = next(h.header.raw_value for h in mutation.set_headers
                  if h.header.key == "content-length")
    assert int(length) == len(sent)


async def test_picker_unknown_content_encoding_is_415(picker) -> None:  # noqa: F811
    """An unknown coding is answered 415 ``unsupported_media_type`` in the API's shape."""
    _, stub, _ = picker
    out = await _process(stub, [_encoded_headers("lzma"), _body(_chat())])
    last = out[-1]
    assert last.HasField("immediate_response")
    assert last.immediate_response.status.code == 415, last.immediate_response
    assert json.loads(last.immediate_response.body)["error"]["code"] == "unsupported_media_type"


async def test_picker_reads_every_content_encoding_field_line(picker) -> None:  # noqa: F811
    """Two field lines, ``gzip`` then ``br``: one list (RFC 9110), the body br(gzip(json))
    decoded last coding first, as the proxy reads it (it was read as its last line only)."""
    import brotli

    _, stub, _ = picker
    req = _encoded_headers("gzip")
    req.request_headers.headers.headers.add(key="content-encoding", raw_value=b"br")
    out = await _process(stub, [req, _body(brotli.compress(gzip.compress(_chat())))])
    assert not any(r.HasField("immediate_response") for r in out), out[-1]
    sent = b"".join(r.request_body.response.body_mutation.streamed_response.body
                    for r in out[1:] if r.HasField("request_body"))
    assert json.loads(sent)["messages"]
