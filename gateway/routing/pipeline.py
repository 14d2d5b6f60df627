"""One pool's router: filters → weighted scorers → picker, with the state store's bindings.

For each attempt, candidates are the pool's usable replicas not tried yet. With session state
(a ``prefix`` or ``session`` weight and the store answering):

1. **Stay.** The affinity scorers (``prefix``, ``session``) name the replica that holds the
   session's conversation; if it is a candidate and not ``overloaded`` (request load over
   ``max(overload_min, overload_c × mean)``: a queue, not a burst) the request goes there,
   whatever the momentary loads. Every turn that leaves it re-prefills the whole conversation
   (seconds at long context), which costs far more than waiting behind a few requests that the
   engine batches anyway (SGLang's cache-aware router and llm-d keep affinity the same way
   unless a replica is clearly imbalanced).
   **Shed** (``rebalance``): sessions bound while most replicas were down all sit on the few
   that were up, and staying would keep them there for good. A replica holding more than its
   share of the active sessions (``filters.over_share``: ``max(ceil(S/n) + 1, floor(c ×
   S/n))``) while another candidate has room sheds the excess among the sessions bound while
   fewer replicas were candidates than now, cheapest to move first: such a session leaves
   when fewer than the excess of them have a shorter conversation (``ledger.cheaper_on``), so
   the shortest cached prefixes move and the longest stay. A session bound with every replica
   to choose from is never shed: a healthy steady state (sessions ending and starting
   included) never moves a session.
2. **(Re)bind.** A new session, or one whose replica is gone, tried, overloaded or shedding, is
   bound
   under the bounded-load rule (Mirrokni, Thorup, Zadimoghaddam 2018) with **active sessions**
   as the load (``session_ledger``; shared by every gateway replica through Redis when the
   state store is Redis, ``session_ledger_redis``): no replica that would then hold more than
   ``ceil(c × (S + 1) / n)`` sessions, c = ``bounded_load_c``; overloaded replicas are skipped
   too. Among the rest
   the weighted scorers pick: ``prefix`` favours the replica holding the longest (even partial)
   prefix of the conversation, ``load`` the one with fewest requests and sessions, ``hash``
   breaks ties along the session's consistent-hash order.

The bindings are rewritten to the replica actually picked (the table follows the session), and
the ledger moves the session's count with it. Without session state (``weights`` of ``load``
and/or ``hash`` only) every request is scored, the bound applying to requests in flight. When
the store cannot answer (Redis down), the weights become ``{hash: 1}``: consistent hashing on
the session key, the same answer on every gateway replica.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Collection, Sequence

from gateway.fleet.pools import Pool, Replica, replica_load
from gateway.routing.filters import not_tried, over_share, overloaded, under_bound
from gateway.routing.fit import fitting, has_room
from gateway.routing.hashring import hash_order
from gateway.routing.keys import RouteRequest, sampled_indices
from gateway.routing.kv_placement import CHARS_PER_TOKEN, decide
from gateway.routing.picker import RoundRobin, pick_best, weighted_scores
from gateway.routing.scorers import ScoreContext
from gateway.routing.session_ledger import SessionLedger
from gateway.routing.session_ledger_redis import RedisSessionLedger
from gateway.routing.store import Lookup, RoutingStore

MAX_RECORDED_BLOCKS = 1024  # state-store writes per request at most
DEGRADED_WEIGHTS = {"hash": 1.0}


class PoolRouter:
    """Picks a replica of ``pool`` for one attempt; ``decisions`` counts why (metrics)."""

    def __init__(
        self, pool: Pool, store: RoutingStore, rng: random.Random | None = None,
        shared_ledger: RedisSessionLedger | None = None,
    ) -> None:
        self.pool = pool
        self.store = store
        self.rng = rng or random.Random()
        self.round_robin = RoundRobin()
        self.decisions: Counter[str] = Counter()
        self.placements: Counter[str] = Counter()  # stay | move | wait (kv_placement)
        cfg = pool.config.routing
        # active sessions per replica: this process's ledger, and with Redis the shared one
        # (which keeps this one in step and falls back to it)
        self.ledger = SessionLedger(cfg.session_idle_s, max(16, cfg.table_max_entries // 4),
                                    max_bytes=cfg.table_max_bytes // 4)
        self.shared_ledger = shared_ledger
        self._pending: set[asyncio.Task[None]] = set()

    async def pick(
        self,
        route: RouteRequest | None,
        candidates: Sequence[Replica],
        exclude: Collection[Replica] = (),
    ) -> Replica | None:
        """The replica for the next attempt, or None when no candidate is left."""
        cfg = self.pool.config.routing
        cands = not_tried(candidates, exclude)
        if route is not None and route.tokens:
            cands = fitting(cands, route.tokens)  # replicas too small for it never see it
        if not cands:
            return None
        if cfg.policy == "round_robin" or route is None:
            self.decisions["round_robin" if route is not None else "no_route"] += 1
            if route is None and cfg.policy != "round_robin":
                cands = [min(cands, key=lambda r: r.inflight)]
            return self.round_robin.pick(self.pool.replicas, cands)
        weights: dict[str, float] = {k: v for k, v in cfg.weights.items()}
        blocks: list[bytes] = []
        if weights.get("prefix"):
            blocks = await route.chain(cfg.chunk_chars, cfg.max_hash_chars)
        indices = sampled_indices(len(blocks))
        lookup: Lookup | None = None
        uses_store = bool(weights.get("prefix") or weights.get("session"))
        if uses_store:
            key = self.pool.key
            if key not in route.lookups:
                route.lookups[key] = await self.store.lookup(
                    key, route.session_key, blocks, indices
                )
            lookup = route.lookups[key]
            if lookup is None:
                weights = DEGRADED_WEIGHTS
        now = time.monotonic()
        loads = {r: replica_load(r, now) for r in cands}
        ctx = ScoreContext(lookup, len(blocks), hash_order(route.session_key, self.pool.replicas),
                           loads, min(len(blocks), route.lead_blocks(cfg.chunk_chars)),
                           tokens=route.tokens, now=now, fills_context=route.fills_context)
        reason: str | None = None
        if uses_store and lookup is not None:
            choice, reason = await self._pick_session(
                route, ctx, cands, weights, now
            )
        else:
            bounded = under_bound(cands, loads, cfg.bounded_load_c, cfg.bounded_load_min)
            choice = pick_best(bounded, weighted_scores(ctx, bounded, weights), self.rng)
        assert choice is not None
        if uses_store:
            # this process's ledger keeps what shedding needs (size, candidates at binding);
            # the shared one (Redis) gives the bounded-load rule every gateway's sessions
            self.ledger.touch(route.session_key, choice.name, now, size=route.chars,
                              candidates=len(cands))
            if self.shared_ledger is not None:
                names = [r.name for r in self.pool.replicas]
                self.shared_ledger.touch(route.session_key, choice.name, now, names)
        reason = reason or self._reason(lookup, uses_store, choice, ctx.lead_blocks)
        self.decisions[reason] += 1
        if uses_store and lookup is not None:
            held = lookup.depth.get(choice.name, 0)
            todo = [i for i in indices if i >= held - 1][:MAX_RECORDED_BLOCKS]
            self._record(route.session_key, blocks, todo, choice.name)
        return choice

    async def _pick_session(
        self, route: RouteRequest, ctx: ScoreContext, cands: list[Replica],
        weights: dict[str, float], now: float,
    ) -> tuple[Replica | None, str | None]:
        """Stay on the session's replica unless it is overloaded, sheds this session, or (with
        a ``headroom`` weight) has no free KV for this request and moving it is quicker than
        waiting (``_place``); else
        (re)bind it under the bounded-load rule on active sessions (see the module
        docstring). Returns the replica and ``"rebalance"`` when the session was shed,
        ``"kv-headroom"`` when it moved for KV room."""
        session = route.session_key
        cfg = self.pool.config.routing
        hot = overloaded(cands, ctx.loads, cfg.overload_c, cfg.overload_min)
        affinity = {k: weights[k] for k in ("prefix", "session") if weights.get(k)}
        aff = weighted_scores(ctx, cands, affinity)
        top = max(aff)
        leaving: Replica | None = None
        if top > 0:
            home = [r for r, a in zip(cands, aff, strict=True) if a >= top - 1e-9]
            if len(home) > 1:  # same depth on several: the least loaded of them
                low = min(ctx.loads[r] for r in home)
                home = [r for r in home if ctx.loads[r] == low]
            if home[0] not in hot:
                moving = False
                if weights.get("headroom") and ctx.tokens > 0:  # capacity-aware placement
                    moving = self._place(route, ctx, home[0], [r for r in cands if r not in hot])
                if not moving and not self._sheds(session, home[0], cands, hot, now):
                    return home[0], None
                leaving = home[0]
        if self.shared_ledger is not None:  # every gateway's sessions, not only this one's
            counts = await self.shared_ledger.counts(now, session, [r.name for r in cands])
        else:
            counts = self.ledger.counts(now, without=session)
        others = [r for r in cands if r is not leaving]
        ctx.sessions = {r: counts.get(r.name, 0) for r in others}
        cool = [r for r in others if r not in hot] or others
        if route.kv_placement == "move" and leaving is not None:  # only where it fits
            cool = [r for r in cool if has_room(r, ctx.need(r), now)] or cool
        bounded = [r for r in under_bound(others, ctx.sessions, cfg.bounded_load_c) if r in cool]
        bounded = bounded or cool
        choice = pick_best(bounded, weighted_scores(ctx, bounded, weights), self.rng)
        if leaving is not None:
            return choice, "kv-headroom" if route.kv_placement == "move" else "rebalance"
        return choice, None

    def _place(self, route: RouteRequest, ctx: ScoreContext, home: Replica,
               cool: list[Replica]) -> bool:
        """Weigh moving this turn off ``home`` against waiting there (``kv_placement.decide``
        with the pool's measured rates and each candidate's known prefix depth), record the
        choice on ``route`` and in ``placements``; True to move."""
        chunk = self.pool.config.routing.chunk_chars
        depth = ctx.lookup.depth if ctx.lookup is not None else {}
        need = ctx.need(home)  # a request sent without its cap: up to home's context
        placement, _ = decide(
            home, [r for r in cool if r is not home], need, route.output_cap + need - ctx.tokens,
            lambda r: depth.get(r.name, 0) * chunk // CHARS_PER_TOKEN, self.pool.rates, ctx.now,
        )
        route.kv_placement, route.kv_figures = placement.choice, placement.figures()
        self.placements[placement.choice] += 1
        return placement.choice == "move"

    def _sheds(
        self, session: str, home: Replica, cands: list[Replica], hot: set[Replica], now: float
    ) -> bool:
        """True when this session, bound to ``home`` while fewer replicas were candidates than
        now, is among the excess cheapest to move off ``home``, which holds more than its share
        of active sessions while another candidate has room (module docstring)."""
        ledger = self.ledger
        if ledger.replica_of(session, now) != home.name or not ledger.movable(session, len(cands)):
            return False
        counts = ledger.counts(now)
        others = [counts.get(r.name, 0) for r in cands if r is not home and r not in hot]
        excess = over_share(counts.get(home.name, 0), sum(counts.values()), others,
                            self.pool.config.routing.bounded_load_c)
        return excess > 0 and ledger.cheaper_on(home.name, session, len(cands)) < excess

    @staticmethod
    def _reason(lookup: Lookup | None, uses_store: bool, choice: Replica, lead: int) -> str:
        if not uses_store:
            return "scored"
        if lookup is None:
            return "hash_fallback"
        best = max(lookup.depth, key=lookup.depth.__getitem__, default=None)
        if best is not None and lookup.depth[best] <= lead:
            best = None  # only the shared preamble matched
        if best == choice.name or (best is None and lookup.session == choice.name):
            return "prefix" if best is not None else "session"
        if best is None and lookup.session is None:
            return "new"
        return "spill"

    def _record(self, session: str, blocks: list[bytes], indices: list[int], name: str) -> None:
        if self.store.record_nowait(self.pool.key, session, blocks, indices, name):
            return  # in-process: done, no task (one less task and loop turn per request)
        coro = self.store.record(self.pool.key, session, blocks, indices, name)
        task = asyncio.get_running_loop().create_task(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def forget(self, session: str, shared: bool = True) -> None:
        """``session`` (its routing key, ``RouteRequest.session_key``) ended: its binding and
        its place in the active-session ledgers are released, this process's always, the
        shared ones (Redis) when ``shared`` (an explicit end; an idle one, seen by this
        process only, leaves them to their TTLs); its prefix blocks stay (shared with
        conversations that start the same)."""
        self.ledger.forget(session)
        if not shared:
            forget_local = getattr(self.store, "forget_nowait", None)
            if forget_local is not None:  # an in-process store: this process's own
                forget_local(self.pool.key, session)
            return
        await self.drain()  # a binding still being written to Redis would come back
        if self.shared_ledger is not None:
            await self.shared_ledger.forget(session, [r.name for r in self.pool.replicas])
        await self.store.forget(self.pool.key, session)

    async def drain(self) -> None:
        """Wait for the bindings being written (tests, shutdown)."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)
        if self.shared_ledger is not None:
            await self.shared_ledger.drain()
