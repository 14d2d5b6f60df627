"""The simulator as an agent's model: a text answer after a tool result (and the other
policies), schema-valid tool arguments, reasoning output in each API's vLLM framing,
structured output the official clients' ``parse`` accepts, and scripted turns."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import openai
import pydantic
import pytest

from engines.sim.agent import TurnPolicy, tool_to_call, turn_index
from engines.sim.schema_values import schema_value
from engines.sim.testing import SimProcess, start_sim

pytestmark = pytest.mark.e2e

WRITE = {"type": "object", "properties": {
    "path": {"type": "string", "minLength": 3},
    "count": {"type": "integer", "minimum": 1, "maximum": 5},
    "ratio": {"type": "number"},
    "mode": {"type": "string", "enum": ["a", "b", "c"]},
    "opts": {"type": "object", "properties": {"deep": {"type": "boolean"},
                                              "tags": {"type": "array", "minItems": 2,
                                                       "items": {"$ref": "#/$defs/Tag"}}},
             "required": ["tags"]},
    "note": {"type": ["string", "null"]},
}, "required": ["path", "count", "ratio", "mode", "opts"],
    "$defs": {"Tag": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {
        "name": {"type": "string"}}, "required": ["name"]}]}}}
TOOLS = [{"type": "function", "function": {"name": "write", "parameters": WRITE}},
         {"type": "function", "function": {"name": "other", "parameters": {}}}]


def test_schema_values_are_valid_required_only_and_deterministic() -> None:
    for key in range(200):
        v = schema_value(WRITE, key)
        jsonschema.validate(v, WRITE)
        assert set(v) == {"path", "count", "ratio", "mode", "opts"}  # no optional "note"
        assert type(v["count"]) is int and type(v["ratio"]) is int  # 37, never 37.0
        assert set(v["opts"]) == {"tags"} and len(v["opts"]["tags"]) == 2
        assert v == schema_value(WRITE, key)
    full = schema_value(WRITE, 7, all_properties=True)
    jsonschema.validate(full, WRITE)
    assert {"note", "deep"} <= set(full) | set(full["opts"])
    assert len({schema_value(WRITE, k)["mode"] for k in range(30)}) == 3  # enums vary by key


def test_schema_values_end_recursive_schemas() -> None:
    loop = {"$ref": "#/$defs/A", "$defs": {"A": {"$ref": "#/$defs/A"}}}
    assert isinstance(schema_value(loop, 1), str)  # an unresolvable cycle: a plain value
    tree = {"$ref": "#/$defs/Node", "$defs": {"Node": {"type": "object", "properties": {
        "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
        "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]}},
        "required": ["kids", "next"]}}}
    for key in range(5):
        jsonschema.validate(schema_value(tree, key), tree)


def test_tool_policy_after_a_tool_result() -> None:
    first = {"tools": TOOLS, "messages": [{"role": "user", "content": "go"}]}
    after = {"tools": TOOLS, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
        {"role": "tool", "tool_call_id": "1", "content": "ok"}]}
    assert tool_to_call(first, TurnPolicy(), 0) == "write"
    assert tool_to_call(after, TurnPolicy(), 0) is None
    assert tool_to_call(after, TurnPolicy("call"), 0) == "write"
    assert tool_to_call({**after, "tool_choice": "required"}, TurnPolicy(), 0) == "write"
    named = {"type": "function", "function": {"name": "other"}}
    assert tool_to_call({**after, "tool_choice": named}, TurnPolicy(), 0) == "other"
    mixed = [tool_to_call(after, TurnPolicy("mix", seed=3), k) for k in range(40)]
    assert mixed == [tool_to_call(after, TurnPolicy("mix", seed=3), k) for k in range(40)]
    assert 5 < mixed.count(None) < 35
    assert turn_index(after) == 1 and turn_index(first) == 0


@pytest.fixture(scope="module")
def sim():
    with start_sim(time_scale=0, model="m") as s:
        yield s


@pytest.fixture(autouse=True)
def _clear(sim: SimProcess) -> None:
    httpx.delete(sim.url + "/sim/faults").raise_for_status()


def oai(sim: SimProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.base_url, api_key="x", max_retries=0)


def test_chat_agent_loop_ends_in_text(sim: SimProcess) -> None:
    client = oai(sim)
    msgs: list = [{"role": "user", "content": "write the file"}]
    r = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
    (call,) = r.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), WRITE)
    msgs += [r.choices[0].message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": "written"}]
    r2 = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
    assert r2.choices[0].finish_reason == "stop" and r2.choices[0].message.tool_calls is None
    assert r2.choices[0].message.content


def test_policy_call_keeps_calling() -> None:
    with start_sim(time_scale=0, model="m", after_tool_result="call") as s:
        body = {"model": "m", "tools": TOOLS, "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "write", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "1", "content": "ok"}]}
        r = httpx.post(s.base_url + "/chat/completions", json=body).json()
        assert r["choices"][0]["finish_reason"] == "tool_calls"


def test_chat_reasoning_stream_and_json(sim: SimProcess) -> None:
    client = oai(sim)
    msgs = [{"role": "user", "content": "think first"}]
    r = client.chat.completions.create(model="m", messages=msgs, reasoning_effort="low")
    msg = r.choices[0].message.model_dump()
    assert msg["reasoning"] and msg["content"]
    plain = client.chat.completions.create(model="m", messages=msgs).choices[0].message
    assert plain.model_dump()["reasoning"] is None
    deltas = [c.choices[0].delta.model_dump() for c in client.chat.completions.create(
        model="m", messages=msgs, reasoning_effort="low", stream=True) if c.choices]
    streamed = "".join(d.get("reasoning") or "" for d in deltas)
    assert streamed == msg["reasoning"]
    first_content = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert all(not d.get("reasoning") for d in deltas[first_content:])  # reasoning first


def test_messages_thinking_blocks_with_signature(sim: SimProcess) -> None:
    client = anthropic.Anthropic(base_url=sim.url, api_key="x", max_retries=0)
    kw = {"model": "m", "max_tokens": 200, "messages": [{"role": "user", "content": "hi"}],
          "thinking": {"type": "enabled", "budget_tokens": 1024}}
    full = client.messages.create(**kw)
    assert [b.type for b in full.content] == ["thinking", "text"]
    assert full.content[0].thinking and full.content[0].signature
    with client.messages.stream(**kw) as s:
        events = list(s)
        final = s.get_final_message()
    kinds = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert "thinking_delta" in kinds and kinds.index("signature_delta") < kinds.index(
        "text_delta")
    assert final.content[0].thinking == full.content[0].thinking
    assert final.content[0].signature == full.content[0].signature
    no_think = client.messages.create(**{k: v for k, v in kw.items() if k != "thinking"})
    assert [b.type for b in no_think.content] == ["text"]


def test_responses_reasoning_items_and_encrypted_content(sim: SimProcess) -> None:
    client = oai(sim)
    kw = {"model": "m", "input": "reason", "reasoning": {"effort": "medium"}}
    r = client.responses.create(**kw, include=["reasoning.encrypted_content"])
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].encrypted_content and r.output[0].content[0].text
    assert r.usage.output_tokens_details.reasoning_tokens > 0
    assert client.responses.create(**kw).output[0].encrypted_content is None
    with client.responses.stream(**kw) as s:
        types = [e.type for e in s]
        final = s.get_final_response()
    assert "response.reasoning_text.delta" in types
    assert types.index("response.reasoning_text.done") < types.index("response.output_text.delta")
    assert final.output[0].content[0].text == r.output[0].content[0].text


class Step(pydantic.BaseModel):
    title: str
    minutes: int


class Plan(pydantic.BaseModel):
    name: str
    steps: list[Step]
    done: bool


def test_structured_output_parse_chat_and_responses(sim: SimProcess) -> None:
    client = oai(sim)
    msgs = [{"role": "user", "content": "plan"}]
    parsed = client.chat.completions.parse(model="m", messages=msgs, response_format=Plan)
    plan = parsed.choices[0].message.parsed
    assert isinstance(plan, Plan) and plan.steps
    r = client.responses.parse(model="m", input="plan", text_format=Plan)
    assert isinstance(r.output_parsed, Plan)
    obj = client.chat.completions.create(model="m", messages=msgs,
                                         response_format={"type": "json_object"})
    assert isinstance(json.loads(obj.choices[0].message.content), dict)


SCRIPT = [{"text": "Writing.", "tool": "write", "arguments": {"path": "a.txt", "count": 1}},
          {"tool": "other", "arguments": "{}"},
          {"text": "All done."}]


def test_scripted_turns_per_replica_over_messages(sim: SimProcess) -> None:
    httpx.post(sim.url + "/sim/faults", json={"script": SCRIPT}).raise_for_status()
    client = anthropic.Anthropic(base_url=sim.url, api_key="x", max_retries=0)
    tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
             for t in TOOLS]
    msgs: list = [{"role": "user", "content": "go"}]
    seen = []
    for _ in range(4):
        m = client.messages.create(model="m", max_tokens=100, messages=msgs, tools=tools)
        seen.append([(b.type, getattr(b, "name", None) or getattr(b, "text", None))
                     for b in m.content])
        if m.stop_reason != "tool_use":
            break
        use = next(b for b in m.content if b.type == "tool_use")
        msgs += [{"role": "assistant", "content": [b.model_dump() for b in m.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                               "content": "ok"}]}]
        if len(seen) == 1:
            assert use.input == {"path": "a.txt", "count": 1}
    assert seen == [[("text", "Writing."), ("tool_use", "write")], [("tool_use", "other")],
                    [("text", "All done.")]]
    # a side request without tools keeps the generated text
    side = client.messages.create(model="m", max_tokens=5, messages=msgs)
    assert side.content[0].text != "All done."


def test_scripted_turn_per_request_over_responses(sim: SimProcess) -> None:
    client = oai(sim)
    tools = [{"type": "function", "name": "write", "parameters": WRITE}]
    script = {"script": [{"tool": "write", "arguments": {"path": "x"}}]}
    r = client.responses.create(model="m", input="go", tools=tools,
                                extra_body={"sim_faults": script})
    assert r.output[0].type == "function_call" and json.loads(r.output[0].arguments) == {
        "path": "x"}
    follow = [{"type": "function_call", "call_id": r.output[0].call_id, "name": "write",
               "arguments": r.output[0].arguments},
              {"type": "function_call_output", "call_id": r.output[0].call_id, "output": "ok"}]
    r2 = client.responses.create(model="m", input=[{"role": "user", "content": "go"}, *follow],
                                 tools=tools, extra_body={"sim_faults": script})
    assert [o.type for o in r2.output] == ["message"]  # past the script's end: text


def test_script_text_when_a_user_message_names_a_phrase(sim: SimProcess) -> None:
    """``script_text_when``: a request whose user message (its tool result's text included in
    the same message, as Claude Code appends its summary instruction) holds one of the phrases
    is answered with generated text instead of its scripted tool call, a conversation without
    them keeps the script (an agent's compaction request and its continuation, answered in
    words)."""
    faults = {"script": [{"tool": "write", "arguments": {"path": "a"}}] * 3,
              "script_text_when": ["Respond with plain text only"]}
    httpx.post(sim.url + "/sim/faults", json=faults).raise_for_status()
    client = anthropic.Anthropic(base_url=sim.url, api_key="x", max_retries=0)
    tools = [{"name": "write", "input_schema": WRITE}]
    first = client.messages.create(model="m", max_tokens=50, tools=tools,
                                   messages=[{"role": "user", "content": "go"}])
    use = next(b for b in first.content if b.type == "tool_use")
    turn = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": [b.model_dump() for b in first.content]}]
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "ok"}
    go_on = client.messages.create(model="m", max_tokens=50, tools=tools,
                                   messages=[*turn, {"role": "user", "content": [result]}])
    assert go_on.stop_reason == "tool_use"
    summary = client.messages.create(model="m", max_tokens=50, tools=tools, messages=[
        *turn, {"role": "user", "content": [result, {
            "type": "text", "text": "Summarize. Respond with plain text only."}]}])
    assert summary.stop_reason != "tool_use" and summary.content[0].type == "text"


def test_messages_accept_claude_codes_system_entries(sim: SimProcess) -> None:
    """Like vLLM's ``AnthropicMessage``: ``system`` entries between the turns, the roles
    ``ctx``/``msg`` read as user, ``tool_choice`` ``none``, ``redacted_thinking`` blocks."""
    body = {"model": "m", "max_tokens": 4, "tool_choice": {"type": "none"}, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "text", "text": "reminder"}]},
        {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]},
        {"role": "ctx", "content": "more"}]}
    r = httpx.post(sim.url + "/v1/messages", json=body)
    assert r.status_code == 200, r.text
    assert httpx.post(sim.url + "/v1/messages", json={**body, "messages": [
        {"role": "robot", "content": "x"}]}).status_code == 400


def _content_before_reset(sim: SimProcess, body: dict) -> tuple[list[str], bool]:
    """``(content deltas, finished)`` of a chat stream: finished False when the replica
    aborted the connection before ``[DONE]``."""
    out: list[str] = []
    try:
        with httpx.stream("POST", sim.url + "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    return [t for t in out if t], True
                if line.startswith("data: "):
                    for c in json.loads(line[6:])["choices"]:
                        out.append(c["delta"].get("content") or "")
    except httpx.HTTPError:
        pass
    return [t for t in out if t], False


def test_a_scripted_turns_own_reset_breaks_that_turn_only(sim: SimProcess) -> None:
    """``reset_after_chunks`` on a script turn aborts that turn after N answer deltas (the
    reasoning before them not counted), never its continuation."""
    script = {"script": [{"text": "one two three four five", "reset_after_chunks": 2}]}
    httpx.post(sim.url + "/sim/faults", json=script).raise_for_status()
    body = {"model": "m", "stream": True, "tools": TOOLS, "max_tokens": 50,
            "messages": [{"role": "user", "content": "go"}]}
    got, done = _content_before_reset(sim, body)
    assert (got, done) == (["one", " two"], False)
    got, done = _content_before_reset(sim, {**body, "reasoning_effort": "low"})
    assert (got, done) == (["one", " two"], False)  # after its 12 reasoning deltas
    cont = {**body, "continue_final_message": True, "add_generation_prompt": False,
            "messages": [*body["messages"], {"role": "assistant", "content": "one two"}]}
    got, done = _content_before_reset(sim, cont)
    assert done and "".join(got) == " three four five"
