"""One simulated request as the responders see it: its prompts, plans, engine job, faults, ids
and usage so far (built by ``engines.sim.completions``, read by ``engines.sim.responder``)."""

from __future__ import annotations

import time
from typing import Any

from engines.sim import protocol as P
from engines.sim.engine import Job
from engines.sim.faults import Faults
from engines.sim.plans import Plan
from engines.sim.replica_state import SimState
from engines.sim.textgen import Prompt


class RequestError(Exception):
    """A client error answered with a vLLM-shaped error body (of the endpoint's API)."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type_: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type_ = status, message, param, type_


class RequestContext:
    """What the responders need about one request. ``body`` is the request as the client sent
    it (for the Responses and Messages APIs, not the chat form the engine planned from)."""

    __slots__ = ("body", "chat", "created", "faults", "job", "model", "plans", "prompts",
                 "reset", "rid", "state")

    def __init__(self, state: SimState, chat: bool, prompts: list[Prompt], plans: list[Plan],
                 job: Job | None, faults: Faults, body: dict[str, Any],
                 rid: str | None = None) -> None:
        self.state, self.chat, self.prompts, self.plans = state, chat, prompts, plans
        self.job, self.faults, self.body = job, faults, body
        self.model = state.config.model
        self.rid = rid or P.random_id("chatcmpl-" if chat else "cmpl-")
        self.created = int(time.time())
        self.reset = False

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens of the request."""
        return sum(p.num_tokens for p in self.prompts)

    def cached_tokens(self) -> int:
        """Prompt tokens the engine served from its prefix cache (one count per prompt)."""
        if self.job is None:
            return 0
        n = max(1, len(self.plans) // len(self.prompts))
        return sum(s.cached_tokens for s in self.job.seqs if s.index % n == 0)

    @property
    def completion_tokens(self) -> int:
        """Output tokens delivered so far (every plan)."""
        return sum(pl.pos for pl in self.plans)

    def usage(self, completion: int | None = None) -> dict[str, Any]:
        """Usage so far (``completion`` None: every plan's full length)."""
        prompt = self.prompt_tokens
        if completion is None:
            completion = self.completion_tokens
        cached = None
        if self.state.config.enable_prompt_tokens_details:
            cached = self.cached_tokens()
        return P.usage(prompt, completion, cached)
