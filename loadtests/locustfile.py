"""Locust users for any OpenAI-compatible server: single-turn chats and long agent sessions.

Method: each user sends ``POST {host}/v1/chat/completions`` with ``Authorization: Bearer
--api-key`` (the speedgate gateway, one vLLM server, another gateway: anything that speaks the
OpenAI API). Requests stream by default (``stream_options.include_usage`` on, so the last chunk
carries ``usage`` with ``prompt_tokens_details.cached_tokens`` where the engine reports it).

- ``ChatUser``: single-turn chats, prompt sizes drawn from ``--prompt-sizes`` (tokens, about one
  word each), a random nonce first so that users share no prefix; ``--stream-ratio`` of them
  stream.
- ``AgentSessionUser``: one long session at a time: a shared system prompt + tool definitions,
  ``--min-turns``..``--max-turns`` turns; each turn appends the assistant's reply, an assistant
  tool call and a tool result of ``--tool-tokens`` tokens, then waits ``--think-time`` seconds.
  ``--session-header-ratio`` of the sessions send ``x-session-id`` (the rest rely on prefix
  hashing). A session ends early at ``--max-context-tokens``.
- Tier mix ``--tier-mix standard=1,fast=1,auto=1`` (weights); the tier is asked for with
  ``--tier-via header`` (``x-speedgate-tier``), ``service_tier`` (OpenAI field: priority/default/
  auto) or ``none`` (plain OpenAI requests, for servers without tiers).

Every streamed request fires locust request events besides the POST itself (request_type, name):
``TTFT`` (request sent -> first content chunk, ms), ``ITL`` (one event per gap between content
chunks, ms), ``E2E`` (request sent -> ``[DONE]``, ms) and ``TOK/S`` (output tokens per second
after the first token, reported in the response-time field) with name = the tier that served
(``x-speedgate-tier`` response header, else the tier asked for). ``--samples-file PATH`` also
writes one JSON line per request (tier asked/served, ttft, itl list, e2e, tokens, cached tokens,
session turn) for the report's plots (``loadtests/run_loadtest.py``).

Run (web UI, or headless)::

    .venv/bin/locust -f loadtests/locustfile.py --host http://127.0.0.1:8080 --model mymodel
    .venv/bin/locust -f loadtests/locustfile.py --headless -u 20 -r 5 -t 60s \\
        --host http://127.0.0.1:8080 --tier-mix standard=2,fast=1 AgentSessionUser
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import uuid
from typing import Any

from locust import HttpUser, events, task

try:
    import orjson

    _loads = orjson.loads
except ImportError:  # any environment with locust works; orjson is only faster
    _loads = json.loads

TIERS = ("standard", "fast", "auto")
SERVICE_TIER = {"standard": "default", "fast": "priority", "auto": "auto"}
WORDS = (
    "build log test deploy cache token stream replica gateway latency queue batch kernel "
    "request session agent tool result error retry budget tier model prompt decode prefill "
    "config health metric trace span pool route hash block memory python async event loop"
).split()
SYSTEM_PROMPT = (
    "You are a coding agent. You read files, run commands and tests, and fix bugs step by step. "
    "Think before each tool call; keep answers short. " + " ".join(WORDS * 8)
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} tool",
            "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}},
        },
    }
    for name in ("read_file", "run_command", "search_code")
]


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "unused"),
                        help="bearer token sent as Authorization")
    parser.add_argument("--model", default="mymodel", help="model field of every request")
    parser.add_argument("--tier-mix", default="standard=1,fast=1,auto=1",
                        help="tier weights, e.g. standard=3,fast=1 (tiers: standard fast auto)")
    parser.add_argument("--tier-via", default="header", choices=["header", "service_tier", "none"],
                        help="how the tier is asked for")
    parser.add_argument("--max-tokens", type=int, default=64, help="max_tokens per request")
    parser.add_argument("--stream-ratio", type=float, default=1.0,
                        help="share of ChatUser requests that stream (agents always stream)")
    parser.add_argument("--prompt-sizes", default="50,500,2000",
                        help="ChatUser prompt sizes in tokens (one drawn per request)")
    parser.add_argument("--min-turns", type=int, default=20)
    parser.add_argument("--max-turns", type=int, default=200)
    parser.add_argument("--tool-tokens", default="300-3000", help="tool result size range")
    parser.add_argument("--think-time", default="1-5", help="seconds between turns (range)")
    parser.add_argument("--chat-wait", default="0.5-2", help="seconds between ChatUser requests")
    parser.add_argument("--session-header-ratio", type=float, default=0.5,
                        help="share of agent sessions that send x-session-id")
    parser.add_argument("--max-context-tokens", type=int, default=120_000,
                        help="an agent session ends when its context passes this")
    parser.add_argument("--samples-file", default="", help="append one JSON line per request")
    parser.add_argument("--extra-body", default="",
                        help="JSON object merged into every request body (e.g. sim_faults)")


def _range(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition("-")
    return float(lo), float(hi or lo)


def parse_tier_mix(text: str) -> tuple[list[str], list[float]]:
    """``standard=3,fast=1`` -> (["standard", "fast"], [3.0, 1.0]); a bare name weighs 1."""
    tiers, weights = [], []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, w = part.partition("=")
        if name not in TIERS:
            raise ValueError(f"--tier-mix: unknown tier {name!r} (use {', '.join(TIERS)})")
        tiers.append(name)
        weights.append(float(w) if w else 1.0)
    if not tiers or sum(weights) <= 0:
        raise ValueError("--tier-mix needs at least one tier with a positive weight")
    return tiers, weights


def words(n: int, rng: random.Random) -> str:
    """About ``n`` tokens of text (one word each)."""
    return " ".join(rng.choices(WORDS, k=max(1, n)))


class _Samples:
    """One JSON line per request, to ``--samples-file`` (shared by all users of this process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fh: Any = None

    def open(self, path: str) -> None:
        if path and self.fh is None:
            self.fh = open(path, "a", buffering=1)  # closed at test_quitting / exit

    def write(self, rec: dict[str, Any]) -> None:
        if self.fh is not None:
            line = json.dumps(rec, separators=(",", ":"))
            with self.lock:
                self.fh.write(line + "\n")

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None


SAMPLES = _Samples()


@events.test_start.add_listener
def _on_start(environment: Any, **_: Any) -> None:
    opts = environment.parsed_options
    if opts is not None:
        parse_tier_mix(opts.tier_mix)  # fail at start, not in every user
        SAMPLES.open(opts.samples_file)


@events.quitting.add_listener
def _on_quit(environment: Any, **_: Any) -> None:
    SAMPLES.close()


class _OpenAIUser(HttpUser):
    """Shared request code: body, headers, SSE reading, metric events."""

    abstract = True
    kind = "base"

    def on_start(self) -> None:
        o = self.environment.parsed_options
        self.opts = o
        self.rng = random.Random()
        self.tiers, self.weights = parse_tier_mix(o.tier_mix)
        self.extra = json.loads(o.extra_body) if o.extra_body else {}

    def pick_tier(self) -> str:
        return self.rng.choices(self.tiers, self.weights)[0]

    def _fire(self, rtype: str, name: str, ms: float, length: int = 0) -> None:
        self.environment.events.request.fire(
            request_type=rtype, name=name, response_time=ms, response_length=length,
            exception=None, context={},
        )

    def chat(
        self,
        messages: list[dict[str, Any]],
        tier: str,
        stream: bool,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        sample: dict[str, Any] | None = None,
    ) -> str | None:
        """One chat completion; returns the assistant's text (None on failure)."""
        o = self.opts
        body: dict[str, Any] = {"model": o.model, "messages": messages,
                                "max_tokens": o.max_tokens, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        hdrs = {"Authorization": f"Bearer {o.api_key}", "Content-Type": "application/json"}
        if o.tier_via == "header":
            hdrs["x-speedgate-tier"] = tier
        elif o.tier_via == "service_tier":
            body["service_tier"] = SERVICE_TIER[tier]
        if extra:
            body.update(extra)
        body.update(self.extra)
        if headers:
            hdrs.update(headers)
        data = json.dumps(body, separators=(",", ":"))
        name = f"{self.kind} {'stream' if stream else 'full'} [{tier}]"
        rec: dict[str, Any] = {"t": time.time(), "user": self.kind, "tier_req": tier,
                               "stream": stream, "prompt_bytes": len(data), **(sample or {})}
        t0 = time.perf_counter()
        with self.client.post("/v1/chat/completions", data=data, headers=hdrs, stream=stream,
                              catch_response=True, name=name) as r:
            served = r.headers.get("x-speedgate-tier") or tier
            rec.update(status=r.status_code, tier=served)
            if r.status_code != 200:
                try:
                    snippet = (r.text or "")[:200]
                except Exception as e:  # the connection broke while reading the error
                    snippet = repr(e)
                r.failure(f"HTTP {r.status_code}: {snippet}")
                rec["ok"] = False
                SAMPLES.write(rec)
                return None
            try:
                text, usage, ttft, gaps = (
                    self._read_stream(r, t0) if stream else self._read_full(r)
                )
            except Exception as e:  # a broken stream is a failure of this request
                r.failure(f"{type(e).__name__}: {e}")
                rec.update(ok=False, error=str(e)[:200])
                SAMPLES.write(rec)
                return None
            e2e = time.perf_counter() - t0
            r.success()
        out_tokens = int(usage.get("completion_tokens") or 0) if usage else 0
        details = (usage or {}).get("prompt_tokens_details") or {}
        rec.update(ok=True, e2e=e2e, ttft=ttft, itl=[round(g, 6) for g in gaps],
                   out_tokens=out_tokens, prompt_tokens=(usage or {}).get("prompt_tokens"),
                   cached_tokens=details.get("cached_tokens"))
        SAMPLES.write(rec)
        if stream and ttft is not None:
            self._fire("TTFT", served, ttft * 1e3)
            for g in gaps:
                self._fire("ITL", served, g * 1e3)
            if out_tokens > 1 and e2e > ttft:
                self._fire("TOK/S", served, (out_tokens - 1) / (e2e - ttft), out_tokens)
        self._fire("E2E", served, e2e * 1e3)
        return text

    @staticmethod
    def _read_full(r: Any) -> tuple[str, dict[str, Any], None, list[float]]:
        doc = _loads(r.content)
        msg = doc["choices"][0]["message"]
        return msg.get("content") or "", doc.get("usage") or {}, None, []

    @staticmethod
    def _read_stream(r: Any, t0: float) -> tuple[str, dict[str, Any], float | None, list[float]]:
        """Read SSE events as they arrive; time the first content chunk (from ``t0``, the
        request's start) and the gaps between content chunks."""
        parts: list[str] = []
        usage: dict[str, Any] = {}
        first: float | None = None
        last = 0.0
        gaps: list[float] = []
        buf = b""
        done = False
        for chunk in r.iter_content(chunk_size=None):
            now = time.perf_counter()
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if not line.startswith(b"data:"):
                        continue  # comments (keep-alives), other fields
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                        continue
                    doc = _loads(payload)
                    if "error" in doc:
                        raise RuntimeError(f"error event: {doc['error']}")
                    if doc.get("usage"):
                        usage = doc["usage"]
                    for ch in doc.get("choices") or ():
                        delta = ch.get("delta") or {}
                        content = delta.get("content")
                        if content or delta.get("tool_calls"):
                            if content:
                                parts.append(content)
                            if first is None:
                                first = now - t0
                            else:
                                gaps.append(now - last)
                            last = now
        if not done:
            raise RuntimeError("stream ended without [DONE]")
        return "".join(parts), usage, first, gaps


class ChatUser(_OpenAIUser):
    """Single-turn chats of mixed prompt sizes, no shared prefix between requests."""

    kind = "chat"

    def wait_time(self) -> float:
        lo, hi = _range(self.opts.chat_wait)
        return self.rng.uniform(lo, hi)

    @task
    def one_chat(self) -> None:
        sizes = [int(s) for s in self.opts.prompt_sizes.split(",")]
        n = self.rng.choice(sizes)
        nonce = uuid.uuid4().hex
        messages = [
            {"role": "system", "content": f"[{nonce}] You are a helpful assistant."},
            {"role": "user", "content": f"Summarise this: {words(n, self.rng)}"},
        ]
        stream = self.rng.random() < self.opts.stream_ratio
        self.chat(messages, self.pick_tier(), stream, sample={"prompt_size": n})


class AgentSessionUser(_OpenAIUser):
    """Long agent sessions: growing context, tool results, think time between turns."""

    kind = "agent"

    def on_start(self) -> None:
        super().on_start()
        self.new_session()

    def new_session(self) -> None:
        o = self.opts
        self.session_id = uuid.uuid4().hex
        self.send_header = self.rng.random() < o.session_header_ratio
        self.tier = self.pick_tier()  # one tier per session, as an agent would
        self.turns = self.rng.randint(o.min_turns, max(o.min_turns, o.max_turns))
        self.turn = 0
        self.context_tokens = len(SYSTEM_PROMPT.split())
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Task {self.session_id[:8]}: the build fails; fix it. "
                                        + words(100, self.rng)},
        ]

    def wait_time(self) -> float:
        lo, hi = _range(self.opts.think_time)
        return self.rng.uniform(lo, hi)

    @task
    def one_turn(self) -> None:
        o = self.opts
        headers = {"x-session-id": self.session_id} if self.send_header else None
        reply = self.chat(
            self.messages, self.tier, True, extra={"tools": TOOLS}, headers=headers,
            sample={"session": self.session_id, "turn": self.turn,
                    "session_header": self.send_header},
        )
        self.turn += 1
        if reply is None:  # a failed turn ends the session (the agent would give up)
            self.new_session()
            return
        call_id = f"call_{self.turn}"
        lo, hi = _range(o.tool_tokens)
        n = self.rng.randint(int(lo), int(hi))
        self.messages += [
            {"role": "assistant", "content": reply,
             "tool_calls": [{"id": call_id, "type": "function",
                             "function": {"name": "run_command", "arguments": '{"arg": "make"}'}}]},
            {"role": "tool", "tool_call_id": call_id, "content": words(n, self.rng)},
        ]
        self.context_tokens += n + len(reply.split()) + 20
        if self.turn >= self.turns or self.context_tokens > o.max_context_tokens:
            self.new_session()
