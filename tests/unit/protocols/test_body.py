"""Owned-field rewrite: only ``model`` and ``stream_options`` change; bytes otherwise kept."""

import orjson
import pytest

from gateway.errors import InvalidRequest
from gateway.protocols.body import parse_body, upstream_body


def test_model_spliced_bytes_otherwise_identical():
    raw = (
        b'{"model": "m",  "messages":[{"role":"user","content":"say \\"model\\": \\"m\\""}],'
        b'"top_k":5}'
    )
    out = upstream_body(parse_body(raw, "chat"), "served", add_usage=False)
    assert out == raw.replace(b'"model": "m"', b'"model": "served"')
    assert orjson.loads(out)["messages"][0]["content"] == 'say "model": "m"'


def test_nested_model_key_falls_back_to_reserialise():
    raw = b'{"model":"m","metadata":{"model":"m"},"messages":[{"role":"user","content":"x"}]}'
    out = orjson.loads(upstream_body(parse_body(raw, "chat"), "s", add_usage=False))
    assert out["model"] == "s" and out["metadata"] == {"model": "m"}


def test_add_usage_splices_stream_options():
    raw = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}'
    out = orjson.loads(upstream_body(parse_body(raw, "chat"), "m", add_usage=True))
    assert out["stream_options"] == {"include_usage": True}
    raw = b'{"model":"m","stream":true,"stream_options":{"x":1},"messages":[{"role":"user"}]}'
    out = orjson.loads(upstream_body(parse_body(raw, "chat"), "s", add_usage=True))
    assert out["stream_options"] == {"x": 1, "include_usage": True} and out["model"] == "s"


def test_same_name_and_no_usage_forwards_the_same_object():
    raw = b'{"model":"m","messages":[{"role":"user","content":"x"}]}'
    assert upstream_body(parse_body(raw, "chat"), "m", add_usage=False) is raw


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b"{not json", None),
        (b"[1,2]", None),
        (b'{"messages":[{"role":"user"}]}', "model"),
        (b'{"model":"m","messages":[]}', "messages"),
        (b'{"model":"m","messages":[1]}', "messages[0]"),
        (b'{"model":"m","messages":[{"role":"user"}],"stream":"yes"}', "stream"),
    ],
)
def test_invalid_bodies_are_400(raw, param):
    with pytest.raises(InvalidRequest) as ei:
        parse_body(raw, "chat")
    assert ei.value.status == 400 and ei.value.param == param


def test_completion_needs_prompt():
    with pytest.raises(InvalidRequest):
        parse_body(b'{"model":"m"}', "completion")
    assert parse_body(b'{"model":"m","prompt":"hi"}', "completion").doc["prompt"] == "hi"


def test_engine_priority_is_spliced_for_priority_scheduling_pools():
    raw = b'{"model":"m","messages":[{"role":"user","content":"x"}]}'
    out = upstream_body(parse_body(raw, "chat"), "s", add_usage=False, priority=2)
    assert out.startswith(b'{"priority":2,') and orjson.loads(out)["model"] == "s"
    # the gateway owns the field there: a client's own value is replaced
    raw = b'{"model":"m","priority":-100,"messages":[{"role":"user","content":"x"}]}'
    out = orjson.loads(upstream_body(parse_body(raw, "chat"), "m", add_usage=True, priority=1))
    assert out["priority"] == 1 and out["stream_options"] == {"include_usage": True}
    # without priority scheduling a client's field passes through untouched
    assert upstream_body(parse_body(raw, "chat"), "m", add_usage=False) is raw
