"""Context overflow in each API's own words: the table of API × case, rendered through the
error shape each API answers with (status, type, code, param, message)."""

from __future__ import annotations

import orjson
import pytest

from gateway.protocols.error_shapes import ANTHROPIC_ERRORS, OPENAI_ERRORS, RESPONSES_ERRORS
from gateway.routing.overflow import ContextTooLong

PROMPT_TOO_LONG = ContextTooLong(40_000, 32_000, 32_768, prompt_param="messages")
CAP_TOO_LARGE = ContextTooLong(19_537, 32_000, 32_768, prompt_param="messages")

VLLM_PROMPT = ("This model's maximum context length is 32768 tokens. However, your request has "
               "40000 input tokens. Please reduce the length of the input messages.")
VLLM_CAP = ("'max_tokens' or 'max_completion_tokens' is too large: 32000. This model's maximum "
            "context length is 32768 tokens and your request has 19537 input tokens "
            "(32000 > 32768 - 19537).")


@pytest.mark.parametrize(("api", "shape", "prompt_param", "output_param"), [
    ("chat", OPENAI_ERRORS, "messages", "max_completion_tokens"),
    ("completions", OPENAI_ERRORS, "prompt", "max_tokens"),
    ("responses", RESPONSES_ERRORS, "input", "max_output_tokens"),
])
@pytest.mark.parametrize(("prompt", "cap", "case"), [(40_000, 32_000, "prompt"),
                                                      (19_537, 32_000, "cap")])
def test_openai_apis_answer_context_length_exceeded_in_vllm_words(
    api: str, shape: object, prompt_param: str, output_param: str, prompt: int, cap: int,
    case: str,
) -> None:
    err = ContextTooLong(prompt, cap, 32_768, prompt_param=prompt_param,
                         output_param=output_param)
    assert shape.status(err) == 400  # type: ignore[attr-defined]
    doc = orjson.loads(shape.body(err, "req_1"))["error"]  # type: ignore[attr-defined]
    assert doc["type"] == "invalid_request_error" and doc["code"] == "context_length_exceeded"
    assert doc["param"] == (prompt_param if case == "prompt" else output_param)
    assert doc["message"] == (VLLM_PROMPT if case == "prompt" else VLLM_CAP)
    headers = dict(shape.headers(err))  # type: ignore[attr-defined]
    assert headers[b"x-should-retry"] == b"false"


def test_messages_prompt_too_long_is_anthropics_own_message() -> None:
    assert ANTHROPIC_ERRORS.status(PROMPT_TOO_LONG) == 400
    doc = orjson.loads(ANTHROPIC_ERRORS.body(PROMPT_TOO_LONG, "req_1"))
    assert doc["type"] == "error" and doc["request_id"] == "req_1"
    assert doc["error"] == {"type": "invalid_request_error",
                            "message": "prompt is too long: 40000 tokens > 32768 maximum"}


def test_messages_prompt_plus_max_tokens_is_anthropics_own_message() -> None:
    doc = orjson.loads(ANTHROPIC_ERRORS.body(CAP_TOO_LARGE))
    assert doc["error"] == {
        "type": "invalid_request_error",
        "message": "input length and `max_tokens` exceed context limit: 19537 + 32000 > "
                   "32768, decrease input length or `max_tokens` and try again"}


def test_the_in_stream_event_carries_the_same_words() -> None:
    ev = ANTHROPIC_ERRORS.event(PROMPT_TOO_LONG, 0)
    assert b"prompt is too long: 40000 tokens > 32768 maximum" in ev
    ev = RESPONSES_ERRORS.event(CAP_TOO_LARGE, 3)
    doc = orjson.loads(ev.split(b"data: ", 1)[1])
    assert doc["code"] == "context_length_exceeded" and doc["message"] == VLLM_CAP


def test_a_prompt_exactly_at_the_limit_is_the_cap_case() -> None:
    err = ContextTooLong(32_768, 1, 32_768)
    assert not err.prompt_only and err.param == "max_tokens"
    assert ContextTooLong(32_769, 0, 32_768).prompt_only
