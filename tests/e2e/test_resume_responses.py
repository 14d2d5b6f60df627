"""Mid-stream resume of Responses streams end to end, with the official ``openai`` client: a
stream broken inside a message's text continues on another replica (through the engine's chat
endpoint: vLLM's ``/v1/responses`` cannot continue a prefill) and the client sees one response —
one ``response.created``, one item id and its indices, ``sequence_number`` without gaps or
repeats, the text of an unbroken run, one set of done events and one ``response.completed``
with the attempts' usage summed; the stored response holds the whole answer. A break inside a
function call's arguments ends with one in-band error event."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.helpers import metric, wait_for
from tests.e2e.protocol_helpers import parse_events
from tests.e2e.stack import MODEL, Stack, resume_stack

pytestmark = pytest.mark.e2e
CHUNKS = [f"part{i} " for i in range(10)]
FULL = "".join(CHUNKS)
FAST = f"{MODEL}-fast"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = resume_stack(tmp_path_factory.mktemp("resume-responses"), budget_min_retries=50)
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url + "/v1", api_key="unused", max_retries=0)


def stream(client: openai.OpenAI, faults: dict[str, Any]) -> dict[str, Any]:
    """One streamed response through ``client.responses.stream``: the events as the SDK
    parsed them, the concatenated text deltas and the final response."""
    events: list[Any] = []
    with client.responses.stream(
        model=FAST, input="go", extra_body={"sim_faults": {
            "chunks": CHUNKS, "chunk_interval_s": 0.01, **faults}},
    ) as s:
        for ev in s:
            events.append(ev)
        final = s.get_final_response()
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    return {"events": events, "kinds": [e.type for e in events], "text": text, "final": final}


def logged(stack: Stack) -> int:
    """Access log lines of a Responses request resumed once that ended ok."""
    return sum("resumes=1 " in ln and "/v1/responses" in ln and "outcome=ok" in ln
               for ln in stack.log_path.read_text().splitlines())


def test_text_break_is_resumed_as_one_response(client: openai.OpenAI, stack: Stack) -> None:
    """A reset after 6 text deltas: one response with the unbroken run's text, numbered
    events, one item, one completion, usage summed; stored whole (GET, input_items, a
    follow-up turn with ``previous_response_id``)."""
    whole = stream(client, {})
    assert whole["text"] == FULL
    before = metric(stack, "speedgate_resumes_total", outcome="resumed")
    lines = logged(stack)
    out = stream(client, {"reset_after_chunks": 6})
    kinds = out["kinds"]
    assert "error" not in kinds and out["text"] == FULL == out["final"].output_text
    for kind in ("response.created", "response.output_item.added",
                 "response.content_part.added", "response.output_text.done",
                 "response.content_part.done", "response.output_item.done",
                 "response.completed"):
        assert kinds.count(kind) == 1, (kind, kinds)
    assert kinds[-1] == "response.completed"
    seqs = [e.sequence_number for e in out["events"]]
    assert seqs == list(range(len(seqs))), seqs
    deltas = [e for e in out["events"] if e.type == "response.output_text.delta"]
    assert len({(e.item_id, e.output_index, e.content_index) for e in deltas}) == 1
    done = next(e for e in out["events"] if e.type == "response.output_text.done")
    assert done.text == FULL and done.item_id == deltas[0].item_id
    final = out["final"]
    created = next(e for e in out["events"] if e.type == "response.created")
    assert final.id == created.response.id and final.status == "completed"
    assert [i.id for i in final.output] == [deltas[0].item_id]
    assert metric(stack, "speedgate_resumes_total", outcome="resumed") == before + 1
    assert wait_for(lambda: logged(stack) == lines + 1)
    continued = [r for r in stack.sim_requests("fast")
                 if (r.get("body") or {}).get("continue_final_message")]
    assert continued, "the continuation went to the engine's chat endpoint"
    used, unbroken = final.usage, whole["final"].usage
    assert used is not None and unbroken is not None
    assert used.output_tokens >= unbroken.output_tokens
    assert used.input_tokens > unbroken.input_tokens  # the continuation prefilled again
    assert used.total_tokens == used.input_tokens + used.output_tokens
    stored = client.responses.retrieve(final.id)
    assert stored.output_text == FULL and stored.status == "completed"
    follow = client.responses.create(model=FAST, input="more", previous_response_id=final.id)
    assert follow.status == "completed"
    items = client.responses.input_items.list(follow.id)
    texts = [c.text for i in items.data if i.type == "message" and i.role == "assistant"
             for c in i.content]
    assert texts == [FULL]


def test_create_stream_true_resumes_repeated_breaks(client: openai.OpenAI,
                                                   stack: Stack) -> None:
    """``create(stream=True)`` with a reset after every 4 events, continuations included: the
    first attempt and the first continuation break mid-text, the second continuation breaks
    right after its last event (its finish: the gateway ends the response, outcome
    ``completed``, no third continuation past the end); the client still sees one response
    with the whole text and gap-free numbering."""
    before = metric(stack, "speedgate_resumes_total", outcome="resumed")
    completed = metric(stack, "speedgate_resumes_total", outcome="completed")
    events = list(client.responses.create(
        model=FAST, input="go", stream=True, extra_body={"sim_faults": {
            "chunks": CHUNKS, "chunk_interval_s": 0.01, "reset_after_chunks": 4}}))
    kinds = [e.type for e in events]
    assert "error" not in kinds and kinds.count("response.completed") == 1
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == FULL == events[-1].response.output_text
    assert metric(stack, "speedgate_resumes_total", outcome="resumed") == before + 2
    assert metric(stack, "speedgate_resumes_total", outcome="completed") == completed + 1


def test_break_inside_function_call_is_an_in_band_error(stack: Stack) -> None:
    """A reset inside a function call's arguments: not continued (rule ``tool-call``), the
    stream ends with one in-band ``error`` event numbered after the last event relayed, and
    no ``response.completed``."""
    before = metric(stack, "speedgate_resumes_total", outcome="refused")
    body = {"model": FAST, "input": "go", "stream": True,
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "sim_faults": {"chunks": CHUNKS, "chunk_interval_s": 0.01,
                           "tool_call_after_chunks": 2, "reset_after_chunks": 5}}
    r = httpx.post(stack.base_url + "/v1/responses", json=body, timeout=30)
    assert r.status_code == 200
    docs = [doc for _, doc in parse_events(r.content)]
    kinds = [doc.get("type") for doc in docs]
    assert kinds.count("response.created") == 1 and kinds[-1] == "error", kinds
    assert "response.completed" not in kinds
    assert [d["sequence_number"] for d in docs] == list(range(len(docs)))
    assert metric(stack, "speedgate_resumes_total", outcome="refused") == before + 1
    assert "not resumed: tool-call" in stack.log_path.read_text()


def test_continuation_broken_after_its_finish_is_ended_by_the_gateway(
    client: openai.OpenAI, stack: Stack
) -> None:
    """A 9-part answer reset after 5 events, continuations included: the continuation's 5th
    event is its last, with the finish reason, and its replica breaks before the usage chunk.
    The gateway ends the response (outcome ``completed``) instead of asking a second
    continuation to go past the finished answer."""
    chunks = CHUNKS[:9]
    resumed = metric(stack, "speedgate_resumes_total", outcome="resumed")
    completed = metric(stack, "speedgate_resumes_total", outcome="completed")
    events = list(client.responses.create(
        model=FAST, input="go", stream=True, extra_body={"sim_faults": {
            "chunks": chunks, "chunk_interval_s": 0.01, "reset_after_chunks": 5}}))
    kinds = [e.type for e in events]
    assert "error" not in kinds and kinds.count("response.completed") == 1, kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "".join(chunks) == events[-1].response.output_text
    assert metric(stack, "speedgate_resumes_total", outcome="resumed") == resumed + 1
    assert metric(stack, "speedgate_resumes_total", outcome="completed") == completed + 1
    usage = events[-1].response.usage
    assert usage is not None and usage.output_tokens > 0
    assert client.responses.retrieve(events[-1].response.id).output_text == "".join(chunks)
