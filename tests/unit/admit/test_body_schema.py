"""The nested shapes of Messages, Responses and chat bodies (``admit.body_schema``) and the
JSON Schema shape of tool schemas (``admit.tool_schema``): each mistake is a 400 naming its
field; agents' real bodies pass; the shape walk agrees with ``jsonschema``'s meta-schema."""

from __future__ import annotations

import pytest
from jsonschema import Draft7Validator, Draft202012Validator
from jsonschema.exceptions import SchemaError

from gateway.admit.body_schema import check_body_schema
from gateway.admit.tool_schema import schema_problem
from gateway.errors import InvalidRequest

MSG = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
RESP = {"model": "m", "input": "hi"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

MISTAKES = [
    ("messages", {**MSG, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": 5}]}]},
     "messages.0.content.0.content"),
    ("messages", {**MSG, "tool_choice": {"type": {}}}, "tool_choice.type"),
    ("messages", {**MSG, "service_tier": {}}, "service_tier"),
    ("count_tokens", {**MSG, "service_tier": [None]}, "service_tier"),
    ("messages", {**MSG, "tools": [{"name": "f", "input_schema": {"type": "object",
                  "properties": {"x": {"enum": 5}}}}]}, "tools.0.input_schema"),
    ("messages", {**MSG, "tools": [{"name": "f", "input_schema": {"items": [1]}}]},
     "tools.0.input_schema"),
    ("messages", {**MSG, "system": [{"type": "text", "text": 1}]}, "system.0.text"),
    ("messages", {**MSG, "stop_sequences": [1]}, "stop_sequences.0"),
    ("responses", {**RESP, "tools": 1.5}, "tools"),
    ("responses", {**RESP, "tool_choice": {"type": {}}}, "tool_choice.type"),
    ("responses", {**RESP, "input": [{"type": "function_call_output", "call_id": 1}]},
     "input.0.call_id"),
    ("responses", {**RESP, "tools": [{"type": "function", "name": "f",
                                       "parameters": {"type": 7}}]}, "tools.0.parameters"),
    ("responses", {**RESP, "text": {"format": {"type": "json_schema", "name": "x",
                                                "schema": {"required": "a"}}}},
     "text.format.schema"),
    ("chat", {**CHAT, "tool_choice": {"type": {}}}, "tool_choice.type"),
    ("chat", {**CHAT, "tools": [{"type": "function", "function": {"name": 5}}]},
     "tools.0.function.name"),
    ("chat", {**CHAT, "messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}]}]},
     "messages.0.tool_calls.0.function.arguments"),
    ("chat", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"anyOf": []}}}}, "response_format.json_schema.schema"),
]


@pytest.mark.parametrize(("api", "doc", "param"), MISTAKES)
def test_each_mistake_is_a_400_naming_its_field(api, doc, param):
    with pytest.raises(InvalidRequest) as e:
        check_body_schema(api, doc)
    assert e.value.status == 400 and e.value.param == param, e.value.message


AGENT_BODIES = [
    ("messages", {**MSG, "system": [{"type": "text", "text": "you are", "cache_control": {
        "type": "ephemeral"}}], "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [
            {"role": "user", "content": "fix it"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hm", "signature": "s"},
                {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"cmd": "ls"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "is_error": False,
                 "content": [{"type": "text", "text": "a.py"}]},
                {"type": "document", "source": {"type": "text", "data": "x"}}]}],
        "tools": [{"name": "Bash", "input_schema": {
            "$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
            "properties": {"cmd": {"type": "string"}}, "required": ["cmd"],
            "additionalProperties": False}},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "metadata": {"user_id": "u"}, "top_k": "5", "unknown_field": [1]}),
    ("responses", {**RESP, "instructions": "be brief", "store": False, "input": [
        {"type": "reasoning", "id": "rs", "summary": [{"type": "summary_text", "text": "x"}],
         "encrypted_content": "e"},
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "function_call", "call_id": "c", "name": "shell", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "ok"}],
        "tools": [{"type": "function", "name": "shell", "strict": False, "parameters": {
            "type": "object", "properties": {"cmd": {"type": "array",
                                                     "items": {"type": "string"}}}}},
            {"type": "web_search"}],
        "tool_choice": "auto", "parallel_tool_calls": False,
        "reasoning": {"effort": "high", "summary": "auto"}, "include": ["reasoning"],
        "prompt_cache_key": "k", "text": {"format": {"type": "text"}}}),
    ("chat", {**CHAT, "messages": [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "text", "text": "hi"},
                                     {"type": "image_url", "image_url": {"url": "data:"}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "ok"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "logit_bias": {"50256": -100}, "top_k": 5}),
]


@pytest.mark.parametrize(("api", "doc"), AGENT_BODIES, ids=[a for a, _ in AGENT_BODIES])
def test_agents_real_bodies_pass(api, doc):
    check_body_schema(api, doc)


SCHEMAS = [
    {}, True, {"type": "object"}, {"type": ["string", "null"]}, {"enum": [1, "a"]},
    {"items": {"type": "string"}}, {"items": [{"type": "string"}]}, {"properties": {"a": True}},
    {"anyOf": [{"type": "string"}]}, {"minLength": 0}, {"multipleOf": 0.5},
    {"dependencies": {"a": ["b"], "c": {"type": "object"}}}, {"x-unknown": 5},
    {"enum": 5}, {"items": [1]}, {"type": 7}, {"type": "float"}, {"type": []},
    {"required": "a"}, {"properties": 3}, {"properties": {"a": 1}}, {"anyOf": []},
    {"anyOf": {}}, {"minLength": -1}, {"minLength": 1.5}, {"multipleOf": 0},
    {"pattern": 5}, {"uniqueItems": "yes"}, {"not": 1}, {"allOf": [1]},
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=[str(s)[:30] for s in SCHEMAS])
def test_the_shape_walk_agrees_with_the_meta_schema(schema):
    """Draft 7 accepts the array form of ``items``, 2020-12 does not: valid under either."""
    def meta_ok(cls) -> bool:
        try:
            cls.check_schema(schema)
        except SchemaError:
            return False
        return True

    expected = meta_ok(Draft202012Validator) or meta_ok(Draft7Validator)
    assert (schema_problem(schema) is None) == expected, schema_problem(schema)
