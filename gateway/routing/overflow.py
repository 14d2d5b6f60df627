"""Context overflow: a request that fits no replica, refused in each API's own words with the
limits stated, so that a coding agent recognises it and compacts or lowers its output cap.

Two cases, ``A`` the prompt's tokens (the gateway's estimate, as used for fit), ``B`` the output
cap the request asks for, ``C`` the most tokens the largest replica of its chain takes
(``gateway.routing.fit.capacity_tokens``):

- **the prompt alone is too long** (``A > C``): only a shorter conversation helps;
- **the prompt fits but prompt + output cap does not** (``A + B > C``): a lower cap helps.

The wording per API (each is what that API's own server says, so clients that match it act):

- OpenAI-shaped APIs (chat, completions, Responses): vLLM's messages
  (``vllm/entrypoints/openai/serving_engine.py``, ``_validate_input``): ``This model's maximum
  context length is C tokens. However, your request has A input tokens. Please reduce the length
  of the input messages.`` and ``'max_tokens' or 'max_completion_tokens' is too large: B. This
  model's maximum context length is C tokens and your request has A input tokens (B > C - A).``,
  with OpenAI's ``code: context_length_exceeded`` and ``param`` the field to change.
- Anthropic Messages: ``prompt is too long: A tokens > C maximum`` and ``input length and
  `max_tokens` exceed context limit: A + B > C, decrease input length or `max_tokens` and try
  again`` (the Messages API's own 400 ``invalid_request_error`` messages; Claude Code compacts
  on the first and retries with ``max_tokens = C - A - 1000`` on the second).
"""

from __future__ import annotations

from gateway.errors import InvalidRequest


class ContextTooLong(InvalidRequest):
    """400 ``context_length_exceeded``: the request fits no replica of its chain.

    ``prompt_tokens`` (A), ``output_tokens`` (B, 0 when the request sets no cap) and ``limit``
    (C, tokens) as in the module docstring. ``param``: ``prompt_param`` (the API's prompt field:
    ``messages``, ``prompt``, ``input``) when the prompt alone is too long, else
    ``output_param`` (``max_tokens``, ``max_completion_tokens``, ``max_output_tokens``).
    ``message`` is vLLM's wording; ``message_for("anthropic")`` the Messages API's.
    ``at_least``: counting stopped once the prompt passed ``limit`` (A is a lower bound, and
    the prompt alone is too long)."""

    code = "context_length_exceeded"

    def __init__(
        self, prompt_tokens: int, output_tokens: int, limit: int, *,
        prompt_param: str = "messages", output_param: str = "max_tokens", at_least: bool = False,
    ) -> None:
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.limit = limit
        if self.prompt_only:
            text = (f"This model's maximum context length is {limit} tokens. However, your "
                    f"request has {'at least ' if at_least else ''}{prompt_tokens} input "
                    f"tokens. Please reduce the length of "
                    f"the input messages.")
        else:
            text = (f"'max_tokens' or 'max_completion_tokens' is too large: {output_tokens}. "
                    f"This model's maximum context length is {limit} tokens and your request "
                    f"has {prompt_tokens} input tokens ({output_tokens} > {limit} - "
                    f"{prompt_tokens}).")
        super().__init__(text, param=prompt_param if self.prompt_only else output_param)

    @property
    def prompt_only(self) -> bool:
        """True when the prompt alone exceeds the limit (no output cap would make it fit)."""
        return self.prompt_tokens > self.limit

    def message_for(self, api: str) -> str:
        """The message in ``api``'s words: ``anthropic`` (the Messages API), else vLLM's."""
        if api != "anthropic":
            return self.message
        if self.prompt_only:
            return f"prompt is too long: {self.prompt_tokens} tokens > {self.limit} maximum"
        return (f"input length and `max_tokens` exceed context limit: {self.prompt_tokens} + "
                f"{self.output_tokens} > {self.limit}, decrease input length or `max_tokens` "
                f"and try again")
