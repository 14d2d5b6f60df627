"""Engine errors map to OpenAI-shaped errors with the right status."""

import orjson

from gateway.errors import BodyTooLarge, NoHealthyReplica, parse_engine_error, stream_error


def test_new_vllm_shape_passes_through():
    body = orjson.dumps({"error": {"message": "bad prompt", "type": "BadRequestError",
                                   "param": "messages", "code": 400}})
    e = parse_engine_error(400, body)
    assert e.status == 400
    assert e.body()["error"] == {"message": "bad prompt", "type": "invalid_request_error",
                                 "param": "messages", "code": "bad_request"}


def test_old_flat_vllm_shape():
    body = orjson.dumps({"object": "error", "message": "The model `x` does not exist.",
                         "type": "NotFoundError", "param": None, "code": 404})
    e = parse_engine_error(404, body)
    assert e.status == 404
    assert e.message == "The model `x` does not exist."


def test_non_json_and_5xx():
    e = parse_engine_error(422, b"plain text")
    assert (e.status, e.message) == (422, "plain text")
    e = parse_engine_error(503, b'{"error":{"message":"overloaded"}}')
    assert e.status == 502 and "overloaded" in e.message and e.code == "upstream_error"
    assert parse_engine_error(429, b"").type == "rate_limit_error"


def test_error_shape_and_retry_after():
    e = NoHealthyReplica("none", retry_after_s=1.2)
    assert set(e.body()["error"]) == {"message", "type", "param", "code"}
    assert e.status == 503 and e.headers() == {"retry-after": "2", "x-should-retry": "true"}
    assert BodyTooLarge("x").status == 413


def test_in_stream_code_as_int_or_digit_string_alike():
    """vLLM sends ``code: 400``; some engines ``"400"``: the client sees the same error."""
    errs = [stream_error({"error": {"message": "bad", "type": "BadRequestError", "code": c}})
            for c in (400, "400")]
    assert [e.status for e in errs] == [400, 400]
    assert errs[0].body() == errs[1].body()
    assert errs[0].body()["error"]["code"] == "bad_request"
    named = stream_error({"error": {"message": "bad", "code": "context_length_exceeded"}})
    assert named.status == 502  # a named code is no status: the replica's, as before
