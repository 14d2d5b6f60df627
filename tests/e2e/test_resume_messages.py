"""Mid-stream resume of Anthropic Messages streams end to end, with the official ``anthropic``
client: a stream broken inside its text block continues on another replica (through the
engine's chat endpoint: vLLM's ``/v1/messages`` cannot continue a prefill) and the client sees
one message — one ``message_start``, the block indices of one generation, the text of an
unbroken run, one ``message_delta`` with the usage of the attempts summed, one
``message_stop``. A break inside a ``tool_use`` block ends with one in-band error event."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import pytest

from tests.e2e.helpers import metric, wait_for
from tests.e2e.protocol_helpers import MESSAGES, parse_events
from tests.e2e.stack import MODEL, Stack, resume_stack

pytestmark = pytest.mark.e2e
CHUNKS = [f"part{i} " for i in range(10)]
FULL = "".join(CHUNKS)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = resume_stack(tmp_path_factory.mktemp("resume-messages"), budget_min_retries=50)
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(stack: Stack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.base_url, api_key="unused", max_retries=0)


def stream(client: anthropic.Anthropic, faults: dict) -> dict:
    """One streamed message: the client's events by type, the text, the final message."""
    kinds: list[str] = []
    indices: list[int] = []
    text = ""
    with client.messages.stream(
        model=f"{MODEL}-fast", max_tokens=200, messages=[{"role": "user", "content": "go"}],
        extra_body={"sim_faults": {"chunks": CHUNKS, "chunk_interval_s": 0.01, **faults}},
    ) as s:
        for ev in s:
            kinds.append(ev.type)
            if ev.type in ("content_block_start", "content_block_delta", "content_block_stop"):
                indices.append(ev.index)
            if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
                text += ev.delta.text
        final = s.get_final_message()
    return {"kinds": kinds, "indices": indices, "text": text, "final": final}


def test_text_break_is_resumed_as_one_message(client: anthropic.Anthropic,
                                              stack: Stack) -> None:
    """A reset after 6 text deltas: one message with the unbroken run's text and usage."""

    def logged() -> int:
        return sum("resumes=1 " in ln and "/v1/messages" in ln and "outcome=ok" in ln
                   for ln in stack.log_path.read_text().splitlines())

    whole = stream(client, {})
    assert whole["text"] == FULL
    before = metric(stack, "speedgate_resumes_total", outcome="resumed")
    lines = logged()
    out = stream(client, {"reset_after_chunks": 6})
    assert out["text"] == FULL == "".join(b.text for b in out["final"].content)
    for kind in ("message_start", "content_block_start", "content_block_stop",
                 "message_delta", "message_stop"):
        assert out["kinds"].count(kind) == 1, (kind, out["kinds"])
    assert set(out["indices"]) == {0}
    assert out["final"].stop_reason == whole["final"].stop_reason == "end_turn"
    assert metric(stack, "speedgate_resumes_total", outcome="resumed") == before + 1
    assert wait_for(lambda: logged() == lines + 1)
    continued = [r for r in stack.sim_requests("fast")
                 if (r.get("body") or {}).get("continue_final_message")]
    assert continued, "the continuation went to the engine's chat endpoint"
    # usage: the attempts summed (the continuation prefilled the carried text again)
    used, unbroken = out["final"].usage, whole["final"].usage
    assert used.output_tokens >= unbroken.output_tokens
    assert used.input_tokens > unbroken.input_tokens


def test_repeated_breaks_are_resumed_each_time(client: anthropic.Anthropic,
                                              stack: Stack) -> None:
    """A reset after every 4 events, continuations included: each continuation regenerates
    the healed tail (the space after "part3", …) and adds 3 chunks, so the first attempt and
    the first continuation break mid-text and the second breaks right after its last event
    (its finish: the gateway ends the message, outcome ``completed``, no third continuation
    past the end); the client still sees one message with the whole text."""
    before = metric(stack, "speedgate_resumes_total", outcome="resumed")
    completed = metric(stack, "speedgate_resumes_total", outcome="completed")
    out = stream(client, {"reset_after_chunks": 4})
    assert out["text"] == FULL == "".join(b.text for b in out["final"].content)
    assert out["kinds"].count("message_start") == 1 and out["kinds"].count("message_stop") == 1
    assert set(out["indices"]) == {0}
    assert metric(stack, "speedgate_resumes_total", outcome="resumed") == before + 2
    assert metric(stack, "speedgate_resumes_total", outcome="completed") == completed + 1
    assert out["final"].stop_reason == "end_turn"


def test_break_inside_tool_use_is_an_in_band_error(stack: Stack) -> None:
    """A reset inside a tool call's input: not continued (rule ``tool-call``), the stream ends
    with one in-band error event after the tool block's start and no second message."""
    before = metric(stack, "speedgate_resumes_total", outcome="refused")
    body = {"model": f"{MODEL}-fast", "max_tokens": 200, "stream": True,
            "messages": [{"role": "user", "content": "go"}],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "sim_faults": {"chunks": CHUNKS, "chunk_interval_s": 0.01,
                           "tool_call_after_chunks": 2, "reset_after_chunks": 5}}
    r = httpx.post(stack.base_url + MESSAGES.path, json=body, timeout=30)
    assert r.status_code == 200
    events = parse_events(r.content)
    kinds = [doc.get("type") for _, doc in events]
    assert kinds.count("message_start") == 1 and kinds[-1] == "error", kinds
    assert "tool_use" in [(doc.get("content_block") or {}).get("type") for _, doc in events]
    assert "message_stop" not in kinds
    assert metric(stack, "speedgate_resumes_total", outcome="refused") == before + 1
    assert "not resumed: tool-call" in stack.log_path.read_text()
