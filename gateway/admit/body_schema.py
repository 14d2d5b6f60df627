"""The request bodies' nested shapes, checked at admission, before any replica sees them.

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

Lenient like the APIs: unknown fields are ignored (``TypedDict`` s, whose extra keys pydantic
ignores: vLLM's extras, newer fields of either API; typed dicts validate ~3x faster than models
here, as no instance is built), values coerce as pydantic's lax mode does (``"1"`` is an
integer, as in vLLM), and a field is only typed where an engine reads it. Tool parameter
schemas must be shaped like a JSON Schema (``tool_schema``). What the gateway cannot see (a
tool name the template rejects) stays the engine's to answer.

Cost (``loadtests/fuzz_front_doors.py --bench``, 2 cores under a load average of 6): ~35 µs
for a small agent body, ~8 ms for a 1 MB Messages conversation of 500 messages and 20 tools;
bodies of ``parse.OFFLOAD_PARSE_BYTES`` or more are parsed and checked off the event loop
(``gateway.admit.parse``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Required

from pydantic import Field, TypeAdapter, ValidationError
from typing_extensions import TypedDict  # pydantic needs it below Python 3.12

from gateway.admit.tool_schema import check_tool_schema
from gateway.errors import InvalidRequest

JsonObject = dict[str, Any]


# ----- Anthropic Messages (vLLM ``entrypoints/anthropic/protocol.py``) -----


class AnthropicBlock(TypedDict, total=False):
    """A content block: ``type`` is kept open (new block kinds pass), the fields vLLM reads
    are typed (``tool_result.content`` a string or an array of blocks)."""

    type: Required[str]
    text: str | None
    source: JsonObject | None
    tool_use_id: str | None
    content: str | list[JsonObject] | None
    input: JsonObject | None
    name: str | None
    id: str | None
    is_error: bool | None
    thinking: str | None
    signature: str | None


class AnthropicMessage(TypedDict, total=False):
    """One message (its ``role`` is the adapter's to check)."""

    content: Required[str | list[AnthropicBlock]]


class AnthropicTool(TypedDict, total=False):
    """A tool: ``input_schema`` a JSON Schema object (server tools such as web search have
    none)."""

    name: Required[str]
    description: str | None
    input_schema: JsonObject | None


class AnthropicToolChoice(TypedDict, total=False):
    """``{"type": "auto" | "any" | "tool" | "none", "name"}``."""

    type: Required[Literal["auto", "any", "tool", "none"]]
    name: str | None
    disable_parallel_tool_use: bool | None


class AnthropicRequest(TypedDict, total=False):
    """``POST /v1/messages`` and ``count_tokens``."""

    messages: Required[list[AnthropicMessage]]
    system: str | list[AnthropicBlock] | None
    tools: list[AnthropicTool] | None
    tool_choice: AnthropicToolChoice | None
    stop_sequences: list[str] | None
    temperature: float | None
    top_p: float | None
    top_k: int | None
    metadata: JsonObject | None
    thinking: JsonObject | None
    service_tier: str | None


# ----- OpenAI Responses (vLLM ``ResponsesRequest``, OpenAI SDK params) -----


class ResponsesPart(TypedDict, total=False):
    """A content part of an input message (``input_text``, ``output_text``, ``input_image``)."""

    type: Required[str]
    text: str | None


#: The input item types of OpenAI's Responses API (the ``type`` literals of the ``openai``
#: SDK's ``ResponseInputItemParam`` union, openai 3.57), which vLLM's request model takes
#: (``ResponseInputOutputItem``): the gateway converts message, function call/output and
#: reasoning items for its routing keys and state (``gateway.protocols.responses.items``) and
#: forwards the others for the engine to render (Codex sends ``custom_tool_call`` items for its
#: patch tool). Any other type is refused (OpenAI answers 400 ``input[i].type``, vLLM's union
#: refuses it) rather than forwarded to be dropped or mis-rendered.
ResponsesItemType = Literal[
    "message", "function_call", "function_call_output", "reasoning", "item_reference",
    "custom_tool_call", "custom_tool_call_output", "local_shell_call", "local_shell_call_output",
    "shell_call", "shell_call_output", "apply_patch_call", "apply_patch_call_output",
    "computer_call", "computer_call_output", "file_search_call", "web_search_call",
    "image_generation_call", "code_interpreter_call", "mcp_call", "mcp_list_tools",
    "mcp_approval_request", "mcp_approval_response", "tool_search_call", "tool_search_output",
    "compaction", "compaction_trigger", "additional_tools", "configuration_update", "program",
    "program_output",
]


class ResponsesItem(TypedDict, total=False):
    """An input item: a message (``role`` + ``content``, ``type`` ``message`` or absent), a
    function call or its output, a reasoning item."""

    type: ResponsesItemType | None
    role: str | None
    content: str | list[ResponsesPart] | None
    call_id: str | None
    name: str | None
    arguments: str | None
    output: str | list[JsonObject] | None
    summary: list[JsonObject] | None


class ResponsesTool(TypedDict, total=False):
    """A tool: ``function`` tools name their ``parameters`` schema; hosted tools pass."""

    type: Required[str]
    name: str | None
    description: str | None
    parameters: JsonObject | None
    strict: bool | None


class NamedChoice(TypedDict, total=False):
    """An object ``tool_choice``: a named function or a hosted tool type."""

    type: Required[str]
    name: str | None


class ResponsesText(TypedDict, total=False):
    """``text``: its ``format`` (``text``, ``json_object``, ``json_schema`` + ``schema``)."""

    format: JsonObject | None


class ResponsesRequest(TypedDict, total=False):
    """``POST /v1/responses``."""

    input: Required[str | list[ResponsesItem]]
    instructions: str | list[ResponsesItem] | None
    tools: list[ResponsesTool] | None
    tool_choice: Literal["auto", "none", "required"] | NamedChoice | None
    max_output_tokens: Annotated[int, Field(ge=1)] | None
    temperature: float | None
    top_p: float | None
    parallel_tool_calls: bool | None
    text: ResponsesText | None
    reasoning: JsonObject | None
    metadata: dict[str, str] | None
    service_tier: str | None
    user: str | None


# ----- OpenAI chat (vLLM ``ChatCompletionRequest``) -----


class ChatFunction(TypedDict, total=False):
    """A tool's function: ``parameters`` a JSON Schema object."""

    name: Required[str]
    description: str | None
    parameters: JsonObject | None
    strict: bool | None


class ChatTool(TypedDict, total=False):
    """``{"type": "function", "function": {...}}``."""

    type: str
    function: Required[ChatFunction]


class CalledFunction(TypedDict, total=False):
    """A tool call's function: name and JSON-encoded ``arguments`` (a string)."""

    name: str | None
    arguments: str | None


class ChatToolCall(TypedDict, total=False):
    """An assistant message's tool call."""

    id: str | None
    type: str | None
    function: Required[CalledFunction]


class ChatMessage(TypedDict, total=False):
    """A message: ``content`` a string or an array of typed parts (or null)."""

    content: str | list[ResponsesPart] | None
    tool_calls: list[ChatToolCall] | None
    tool_call_id: str | None
    name: str | None


class ChatNamedChoice(TypedDict, total=False):
    """``{"type": "function", "function": {"name"}}``."""

    type: str
    function: Required[CalledFunction]


class ResponseFormat(TypedDict, total=False):
    """``response_format``: ``json_schema`` carries ``{"name", "schema"}``."""

    type: Required[str]
    json_schema: JsonObject | None


class ChatRequest(TypedDict, total=False):
    """``POST /v1/chat/completions``."""

    messages: Required[list[ChatMessage]]
    tools: list[ChatTool] | None
    tool_choice: Literal["auto", "none", "required"] | ChatNamedChoice | None
    response_format: ResponseFormat | None
    logit_bias: dict[str, float] | None
    parallel_tool_calls: bool | None
    service_tier: str | None
    user: str | None


_ADAPTERS: dict[str, TypeAdapter[Any]] = {
    "messages": TypeAdapter(AnthropicRequest),
    "count_tokens": TypeAdapter(AnthropicRequest),
    "responses": TypeAdapter(ResponsesRequest),
    "input_tokens": TypeAdapter(ResponsesRequest),
    "chat": TypeAdapter(ChatRequest),
}


_TYPE_TAGS = frozenset({"str", "list", "dict", "int", "float", "bool", "function-after",
                        "typed-dict"})


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
    elif api in ("responses", "input_tokens"):
        out = [(t.get("parameters"), f"tools.{i}.parameters") for i, t in enumerate(tools)]
    else:
        out = [(t["function"].get("parameters"), f"tools.{i}.function.parameters")
               for i, t in enumerate(tools)]
        fmt = doc.get("response_format")
        if isinstance(fmt, dict) and isinstance(fmt.get("json_schema"), dict):
            out.append((fmt["json_schema"].get("schema"), "response_format.json_schema.schema"))
    if api in ("responses", "input_tokens"):
        text = doc.get("text")
        fmt = text.get("format") if isinstance(text, dict) else None
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            out.append((fmt.get("schema"), "text.format.schema"))
    return out


def check_body_schema(api: str, doc: JsonObject) -> None:
    """Raise ``InvalidRequest`` (400, ``param`` the first bad field's dotted path, code
    ``invalid_type``; ``invalid_tool_schema`` for a tool schema) when ``doc`` (the parsed body
    of protocol ``api``: ``messages``, ``count_tokens``, ``responses``, ``input_tokens``
    (a Responses body, checked as ``responses``), ``chat``; others pass) breaks the shapes above."""
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
