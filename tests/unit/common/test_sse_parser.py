"""The SSE parser works on whole events whatever the byte cuts and line endings."""

from gateway.common.sse import SSEParser, encode_event

STREAM = (
    'data: {"a":"안녕하세요 👋"}\n\n'
    ": keepalive\n\n"
    "event: ping\ndata: 1\n\n"
    "data: line1\ndata: line2\n\n"
    "data:nospace\n\n"
    "data: [DONE]\n\n"
).encode()


def _events(chunks):
    p = SSEParser()
    out = []
    for c in chunks:
        out.extend(p.feed(c))
    out.extend(p.close())
    return out, p


def _summary(events):
    return [(e.data, e.event, e.comment) for e in events]


EXPECTED = [
    ('{"a":"안녕하세요 👋"}'.encode(), None, False),
    (None, None, True),
    (b"1", b"ping", False),
    (b"line1\nline2", None, False),
    (b"nospace", None, False),
    (b"[DONE]", None, False),
]


def test_whole_stream_in_one_feed():
    events, p = _events([STREAM])
    assert _summary(events) == EXPECTED
    assert not p.has_partial


def test_every_byte_cut_gives_same_events():
    for cut in range(1, len(STREAM)):
        events, _ = _events([STREAM[:cut], STREAM[cut:]])
        assert _summary(events) == EXPECTED, cut


def test_byte_by_byte_keeps_utf8_intact():
    events, _ = _events([bytes([b]) for b in STREAM])
    assert events[0].data.decode("utf-8") == '{"a":"안녕하세요 👋"}'


def test_crlf_and_cr_line_endings():
    crlf = STREAM.replace(b"\n", b"\r\n")
    for cut in range(1, len(crlf), 7):
        events, _ = _events([crlf[:cut], crlf[cut:]])
        assert _summary(events) == EXPECTED
    cr = STREAM.replace(b"\n", b"\r")
    events, _ = _events([cr[:10], cr[10:]])
    assert _summary(events) == EXPECTED


def test_crlf_pair_split_across_feeds():
    events, _ = _events([b"data: x\r", b"\n\r", b"\n"])
    assert _summary(events) == [(b"x", None, False)]


def test_unfinished_event_is_partial():
    p = SSEParser()
    events = p.feed(b'data: {"x": 1}\n')
    assert events == []
    assert p.has_partial


def test_done_property():
    events, _ = _events([b"data: [DONE]\n\n"])
    assert events[0].is_done


def test_encode_event_roundtrip_multiline():
    framed = encode_event(b"a\nb")
    assert framed == b"data: a\ndata: b\n\n"
    events, _ = _events([framed])
    assert events[0].data == b"a\nb"


def test_one_event_per_read_takes_the_same_events():
    """Each event in a read of its own (an engine writing token by token: the parser's
    inline path), also a lone blank line and a ``\\r\\n`` event between them."""
    reads = [e + b"\n\n" for e in STREAM.split(b"\n\n") if e]
    events, p = _events([b"\n\n", *reads[:2], b"data: x\r\n\r\n", *reads[2:]])
    want = [*EXPECTED[:2], (b"x", None, False), *EXPECTED[2:]]
    assert _summary(events) == want
    assert not p.has_partial
