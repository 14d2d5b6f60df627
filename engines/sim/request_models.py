"""The request models vLLM 0.32 validates bodies with, as far as the simulator reads them, so
that a body vLLM refuses with its pydantic 400 is refused here the same way (and never turns
into a simulator 500, which a gateway would count against the replica).

Mirrored (field types only; vLLM's models allow extra fields, so do these):

- chat: ``entrypoints/openai/protocol.py`` ``ChatCompletionRequest``: ``messages`` (content a
  string, parts or null; ``tool_calls`` with a ``function`` of string ``name``/``arguments``),
  ``tools`` (``{"type": "function", "function": {"name", "parameters"}}``), ``tool_choice``
  (``none``/``auto``/``required`` or a named function);
- Responses: ``entrypoints/openai/responses/protocol.py`` ``ResponsesRequest`` (OpenAI SDK
  params): ``input`` a string or items, ``tools`` an array of tool objects, ``tool_choice``
  a mode or an object with a ``type``, ``instructions`` a string;
- Messages: ``entrypoints/anthropic/protocol.py`` ``AnthropicMessagesRequest``,
  ``AnthropicMessage`` (role ``user``/``assistant``/``system``, ``ctx``/``msg`` read as
  ``user``), ``AnthropicContentBlock`` (``type`` one of vLLM's seven; ``tool_result.content``
  a string or an array of objects), ``AnthropicTool`` (``input_schema`` an object),
  ``AnthropicToolChoice`` (``auto``/``any``/``tool``/``none``).

A tool's parameter schema must also be a JSON Schema (``jsonschema``'s meta-schema check, the
draft its ``$schema`` names, else 2020-12): vLLM hands it to its structured-output backend,
which refuses a schema it cannot compile with a 400 (``_validate_structured_output``).
"""

from __future__ import annotations

from typing import Any, Literal

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError as JsonSchemaError
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, field_validator

from engines.sim.messages_api import SchemaError


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class FunctionCall(_Open):
    name: str
    arguments: str


class ToolCall(_Open):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessageParam(_Open):
    role: str
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDefinition(_Open):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ChatCompletionToolsParam(_Open):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Open):
    name: str


class ChatCompletionNamedToolChoiceParam(_Open):
    function: NamedFunction
    type: Literal["function"] = "function"


class ChatCompletionRequest(_Open):
    messages: list[ChatMessageParam]
    tools: list[ChatCompletionToolsParam] | None = None
    tool_choice: (Literal["none", "auto", "required"] | ChatCompletionNamedToolChoiceParam
                  | None) = "none"


class ResponseTool(_Open):
    type: str
    name: str | None = None
    parameters: dict[str, Any] | None = None


class ResponseInputItem(_Open):
    type: str | None = None
    role: str | None = None
    content: str | list[dict[str, Any]] | None = None
    call_id: str | None = None
    arguments: str | None = None
    output: str | list[dict[str, Any]] | None = None


class ResponseToolChoice(_Open):
    type: str


class ResponsesRequest(_Open):
    input: str | list[ResponseInputItem]
    instructions: str | None = None
    tools: list[ResponseTool] = []
    tool_choice: Literal["auto", "none", "required"] | ResponseToolChoice = "auto"
    max_output_tokens: int | None = None


class AnthropicContentBlock(_Open):
    type: Literal["text", "image", "tool_use", "tool_result", "tool_reference", "thinking",
                  "redacted_thinking"]
    text: str | None = None
    source: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: str | list[dict[str, Any]] | None = None
    input: dict[str, Any] | None = None
    name: str | None = None
    id: str | None = None
    is_error: bool | None = None
    thinking: str | None = None


class AnthropicMessage(_Open):
    # vLLM accepts system entries between the turns (Claude Code sends them on every request)
    # and maps Claude Code's non-standard roles ``ctx``/``msg`` to ``user``
    role: Literal["user", "assistant", "system"]
    content: str | list[AnthropicContentBlock]

    @field_validator("role", mode="before")
    @classmethod
    def _normalize_role(cls, v: Any) -> Any:
        return {"ctx": "user", "msg": "user"}.get(v, v) if isinstance(v, str) else v


class AnthropicTool(_Open):
    name: str
    description: str | None = None
    input_schema: dict[str, Any]


class AnthropicToolChoice(_Open):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None


class AnthropicMessagesRequest(_Open):
    model: str
    messages: list[AnthropicMessage]
    system: str | list[AnthropicContentBlock] | None = None
    stop_sequences: list[str] | None = None
    tool_choice: AnthropicToolChoice | None = None
    tools: list[AnthropicTool] | None = None


_MODELS: dict[str, TypeAdapter[Any]] = {
    "chat": TypeAdapter(ChatCompletionRequest),
    "responses": TypeAdapter(ResponsesRequest),
    "messages": TypeAdapter(AnthropicMessagesRequest),
    "count_tokens": TypeAdapter(AnthropicMessagesRequest),
}


def _schemas(api: str, body: dict[str, Any]) -> list[tuple[Any, str]]:
    tools = body.get("tools") or ()
    if api in ("messages", "count_tokens"):
        return [(t.get("input_schema"), f"tools.{i}.input_schema") for i, t in enumerate(tools)]
    if api == "responses":
        return [(t.get("parameters"), f"tools.{i}.parameters") for i, t in enumerate(tools)]
    return [(t["function"].get("parameters"), f"tools.{i}.function.parameters")
            for i, t in enumerate(tools)]


def request_problem(api: str, body: dict[str, Any]) -> SchemaError | None:
    """The 400 vLLM would answer ``body`` of ``api`` (``chat``, ``responses``, ``messages``,
    ``count_tokens``; other APIs: None) with, as a ``SchemaError`` (message in pydantic's
    words, ``param`` the field's dotted path); None when vLLM's models accept it."""
    adapter = _MODELS.get(api)
    if adapter is None:
        return None
    try:
        adapter.validate_python(body)
    except ValidationError as e:
        err = e.errors(include_url=False, include_input=False)[0]
        loc = ".".join(str(p) for p in err["loc"])
        return SchemaError(f"1 validation error: {loc} {err['msg']}", f"body.{loc}")
    for schema, param in _schemas(api, body):
        if schema is None:
            continue
        cls = validators.validator_for(schema, default=Draft202012Validator)
        try:
            cls.check_schema(schema)
        except JsonSchemaError as e:
            return SchemaError(f"Invalid JSON schema in {param}: {e.message}", f"body.{param}")
    return None
