"""The access log: text line kept, one JSON line per request, no text or key."""

import io
import json
import logging
import re

import pytest

from gateway.common.usage import Usage
from gateway.telemetry.access_log import (
    RequestRecord,
    access_log,
    configure_access_log,
    format_json,
    log_access,
    log_request,
)


def _rec():
    rec = RequestRecord(request_id="req-1", path="/v1/chat/completions", model="m",
                        asked_tier="auto", stream=True)
    rec.served_tier, rec.replica = "fast", "http://10.0.0.5:8000"
    rec.status, rec.outcome = 200, "ok"
    rec.attempts, rec.retries = 2, ["fast:http-503"]
    rec.usage = Usage(prompt=2006, completion=300, cached=1920)
    rec.cost_usd, rec.ttft_s, rec.e2e_s, rec.queue_s = 0.000878, 0.123456, 2.5, 0.0004
    rec.key_id, rec.session_id, rec.trace_id = "team-a", "sess-9", "ab" * 16
    return rec


def test_json_line_fields():
    line = format_json(_rec())
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["request_id"] == "req-1" and doc["trace_id"] == "ab" * 16
    assert doc["key_id"] == "team-a" and doc["session_id"] == "sess-9"
    assert doc["tier_asked"] == "auto" and doc["tier"] == "fast"
    assert doc["replica"] == "http://10.0.0.5:8000" and doc["status"] == 200
    assert doc["attempts"] == 2 and doc["retries"] == ["fast:http-503"]
    tokens = (doc["prompt_tokens"], doc["cached_tokens"], doc["completion_tokens"])
    assert tokens == (2006, 1920, 300)
    assert doc["cost_usd"] == 0.000878 and doc["ttft_s"] == 0.1235 and doc["e2e_s"] == 2.5
    assert doc["usage_estimated"] is False and doc["ts"].endswith("+00:00")
    assert not {"prompt", "messages", "completion", "content", "api_key"} & set(doc)


def test_json_line_of_a_failed_request_without_usage():
    rec = RequestRecord(request_id="r2", path="/v1/completions")
    rec.status, rec.outcome = 400, "invalid_request_error"
    doc = json.loads(format_json(rec))
    assert doc["prompt_tokens"] is None and doc["ttft_s"] is None and doc["cost_usd"] is None


def test_configure_json_writes_bare_lines_and_text_still_works(caplog):
    stream = io.StringIO()
    try:
        configure_access_log("json", stream)
        log_access(_rec(), "json")
        log_access(_rec(), "json")
        lines = stream.getvalue().splitlines()
        assert len(lines) == 2 and all(json.loads(x)["request_id"] == "req-1" for x in lines)
    finally:
        configure_access_log("text")
    assert access_log.propagate
    with caplog.at_level(logging.INFO, logger="speedgate.access"):
        log_request(_rec())
        log_access(_rec())
    assert len(caplog.records) == 2
    assert "request_id=req-1" in caplog.records[0].getMessage()
    assert stream.getvalue().count("\n") == 2  # the JSON handler is gone


_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S*)(?: |$)')


def _fields(line: str) -> list[tuple[str, str]]:
    """``key=value`` tokens of a text access line; a quoted value decoded as JSON. Asserts the
    tokens cover the whole line (nothing between or after them)."""
    out, pos = [], 0
    for m in _FIELD.finditer(line):
        assert m.start() == pos, f"stray text at {pos}: {line[pos:m.start()]!r}"
        value = m.group(2)
        out.append((m.group(1), json.loads(value) if value.startswith('"') else value))
        pos = m.end()
    assert pos == len(line)
    return out


@pytest.mark.parametrize("session_id", [
    "a key_id=admin status=200",
    'x" key_id="admin',
    "evil\nrequest_id=forged key_id=admin",
    "tab\tand\u2028line separator and \\ backslash",
])
def test_text_access_log_cannot_be_forged(caplog, session_id):
    """Fixed: "the text access log can be forged": a client-supplied value (here the
    ``x-session-id``, also the engine's error code in ``outcome``) can add neither a field nor a
    line; it reads back exactly."""
    rec = _rec()
    rec.session_id = session_id
    rec.outcome = "bad code=1"
    with caplog.at_level(logging.INFO, logger="speedgate.access"):
        log_request(rec)
    line = caplog.records[0].getMessage()
    assert "\n" not in line and "\u2028" not in line
    fields = _fields(line)
    keys = [k for k, _ in fields]
    assert len(keys) == len(set(keys)) and keys.count("key_id") == 1
    got = dict(fields)
    assert got["session_id"] == session_id and got["key_id"] == "team-a"
    assert got["status"] == "200" and got["outcome"] == "bad code=1"
    assert got["request_id"] == "req-1" and got["replica"] == "http://10.0.0.5:8000"


def test_plain_values_stay_bare():
    from gateway.telemetry.access_log import quote_value

    assert quote_value("model/fast/0") == "model/fast/0" and quote_value(None) == "None"
    assert quote_value("fast:http-503,standard:ok") == "fast:http-503,standard:ok"
    assert quote_value("") == '""' and quote_value("a b") == '"a b"'


def test_resumes_in_the_json_line_and_the_text_line(caplog):
    rec = _rec()
    rec.resumes = [{"reason": "broken-stream", "from_tier": "fast", "carried_chars": 120,
                    "outcome": "resumed", "to_tier": "standard"}]
    doc = json.loads(format_json(rec))
    assert doc["resumes"] == rec.resumes  # the tier that finished is ``tier``
    with caplog.at_level(logging.INFO, logger="speedgate.access"):
        log_request(rec)
    assert "resumes=1" in caplog.text
