"""An engine's overload, in every form an Anthropic- or OpenAI-compatible server sends it, is
``UpstreamOverloaded`` (503; Anthropic's 529 ``overloaded_error``), never a 500 ``api_error``."""

from __future__ import annotations

import orjson
import pytest

from gateway.errors import EngineClientError, UpstreamOverloaded, parse_engine_error, stream_error
from gateway.protocols.error_shapes import ANTHROPIC_ERRORS, OPENAI_ERRORS

ANTHROPIC_OVERLOAD = {"type": "error", "error": {"type": "overloaded_error",
                                                 "message": "Overloaded"}}


@pytest.mark.parametrize("err", [
    parse_engine_error(529, orjson.dumps(ANTHROPIC_OVERLOAD)),
    parse_engine_error(529, b"upstream busy"),
    parse_engine_error(500, orjson.dumps(ANTHROPIC_OVERLOAD)),
    stream_error({"error": {"code": 529, "message": "busy"}}),
    stream_error(ANTHROPIC_OVERLOAD),
], ids=["http-529", "http-529-text", "http-500-overloaded-type", "in-stream-code",
        "in-stream-type"])
def test_r3_overload_is_upstream_overloaded(err: EngineClientError) -> None:
    assert isinstance(err, UpstreamOverloaded) and err.status == 503
    assert ANTHROPIC_ERRORS.status(err) == 529
    assert orjson.loads(ANTHROPIC_ERRORS.body(err))["error"]["type"] == "overloaded_error"
    assert OPENAI_ERRORS.status(err) == 503
    assert orjson.loads(OPENAI_ERRORS.body(err))["error"]["code"] == "upstream_overloaded"


def test_a_client_error_named_overloaded_stays_the_clients() -> None:
    err = parse_engine_error(400, orjson.dumps({"error": {"type": "overloaded_error",
                                                          "message": "m"}}))
    assert not isinstance(err, UpstreamOverloaded) and err.status == 400
