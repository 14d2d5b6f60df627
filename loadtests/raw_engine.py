"""A raw zero-delay OpenAI-compatible engine for capacity benchmarks (not the simulator).

The engine simulator (``engines.sim``) models a vLLM engine (scheduler, KV cache, timing) and
costs more CPU per request than the gateway itself, so it caps any "direct" figure measured
against it. This server does almost nothing: an ``asyncio.Protocol`` on uvloop parses HTTP/1.1
(keep-alive, pipelining, ``Content-Length`` bodies) and writes pre-serialised answers:

- ``POST`` with ``"stream": true``: a chunked ``text/event-stream`` of ``--chunks`` chat
  completion chunks (the first with the role, the last with ``finish_reason: "stop"``), a usage
  chunk (``"choices": []``) when the body asks ``"include_usage": true``, then ``[DONE]``; all
  in one write, as a fast engine's burst arrives;
- any other ``POST``: one ``chat.completion`` JSON document with usage;
- a ``POST`` whose body has ``"user": "hold"``: the stream's headers and role chunk, then
  nothing until the client closes the connection (open-stream memory measurements);
- a ``POST`` whose body has ``"user": "reset"``: the stream's headers and role chunk, then the
  connection closed mid-body (an engine that dies mid-stream: the client reads a cut chunked
  body);
- ``GET /health`` (and any other ``GET``): ``200`` empty.

The body is never parsed as JSON: the flags are byte patterns (``"stream":true`` with
optional whitespace). Answers carry ``--served-model-name`` as ``model``.

Run: ``python -m loadtests.raw_engine --port 0 --port-file PATH`` (binds the port, writes it to
``PATH``; ``engines.procs.write_port_file``).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import socket

import orjson

from engines.procs import die_with_parent, write_port_file

_STREAM = re.compile(rb'"stream"\s*:\s*true')
_USAGE = re.compile(rb'"include_usage"\s*:\s*true')
_HOLD = re.compile(rb'"user"\s*:\s*"hold"')
_RESET = re.compile(rb'"user"\s*:\s*"reset"')
_CREATED = 1_700_000_000


def _chunk(model: str, i: int, last: int) -> bytes:
    delta: dict[str, str] = {"content": f"tok{i} "}
    if i == 0:
        delta = {"role": "assistant", **delta}
    doc = {
        "id": "chatcmpl-raw", "object": "chat.completion.chunk", "created": _CREATED,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None,
                     "finish_reason": "stop" if i == last else None}],
    }  # fmt: skip
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def _usage(chunks: int) -> dict[str, int]:
    return {"prompt_tokens": 24, "completion_tokens": chunks, "total_tokens": 24 + chunks}


def _http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Answers:
    """The pre-serialised responses (whole HTTP messages) for one served model name."""

    def __init__(self, model: str, chunks: int, pace_s: float = 0.0) -> None:
        self.pace_s = pace_s
        each = [_chunk(model, i, chunks - 1) for i in range(chunks)]
        events = b"".join(each)
        usage = b"data: " + orjson.dumps({
            "id": "chatcmpl-raw", "object": "chat.completion.chunk", "created": _CREATED,
            "model": model, "choices": [], "usage": _usage(chunks),
        }) + b"\n\n"  # fmt: skip
        done = b"data: [DONE]\n\n"
        head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                b"transfer-encoding: chunked\r\n\r\n")
        self.stream = head + _http_chunk(events + done) + b"0\r\n\r\n"
        self.stream_usage = head + _http_chunk(events + usage + done) + b"0\r\n\r\n"
        # paced (``--pace-s``): one write per event, as an engine decoding token by token
        writes = [_http_chunk(e) for e in each]
        writes[0] = head + writes[0]
        self.paced = [*writes, _http_chunk(done) + b"0\r\n\r\n"]
        self.paced_usage = [*writes, _http_chunk(usage), _http_chunk(done) + b"0\r\n\r\n"]
        self.hold = head + _http_chunk(_chunk(model, 0, chunks))
        body = orjson.dumps({
            "id": "chatcmpl-raw", "object": "chat.completion", "created": _CREATED,
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant",
                                                 "content": "tok " * chunks},
                         "logprobs": None, "finish_reason": "stop"}],
            "usage": _usage(chunks),
        })  # fmt: skip
        self.json = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(body), body))
        self.ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
        self.bad = (b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n"
                    b"connection: close\r\n\r\n")


class RawHTTP(asyncio.Protocol):
    """One client connection: parse requests from the buffer, answer each in order."""

    __slots__ = ("answers", "buf", "holding", "transport")

    def __init__(self, answers: Answers) -> None:
        self.answers = answers
        self.buf = b""
        self.holding = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        transport = self.transport
        assert transport is not None
        while not self.holding:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buf[:end]
            length = 0
            lower = head.lower()
            at = lower.find(b"\r\ncontent-length:")
            if at >= 0:
                stop = lower.find(b"\r\n", at + 2)
                try:
                    length = int(lower[at + 17: stop if stop >= 0 else None])
                except ValueError:
                    transport.write(self.answers.bad)
                    transport.close()
                    return
            if len(buf) < end + 4 + length:
                break
            body = buf[end + 4: end + 4 + length]
            buf = buf[end + 4 + length:]
            answer = self._answer(head, body)
            if isinstance(answer, list):  # paced: the rest of the buffer waits for its end
                self.holding = True
                self.buf = buf
                self._pace(answer, 0)
                return
            transport.write(answer)
        self.buf = buf

    def _pace(self, writes: list[bytes], i: int) -> None:
        """Write ``writes[i]``, the next one ``pace_s`` later; after the last, go on with the
        requests buffered meanwhile."""
        if self.transport is None:
            return
        self.transport.write(writes[i])
        if i + 1 < len(writes):
            asyncio.get_running_loop().call_later(self.answers.pace_s, self._pace, writes, i + 1)
            return
        self.holding = False
        if self.buf:
            buf, self.buf = self.buf, b""
            self.data_received(buf)

    def _answer(self, head: bytes, body: bytes) -> bytes | list[bytes]:
        a = self.answers
        if not head.startswith(b"POST "):
            return a.ok
        if _RESET.search(body) is not None:
            self.holding = True  # no further request on this connection
            asyncio.get_running_loop().call_soon(self._cut)
            return a.hold
        if _STREAM.search(body) is None:
            return a.json
        if _HOLD.search(body) is not None:
            self.holding = True  # until the client closes the connection
            return a.hold
        usage = _USAGE.search(body) is not None
        if a.pace_s > 0:
            return a.paced_usage if usage else a.paced
        return a.stream_usage if usage else a.stream

    def _cut(self) -> None:
        """Close the connection after what was written (mid-body: a cut stream)."""
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def serve(host: str, port: int, port_file: str | None, answers: Answers) -> None:
    """Listen on ``host``:``port`` (0: any free port), write the bound port to ``port_file``,
    serve until cancelled."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: RawHTTP(answers), host, port, backlog=4096)
    bound = server.sockets[0].getsockname()[1]
    if port_file:
        write_port_file(port_file, bound)
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file", default=None)
    p.add_argument("--served-model-name", default="raw")
    p.add_argument("--chunks", type=int, default=20, help="chat chunks per stream (≥ 1)")
    p.add_argument("--pace-s", type=float, default=0.0,
                   help="seconds between a stream's events, one write each (0: one write)")
    a = p.parse_args()
    if a.chunks < 1:
        p.error("--chunks must be at least 1")
    die_with_parent()
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        runner(serve(a.host, a.port, a.port_file, Answers(a.served_model_name, a.chunks, a.pace_s)))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
