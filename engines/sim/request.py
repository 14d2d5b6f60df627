"""One simulated request as the responders see it: its prompts, plans, engine job, faults, ids
and usage so far (built by ``engines.sim.completions``, read by ``engines.sim.responder``)."""

from __future__ import annotations

import time
from typing import Any

from engines.sim import protocol as P
from engines.sim.engine import Job
from engines.sim.faults import Faults
from engines.sim.plans import Plan
from engines.sim.state import SimState
from engines.sim.textgen import Prompt


class RequestContext:
    """What the responders need about one request."""

    __slots__ = ("body", "chat", "created", "faults", "job", "model", "plans", "prompts",
                 "reset", "rid", "state")

    def __init__(self, state: SimState, chat: bool, prompts: list[Prompt], plans: list[Plan],
                 job: Job | None, faults: Faults, body: dict[str, Any]) -> None:
        self.state, self.chat, self.prompts, self.plans = state, chat, prompts, plans
        self.job, self.faults, self.body = job, faults, body
        self.model = state.config.model
        self.rid = P.random_id("chatcmpl-" if chat else "cmpl-")
        self.created = int(time.time())
        self.reset = False

    def usage(self, completion: int | None = None) -> dict[str, Any]:
        """Usage so far (``completion`` None: every plan's full length)."""
        prompt = sum(p.num_tokens for p in self.prompts)
        if completion is None:
            completion = sum(pl.pos for pl in self.plans)
        cached = None
        if self.state.config.enable_prompt_tokens_details:
            cached = 0
            if self.job is not None:
                n = max(1, len(self.plans) // len(self.prompts))
                cached = sum(s.cached_tokens for s in self.job.seqs if s.index % n == 0)
        return P.usage(prompt, completion, cached)
