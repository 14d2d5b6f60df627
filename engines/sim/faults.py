"""Scripted faults: one schema, used per request, per replica and from the command line.

- per request: body field ``"sim_faults": {...}`` (a gateway forwards unknown fields untouched);
- per replica: ``POST /sim/faults`` (replaces), ``DELETE /sim/faults`` (clears), ``--faults JSON``.

Per-request fields override the replica's (only the fields the request sets). All durations are
**wall-clock seconds** and are not multiplied by ``--time-scale``.

"Content events" are the data events after the chat role chunk: content deltas, tool-call deltas
(the tool-call header with id and name counts as one), completion text chunks. Not counted: the
role chunk, the usage chunk, ``[DONE]``, comments, malformed events. ``*_after_chunks = 0`` acts
right after the role chunk (chat) or before the first event (completions).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from engines.sim.agent import ScriptTurn


class Faults(BaseModel):
    """Fault script for one request or one replica; every field is optional."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # timing
    headers_delay_s: float | None = Field(None, ge=0, description="wait before status+headers")
    ttft_delay_s: float | None = Field(None, ge=0, description="after headers, before 1st event")
    prefill_pings_s: float | None = Field(
        None, gt=0, description="during ttft_delay_s, the API's keep-alive every this many "
        "seconds (an SSE comment; Messages: event: ping), as some servers send in a prefill")
    chunk_interval_s: float | None = Field(None, ge=0, description="fixed gap between events")
    stall_after_chunks: int | None = Field(None, ge=0)
    stall_s: float | None = Field(None, ge=0)
    # scripted content
    chunks: list[str] | None = Field(None, description="emit exactly these content deltas")
    output_tokens: int | None = Field(None, ge=1, description="natural output length (tokens)")
    tool_args_chunks: int | None = Field(None, ge=1, description="argument deltas of a tool call")
    tool_call_after_chunks: int | None = Field(
        None, ge=0, description="chunks[:N] are content, chunks[N:] the arguments of a tool call"
    )
    script: list[ScriptTurn] | None = Field(
        None, description="agent turns in order: model turn k of a request with tools answers "
        "script[k] (engines/sim/agent.py); past the end, generated text")
    script_text_when: list[str] | None = Field(
        None, description="a request with a user message containing one of these phrases is "
        "answered with generated text, not its scripted turn (an agent's summary request, or "
        "a conversation continued from a summary)")
    continuation_diverges: bool = Field(
        False, description="a continuation (continue_final_message; a completions prompt "
        "continuing its text) that regenerates a word (its carried text does not end in "
        "whitespace: the gateway's token healing left the last word out) starts with '~' "
        "before what an uninterrupted generation has there: sampling chose another token than "
        "the first attempt did")
    # connection and protocol faults
    reset_after_chunks: int | None = Field(None, ge=0, description="abort TCP after N events")
    malformed_after_chunks: int | None = Field(None, ge=0)
    error_after_chunks: int | None = Field(
        None, ge=0, description="vLLM's in-stream error event after N events, then [DONE] "
        "(what vLLM streams when generation raises after its 200); non-stream: HTTP error_code")
    error_code: int = Field(400, ge=400, le=599, description="code of error_after_chunks")
    status: int | None = Field(None, ge=100, le=599)
    retry_after: float | None = Field(None, ge=0)
    error_message: str | None = None
    error_type: str | None = None
    error_shape: Literal["nested", "flat"] | None = None
    # framing
    utf8_split: bool = False
    split_pause_s: float = Field(0.05, ge=0)
    comments: bool = False
    crlf: bool = False
    multiline_data: bool = False
    no_event_lines: bool = Field(
        False, description="typed events (Messages, Responses) written as bare data: lines, "
        "without their event: line (what some Anthropic-compatible servers and proxies send)")
    # process
    crash: bool = False

    def merged(self, override: Faults | None) -> Faults:
        """This (replica) script with the fields ``override`` (a request's) explicitly set."""
        if override is None or not override.model_fields_set:
            return self
        if not self.model_fields_set:
            return override
        return self.model_copy(update=override.model_dump(exclude_unset=True))

    @property
    def touches_stream(self) -> bool:
        """True when events need the slow path (framing or counted faults)."""
        return bool(
            self.utf8_split
            or self.comments
            or self.crlf
            or self.multiline_data
            or self.no_event_lines
            or self.stall_after_chunks is not None
            or self.reset_after_chunks is not None
            or self.malformed_after_chunks is not None
            or self.error_after_chunks is not None
        )


NO_FAULTS = Faults()
