"""The sessions this gateway process served lately, for the console's "most active" and "most
expensive" tables. Bounded: at most ``max_sessions`` entries, the least recently seen dropped
first (an LRU), O(1) per request.

A session is an ``x-session-id`` within one API key (the pair names it, as routing and
``/v1/usage`` scope sessions by key). Per session: turns (requests), errors, tokens (prompt,
of which cached, and completion), cost (USD), requests per served tier, and two
exponentially decayed rates with half-life ``half_life_s``: requests per minute and USD per
hour. A decayed count ``c = Σ 2^(−age/h)`` of events arriving at a steady rate ``r`` tends to
``r·h/ln 2``, so the rate read is ``c·ln 2/h`` (the same estimator as an EWMA of the rate,
e.g. Unix load averages); it falls back to 0 as a session goes quiet, which is what "now"
means in the console. Totals count only what this process served since it first saw the
session; ``GET /v1/usage`` has the totals of every gateway replica.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import takewhile
from operator import attrgetter
from typing import Any

#: Half-life of the sessions' request and cost rates (seconds).
HALF_LIFE_S = 60.0
#: Characters of a session id kept (a client's header; longer ids are cut, marked with …).
MAX_ID_CHARS = 128


def clip_id(session_id: str | None) -> str | None:
    """``session_id`` cut to ``MAX_ID_CHARS`` characters (the last one ``…`` when cut)."""
    if session_id is None or len(session_id) <= MAX_ID_CHARS:
        return session_id
    return session_id[: MAX_ID_CHARS - 1] + "…"


@dataclass(slots=True)
class SessionStats:
    """One session's totals at this gateway process; times monotonic seconds."""

    key_id: str | None
    session_id: str
    first_seen: float
    last_seen: float
    turns: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    #: prompt + completion tokens of the latest turn: the KV the session holds on its replica
    #: (what its next turn resends, cached there)
    last_tokens: int = 0
    tiers: dict[str, int] = field(default_factory=dict)
    #: the parent session of a subagent's session (None for a top-level one)
    parent: str | None = None
    #: how it ended: ``explicit`` or ``idle`` (``gateway.admit.session_end``); None while on
    ended: str | None = None
    _activity: float = 0.0  # decayed requests at ``last_seen``
    _spend: float = 0.0  # decayed USD at ``last_seen``
    # rankings independent of the time they are read: at any ``now``, value × 2^(−(now −
    # last_seen)/h) orders as log2(value) + last_seen/h, so the tables sort on a stored float
    rank_activity: float = -math.inf
    rank_spend: float = -math.inf

    def _decay(self, now: float, half_life_s: float) -> float:
        return 2.0 ** (-max(0.0, now - self.last_seen) / half_life_s)

    def requests_per_min(self, now: float, half_life_s: float = HALF_LIFE_S) -> float:
        """Decayed request rate at ``now`` (requests per minute)."""
        return self._activity * self._decay(now, half_life_s) * math.log(2) / half_life_s * 60

    def usd_per_hour(self, now: float, half_life_s: float = HALF_LIFE_S) -> float:
        """Decayed spending rate at ``now`` (USD per hour)."""
        return self._spend * self._decay(now, half_life_s) * math.log(2) / half_life_s * 3600

    def to_dict(
        self, now: float, wall_now: float, half_life_s: float = HALF_LIFE_S
    ) -> dict[str, Any]:
        """The console's row: ids, turns, tokens, cached share (0..1 of prompt tokens), cost
        (USD), rates, per-tier turns, first/last seen (unix s)."""
        return {
            "session_id": self.session_id,
            "key_id": self.key_id,
            "turns": self.turns,
            "errors": self.errors,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "last_tokens": self.last_tokens,
            "cached_share": self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None,
            "cost_usd": round(self.cost_usd, 9),
            "requests_per_min": round(self.requests_per_min(now, half_life_s), 4),
            "usd_per_hour": round(self.usd_per_hour(now, half_life_s), 9),
            "tiers": dict(self.tiers),
            "parent_session_id": self.parent,
            "ended": self.ended,
            "first_seen": wall_now - (now - self.first_seen),
            "last_seen": wall_now - (now - self.last_seen),
        }


class SessionTable:
    """At most ``max_sessions`` sessions, least recently seen evicted first."""

    def __init__(self, max_sessions: int, half_life_s: float = HALF_LIFE_S) -> None:
        self.max_sessions = max_sessions
        self.half_life_s = half_life_s
        self._by_id: OrderedDict[tuple[str | None, str], SessionStats] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._by_id)

    def observe(
        self,
        key_id: str | None,
        session_id: str,
        now: float,
        *,
        tier: str | None,
        ok: bool,
        prompt: int = 0,
        cached: int = 0,
        completion: int = 0,
        cost_usd: float = 0.0,
        parent: str | None = None,
    ) -> SessionStats:
        """Count one finished request of the session at ``now`` (monotonic s); ``parent``:
        its parent session (a subagent's)."""
        session_id = clip_id(session_id) or ""
        k = (key_id, session_id)
        s = self._by_id.get(k)
        if s is None:
            s = SessionStats(key_id, session_id, now, now)
            self._by_id[k] = s
            if len(self._by_id) > self.max_sessions:
                self._by_id.popitem(last=False)
                self.evicted += 1
        else:
            self._by_id.move_to_end(k)
            f = s._decay(now, self.half_life_s)
            s._activity *= f
            s._spend *= f
            s.last_seen = max(s.last_seen, now)
        s.turns += 1
        s.ended = None  # a turn after an end: it goes on
        if parent is not None:
            s.parent = clip_id(parent)
        s.errors += 0 if ok else 1
        s.prompt_tokens += prompt
        s.cached_tokens += cached
        s.completion_tokens += completion
        if prompt or completion:
            s.last_tokens = prompt + completion
        s.cost_usd += cost_usd
        s._activity += 1.0
        s._spend += cost_usd
        h = self.half_life_s
        s.rank_activity = math.log2(s._activity) + s.last_seen / h
        s.rank_spend = math.log2(s._spend) + s.last_seen / h if s._spend > 0 else -math.inf
        if tier:
            s.tiers[tier] = s.tiers.get(tier, 0) + 1
        return s

    def end(self, key_id: str | None, session_id: str, how: str) -> None:
        """Mark a session ended ``how`` (``explicit`` or ``idle``), when it is in the table."""
        s = self._by_id.get((key_id, clip_id(session_id) or ""))
        if s is not None:
            s.ended = how

    def active(self, now: float, within_s: float) -> list[SessionStats]:
        """Sessions seen in the last ``within_s`` seconds, most recent first (the table is in
        the order sessions were last seen, so the walk stops at the first older one)."""
        horizon = now - within_s
        return list(takewhile(lambda s: s.last_seen >= horizon, reversed(self._by_id.values())))

    def top(self, now: float, within_s: float, n: int, by: str) -> list[SessionStats]:
        """The ``n`` sessions active within ``within_s`` with the highest ``by``:
        ``requests_per_min`` (most active), ``usd_per_hour`` (most expensive now) or
        ``last_tokens`` (the largest KV footprint); ties by total turns / cost / recency."""
        return top_sessions(self.active(now, within_s), n, by)


def top_sessions(sessions: list[SessionStats], n: int, by: str) -> list[SessionStats]:
    """The ``n`` of ``sessions`` ranked highest by ``by`` (see ``SessionTable.top``)."""
    key = _RANKINGS.get(by)
    if key is None:
        raise ValueError(f"unknown ranking {by!r}")
    return heapq.nlargest(n, sessions, key=key)


_RANKINGS = {
    "requests_per_min": attrgetter("rank_activity", "turns"),
    "usd_per_hour": attrgetter("rank_spend", "cost_usd"),
    "last_tokens": attrgetter("last_tokens", "last_seen"),  # the largest KV footprints
}


#: Levels of subagents listed below a tree's top session (deeper ones still count in
#: ``total``): as ``/v1/usage``'s tree (``gateway.telemetry.usage_tree.MAX_DEPTH``).
MAX_TREE_DEPTH = 4


def session_trees(
    sessions: list[SessionStats], n: int, now: float, wall_now: float,
    half_life_s: float = HALF_LIFE_S,
) -> list[dict[str, Any]]:
    """The ``n`` most expensive sessions of ``sessions`` that have subagents among them, each a
    row (``SessionStats.to_dict``) with ``children`` (its subagents' rows, theirs nested the
    same way, ``MAX_TREE_DEPTH`` levels) and ``total`` (turns, tokens and cost rolled up over
    the whole subtree). Linear in ``sessions`` and iterative: a client's chain of thousands of
    sessions, each naming the one before as its parent, neither recurses nor rescans."""
    by_parent: dict[tuple[str | None, str], list[SessionStats]] = {}
    for s in sessions:
        if s.parent is not None:
            by_parent.setdefault((s.key_id, s.parent), []).append(s)
    known = {(s.key_id, s.session_id) for s in sessions}
    roots = [s for s in sessions if (s.key_id, s.session_id) in by_parent
             and (s.parent is None or (s.key_id, s.parent) not in known)]
    trees = [_tree(s, by_parent, now, wall_now, half_life_s) for s in roots]
    trees.sort(key=lambda t: t["total"]["cost_usd"], reverse=True)
    return trees[:n]


def _tree(
    root: SessionStats, by_parent: dict[tuple[str | None, str], list[SessionStats]],
    now: float, wall_now: float, half_life_s: float,
) -> dict[str, Any]:
    """``root``'s row with its subtree (``session_trees``): visited depth first without
    recursion, each session once, rows built children first."""
    seen = {root.session_id}
    order: list[tuple[SessionStats, int, list[SessionStats]]] = []
    stack = [(root, 0)]
    while stack:
        s, depth = stack.pop()
        kids = [c for c in by_parent.get((s.key_id, s.session_id), []) if c.session_id not in seen]
        seen.update(c.session_id for c in kids)
        order.append((s, depth, kids))
        stack.extend((c, depth + 1) for c in reversed(kids))
    rows: dict[int, dict[str, Any]] = {}
    for s, depth, kids in reversed(order):  # every child before its parent
        row = s.to_dict(now, wall_now, half_life_s)
        subs = [rows.pop(id(c)) for c in kids]
        total = {k: row[k] + sum(c["total"][k] for c in subs)
                 for k in ("turns", "prompt_tokens", "completion_tokens", "cost_usd")}
        total["cost_usd"] = round(total["cost_usd"], 9)
        row["children"] = subs if depth < MAX_TREE_DEPTH else []
        row["total"] = total
        rows[id(s)] = row
    return rows[id(root)]


def recently_ended(sessions: list[SessionStats], n: int, now: float, wall_now: float,
                   half_life_s: float = HALF_LIFE_S) -> list[dict[str, Any]]:
    """The ``n`` sessions of ``sessions`` that ended, most recently seen first, with how."""
    done = [s for s in sessions if s.ended is not None]
    done.sort(key=lambda s: s.last_seen, reverse=True)
    return [s.to_dict(now, wall_now, half_life_s) for s in done[:n]]
