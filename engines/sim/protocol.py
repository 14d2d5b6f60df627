"""vLLM-shaped bodies: stream chunks, full responses, usage, errors, model list.

Shapes follow vLLM's OpenAI server (vllm/entrypoints/openai/protocol.py): chunks are serialised
with ``exclude_unset`` (no ``usage`` key unless usage is sent), full responses with every field;
ids are ``chatcmpl-<16 hex>``, ``cmpl-<16 hex>``, ``chatcmpl-tool-<16 hex>`` (vLLM 0.32's
``random_uuid()``). Full responses carry ``service_tier: null`` and ``system_fingerprint``
(``vllm-<version>-<8 hex>``), and so does the usage chunk; a chat message has ``reasoning`` (not
the older ``reasoning_content``) and no ``tool_calls`` key when there are none. JSON is compact
and UTF-8 (orjson), like pydantic's ``model_dump_json``.
"""

from __future__ import annotations

import os
from http import HTTPStatus
from typing import Any

import orjson

dumps = orjson.dumps

ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    408: "RequestTimeoutError",
    413: "RequestEntityTooLargeError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


# What vLLM 0.32 sends as ``system_fingerprint`` ("vllm-0.32.0-<8 hex of its build>").
SYSTEM_FINGERPRINT = "vllm-0.32.0-5e5c0a1d"


def random_id(prefix: str) -> str:
    """``prefix`` + 16 random hex digits (vLLM 0.32's ``random_uuid()``: 64 bits)."""
    return prefix + os.urandom(8).hex()


def error_type(status: int) -> str:
    """vLLM's error ``type`` for an HTTP status."""
    known = ERROR_TYPES.get(status)
    if known:
        return known
    try:
        return HTTPStatus(status).phrase.replace(" ", "").replace("-", "") + "Error"
    except ValueError:
        return "Error"


def error_body(
    message: str, status: int, *, flat: bool = False, type_: str | None = None,
    param: str | None = None,
) -> bytes:
    """``{"error": {message, type, param, code}}``; ``flat``: vLLM's older top-level shape."""
    err = {"message": message, "type": type_ or error_type(status), "param": param, "code": status}
    if flat:
        return dumps({"object": "error", **err})
    return dumps({"error": err})


def usage(prompt: int, completion: int, cached: int | None) -> dict[str, Any]:
    """Usage object; ``cached`` None omits the details (``--no-enable-prompt-tokens-details``)."""
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None if cached is None else {"cached_tokens": cached},
    }


def chat_chunk(
    rid: str, created: int, model: str, choices: list[dict[str, Any]],
    usage_: dict[str, Any] | None = None,
) -> bytes:
    """One ``chat.completion.chunk`` as JSON bytes."""
    body: dict[str, Any] = {
        "id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
        "choices": choices,
    }
    if usage_ is not None:
        body["usage"] = usage_
        if not choices:
            body["system_fingerprint"] = SYSTEM_FINGERPRINT
    return dumps(body)


def text_chunk(
    rid: str, created: int, model: str, choices: list[dict[str, Any]],
    usage_: dict[str, Any] | None = None,
) -> bytes:
    """One streamed ``text_completion`` as JSON bytes."""
    body: dict[str, Any] = {
        "id": rid, "object": "text_completion", "created": created, "model": model,
        "choices": choices,
    }
    if usage_ is not None:
        body["usage"] = usage_
        if not choices:
            body["system_fingerprint"] = SYSTEM_FINGERPRINT
    return dumps(body)


def delta_choice(index: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    """A chat stream choice; the finishing one also carries ``stop_reason``."""
    c: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
    if finish is not None:
        c["stop_reason"] = None
    return c


def text_choice(index: int, text: str, finish: str | None = None) -> dict[str, Any]:
    """A completions stream choice."""
    return {
        "index": index, "text": text, "logprobs": None, "finish_reason": finish,
        "stop_reason": None,
    }


def tool_call_header(call_id: str, name: str) -> dict[str, Any]:
    """First delta of a streamed tool call: id, type, name, empty arguments."""
    return {
        "tool_calls": [
            {"index": 0, "id": call_id, "type": "function",
             "function": {"name": name, "arguments": ""}}
        ]
    }


def tool_call_args(piece: str) -> dict[str, Any]:
    """A streamed tool-call arguments delta."""
    return {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}


def chat_response(
    rid: str, created: int, model: str, choices: list[dict[str, Any]], usage_: dict[str, Any]
) -> bytes:
    """A full ``chat.completion``."""
    return dumps({
        "id": rid, "object": "chat.completion", "created": created, "model": model,
        "choices": choices, "service_tier": None, "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": usage_, "prompt_logprobs": None,
    })


def chat_message_choice(
    index: int, content: str | None, finish: str, tool_calls: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A full chat choice."""
    message: dict[str, Any] = {
        "role": "assistant", "content": content, "refusal": None, "annotations": None,
        "audio": None, "function_call": None,
    }
    if tool_calls:  # vLLM drops an empty list
        message["tool_calls"] = tool_calls
    message["reasoning"] = None
    return {
        "index": index, "message": message, "logprobs": None, "finish_reason": finish,
        "stop_reason": None,
    }


def text_response(
    rid: str, created: int, model: str, choices: list[dict[str, Any]], usage_: dict[str, Any]
) -> bytes:
    """A full ``text_completion``."""
    return dumps({
        "id": rid, "object": "text_completion", "created": created, "model": model,
        "choices": choices, "service_tier": None, "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": usage_,
    })


def models_list(model: str, created: int, max_model_len: int) -> bytes:
    """``GET /v1/models`` body, as vLLM serves it."""
    return dumps({
        "object": "list",
        "data": [{
            "id": model, "object": "model", "created": created, "owned_by": "vllm",
            "root": model, "parent": None, "max_model_len": max_model_len,
            "permission": [{
                "id": random_id("modelperm-"), "object": "model_permission", "created": created,
                "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                "organization": "*", "group": None, "is_blocking": False,
            }],
        }],
    })
