"""The request bodies' nested shapes, checked before any replica sees them (DESIGN §1, admit).

Each API's protocol adapter checks its top-level fields (``model``, ``messages``, ``input``,
``stream``...); this module checks the types of the nested fields an engine parses, with
pydantic models that mirror vLLM's own request models (vLLM 0.32:
``entrypoints/openai/protocol.py`` ``ChatCompletionRequest`` and its message/tool params,
``entrypoints/openai/responses/protocol.py`` ``ResponsesRequest`` over the OpenAI SDK's
``ResponseInputItemParam``/``ToolParam``, ``entrypoints/anthropic/protocol.py``
``AnthropicMessagesRequest``/``AnthropicContentBlock``/``AnthropicTool``/
``AnthropicToolChoice``), so that what vLLM would refuse with a pydantic 400 — or fail on with a
500 after its pydantic models let it through — is a 400 ``invalid_request_error`` from the
gateway in the API's own error shape, and never reaches, costs or counts against a replica.

Lenient like the APIs: unknown fields are ignored (``extra="ignore"``: vLLM's extras, newer
fields of either API), values coerce as pydantic's lax mode does (``"1"`` is an integer, as in
vLLM), and a field is only typed where an engine reads it. Tool parameter schemas must be shaped
like a JSON Schema (``tool_schema``). What the gateway cannot see (a tool name the template
rejects) stays the engine's to answer.

Cost (``loadtests/fuzz_front_doors.py --bench``): a few µs for a small body, ~1 ms per MiB of
conversation text; bodies above ``server.offload_parse_bytes`` are parsed and checked off the
event loop (``gateway.admit.parse``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from gateway.admit.tool_schema import check_tool_schema
from gateway.errors import InvalidRequest

JsonObject = dict[str, Any]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


# ----- Anthropic Messages (vLLM ``entrypoints/anthropic/protocol.py``) -----


class AnthropicBlock(_Lenient):
    """A content block: ``type`` is kept open (new block kinds pass), the fields vLLM reads
    are typed (``tool_result.content`` a string or an array of blocks)."""

    type: str
    text: str | None = None
    source: JsonObject | None = None
    tool_use_id: str | None = None
    content: str | list[JsonObject] | None = None
    input: JsonObject | None = None
    name: str | None = None
    id: str | None = None
    is_error: bool | None = None
    thinking: str | None = None
    signature: str | None = None


class AnthropicMessage(_Lenient):
    """One message (its ``role`` is the adapter's to check)."""

    content: str | list[AnthropicBlock]


class AnthropicTool(_Lenient):
    """A tool: ``input_schema`` a JSON Schema object (server tools such as web search have
    none)."""

    name: str
    description: str | None = None
    input_schema: JsonObject | None = None


class AnthropicToolChoice(_Lenient):
    """``{"type": "auto" | "any" | "tool" | "none", "name"}``."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class AnthropicRequest(_Lenient):
    """``POST /v1/messages`` and ``count_tokens``."""

    messages: list[AnthropicMessage]
    system: str | list[AnthropicBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: JsonObject | None = None
    thinking: JsonObject | None = None
    service_tier: str | None = None


# ----- OpenAI Responses (vLLM ``ResponsesRequest``, OpenAI SDK params) -----


class ResponsesPart(_Lenient):
    """A content part of an input message (``input_text``, ``output_text``, ``input_image``)."""

    type: str
    text: str | None = None


class ResponsesItem(_Lenient):
    """An input item: a message (``role`` + ``content``), a function call or its output, a
    reasoning item."""

    type: str | None = None
    role: str | None = None
    content: str | list[ResponsesPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[JsonObject] | None = None
    summary: list[JsonObject] | None = None


class ResponsesTool(_Lenient):
    """A tool: ``function`` tools name their ``parameters`` schema; hosted tools pass."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: JsonObject | None = None
    strict: bool | None = None


class NamedChoice(_Lenient):
    """An object ``tool_choice``: a named function or a hosted tool type."""

    type: str
    name: str | None = None


class ResponsesText(_Lenient):
    """``text``: its ``format`` (``text``, ``json_object``, ``json_schema`` + ``schema``)."""

    format: JsonObject | None = None


class ResponsesRequest(_Lenient):
    """``POST /v1/responses``."""

    input: str | list[ResponsesItem]
    instructions: str | list[ResponsesItem] | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedChoice | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    parallel_tool_calls: bool | None = None
    text: ResponsesText | None = None
    reasoning: JsonObject | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    user: str | None = None


# ----- OpenAI chat (vLLM ``ChatCompletionRequest``) -----


class ChatFunction(_Lenient):
    """A tool's function: ``parameters`` a JSON Schema object."""

    name: str
    description: str | None = None
    parameters: JsonObject | None = None
    strict: bool | None = None


class ChatTool(_Lenient):
    """``{"type": "function", "function": {...}}``."""

    type: str = "function"
    function: ChatFunction


class CalledFunction(_Lenient):
    """A tool call's function: name and JSON-encoded ``arguments`` (a string)."""

    name: str | None = None
    arguments: str | None = None


class ChatToolCall(_Lenient):
    """An assistant message's tool call."""

    id: str | None = None
    type: str | None = None
    function: CalledFunction


class ChatMessage(_Lenient):
    """A message: ``content`` a string or an array of typed parts (or null)."""

    content: str | list[ResponsesPart] | None = None
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class ChatNamedChoice(_Lenient):
    """``{"type": "function", "function": {"name"}}``."""

    type: str = "function"
    function: CalledFunction


class ResponseFormat(_Lenient):
    """``response_format``: ``json_schema`` carries ``{"name", "schema"}``."""

    type: str
    json_schema: JsonObject | None = None


class ChatRequest(_Lenient):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage]
    tools: list[ChatTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | ChatNamedChoice | None = None
    response_format: ResponseFormat | None = None
    logit_bias: dict[str, float] | None = None
    parallel_tool_calls: bool | None = None
    service_tier: str | None = None
    user: str | None = None


_ADAPTERS: dict[str, TypeAdapter[Any]] = {
    "messages": TypeAdapter(AnthropicRequest),
    "count_tokens": TypeAdapter(AnthropicRequest),
    "responses": TypeAdapter(ResponsesRequest),
    "chat": TypeAdapter(ChatRequest),
}


_TYPE_TAGS = frozenset({"str", "list", "dict", "int", "float", "bool", "function-after"})


def _param(loc: tuple[int | str, ...]) -> str:
    """pydantic's error location as a dotted field path (union branch tags dropped: they are
    model names, ``literal[...]``, ``list[...]`` or type names, never field names)."""
    parts = [str(p) for p in loc if not isinstance(p, str) or not (
        "[" in p or p[:1].isupper() or p in _TYPE_TAGS)]
    return ".".join(parts) or "body"


def _tool_schemas(api: str, doc: JsonObject) -> list[tuple[Any, str]]:
    """``(schema, param)`` of each tool parameter schema of ``doc`` (validated already)."""
    tools = doc.get("tools") or ()
    if api in ("messages", "count_tokens"):
        out = [(t.get("input_schema"), f"tools.{i}.input_schema") for i, t in enumerate(tools)]
    elif api == "responses":
        out = [(t.get("parameters"), f"tools.{i}.parameters") for i, t in enumerate(tools)]
    else:
        out = [(t["function"].get("parameters"), f"tools.{i}.function.parameters")
               for i, t in enumerate(tools)]
        fmt = doc.get("response_format")
        if isinstance(fmt, dict) and isinstance(fmt.get("json_schema"), dict):
            out.append((fmt["json_schema"].get("schema"), "response_format.json_schema.schema"))
    if api == "responses":
        text = doc.get("text")
        fmt = text.get("format") if isinstance(text, dict) else None
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            out.append((fmt.get("schema"), "text.format.schema"))
    return out


def check_body_schema(api: str, doc: JsonObject) -> None:
    """Raise ``InvalidRequest`` (400, ``param`` the first bad field's dotted path, code
    ``invalid_type``; ``invalid_tool_schema`` for a tool schema) when ``doc`` (the parsed body
    of protocol ``api``: ``messages``, ``count_tokens``, ``responses``, ``chat``; others
    pass) breaks the shapes above."""
    adapter = _ADAPTERS.get(api)
    if adapter is None:
        return
    try:
        adapter.validate_python(doc)
    except ValidationError as e:
        # the deepest error names the field (a union's shallow branches say less); the
        # union's other branches at that field say what else it could have been
        errors = e.errors(include_url=False, include_input=False)
        param = _param(max(errors, key=lambda err: len(err["loc"]))["loc"])
        said = dict.fromkeys(err["msg"] for err in errors if _param(err["loc"]) == param)
        raise InvalidRequest(f"{param}: {' or '.join(said)}", param=param,
                             code="invalid_type") from None
    for schema, param in _tool_schemas(api, doc):
        check_tool_schema(schema, param)
