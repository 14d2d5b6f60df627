"""What scorers read: one request's routing facts, computed once per pick."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.fleet.pools import Replica
from gateway.routing.fit import tokens_on
from gateway.routing.store import Lookup


@dataclass(slots=True)
class ScoreContext:
    """``lookup``: the state store's bindings (None: store unavailable or not consulted);
    ``blocks``: the request's prefix block count; ``order``: the session's consistent-hash
    order of the whole pool; ``loads``: requests per candidate (``fleet.pools.replica_load``);
    ``lead_blocks``: blocks of the shared preamble (system prompt) that prove no affinity;
    ``sessions``: active sessions per candidate (``session_ledger``) when a session is being bound,
    None for policies that keep no session state; ``tokens`` and ``now`` for the headroom
    scorer; ``fills_context``: the request was sent without its output cap, so on a replica
    it needs that replica's ``max_model_len`` (``need``)."""

    lookup: Lookup | None
    blocks: int
    order: list[Replica]
    loads: dict[Replica, int] = field(default_factory=dict)
    lead_blocks: int = 0
    sessions: dict[Replica, int] | None = None
    tokens: int = 0  # the request's prompt + output cap (routing.fit); 0 = not counted
    now: float = 0.0  # monotonic s of the pick (freshness of scraped engine values)
    fills_context: bool = False

    def need(self, r: Replica) -> int:
        """The tokens this request holds on ``r`` at most (``routing.fit.tokens_on``)."""
        return tokens_on(r, self.tokens, self.fills_context)
