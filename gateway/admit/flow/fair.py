"""Fair queuing inside one priority band: across API keys (weighted), and across the sessions
of each key (equal), costed in estimated tokens. Pure: no clock, no I/O.

The discipline is hierarchical start-time fair queuing (SFQ; Goyal, Vin, Cheng, "Start-time
Fair Queuing", SIGCOMM 1996), applied at two levels with the same rule:

- each flow (a key; inside a key, a session) has a start tag ``S`` and a finish tag ``F``;
- a flow that becomes backlogged starts at ``S = max(v, F)``, ``v`` being the level's virtual
  time (the start tag of the last flow served there);
- the backlogged flow with the smallest ``S`` is served (ties: the one that became backlogged
  first); serving a request of cost ``c`` sets ``v = S``, ``F = S + c / w`` (``w``: the key's
  weight; 1 for sessions) and, if the flow is still backlogged, ``S = F``.

SFQ bounds the gap between two backlogged flows' served cost per unit weight by
``c_max_i / w_i + c_max_j / w_j`` over any interval, whatever the arrival pattern, so a key
flooding at 10x gets its weight's share and no more, and a light key's request waits at most
about one maximum-size request of each other key. ``settle`` corrects a flow's finish tag by
the actual tokens once a request finished (estimates use ``max_tokens``; an agent that asks for
4k and writes 200 is charged 200), so the shares hold in served tokens. Idle flows are kept only
while their finish tag is ahead of the virtual time, and everything restarts when the band
empties (the end of a busy period), so memory is bounded by the backlog.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import count
from typing import Generic, Protocol, TypeVar


class FairItem(Protocol):
    """What the queue reads of a waiting request: its flows and its cost (tokens)."""

    key: str
    session: str
    cost: float


T = TypeVar("T", bound=FairItem)


@dataclass(slots=True, eq=False)
class _Session(Generic[T]):
    start: float = 0.0
    finish: float = 0.0
    token: int = 0  # heap entries of an older token are stale
    items: deque[T] = field(default_factory=deque)


@dataclass(slots=True, eq=False)
class _Key(Generic[T]):
    weight: float
    start: float = 0.0
    finish: float = 0.0
    token: int = 0
    v: float = 0.0  # the sessions' virtual time
    queued: int = 0
    queued_cost: float = 0.0
    sessions: dict[str, _Session[T]] = field(default_factory=dict)
    heap: list[tuple[float, int, int, str]] = field(default_factory=list)


class FairQueue(Generic[T]):
    """Requests of one band, fair across keys (weighted) and sessions. ``push``, ``pop``,
    ``remove`` and ``settle``; ``len()`` is the number waiting."""

    def __init__(self) -> None:
        self.v = 0.0
        self._keys: dict[str, _Key[T]] = {}
        self._heap: list[tuple[float, int, int, str]] = []
        self._tie = count()
        self._n = 0
        self._pops = 0

    def __len__(self) -> int:
        return self._n

    def push(self, item: T, weight: float = 1.0) -> None:
        """Queue ``item`` behind the earlier requests of its session; ``weight`` (> 0) is its
        key's share (the latest value given for a key is used)."""
        k = self._keys.get(item.key)
        if k is None:
            k = self._keys[item.key] = _Key(weight)
        k.weight = weight
        s = k.sessions.get(item.session)
        if s is None:
            s = k.sessions[item.session] = _Session()
        if not s.items:
            s.start = max(k.v, s.finish)
            self._push_session(k, item.session, s)
        s.items.append(item)
        if not k.queued:
            k.start = max(self.v, k.finish)
            self._push_key(item.key, k)
        k.queued += 1
        k.queued_cost += item.cost
        self._n += 1

    def peek(self) -> T | None:
        """The request ``pop`` would return, without taking it."""
        key = self._top(self._heap, self._keys)
        if key is None:
            return None
        k = self._keys[key]
        session = self._top(k.heap, k.sessions)
        assert session is not None
        return k.sessions[session].items[0]

    def pop(self) -> T | None:
        """Take the next request by the rule in the module docstring (None when empty)."""
        key = self._take(self._heap, self._keys)
        if key is None:
            return None
        k = self._keys[key]
        name = self._take(k.heap, k.sessions)
        assert name is not None
        s = k.sessions[name]
        item = s.items.popleft()
        k.v = s.start
        s.finish = s.start + item.cost
        if s.items:
            s.start = s.finish
            self._push_session(k, name, s)
        elif s.finish <= k.v:
            del k.sessions[name]
        self.v = k.start
        k.finish = k.start + item.cost / k.weight
        k.queued -= 1
        k.queued_cost -= item.cost
        self._n -= 1
        if k.queued:
            k.start = k.finish
            self._push_key(key, k)
        self._pops += 1
        if not self._n:  # idle: every tag may restart from zero (SFQ, end of a busy period)
            self._reset()
        elif self._pops % 1024 == 0:
            self._prune()
        return item

    def remove(self, item: T) -> bool:
        """Take ``item`` out without serving it (client gone, deadline, promotion); False when
        it is not queued here. Its flows keep their tags (no cost is charged)."""
        k = self._keys.get(item.key)
        s = k.sessions.get(item.session) if k is not None else None
        if k is None or s is None:
            return False
        try:
            s.items.remove(item)
        except ValueError:
            return False
        if not s.items:
            s.token += 1  # its heap entry goes stale
        k.queued -= 1
        k.queued_cost -= item.cost
        self._n -= 1
        if not k.queued:
            k.token += 1
        return True

    def settle(self, key: str, session: str, delta: float) -> None:
        """Charge ``delta`` more tokens (negative: refund) to a request of ``key``/``session``
        served earlier: its flows' finish tags move by ``delta / weight`` and ``delta``
        (never below the virtual time). A backlogged flow's next start moves with it."""
        k = self._keys.get(key)
        if k is None or not delta:
            return
        k.finish = max(self.v, k.finish + delta / k.weight)
        if k.queued:
            k.start = k.finish
            self._push_key(key, k)
        s = k.sessions.get(session)
        if s is not None:
            s.finish = max(k.v, s.finish + delta)
            if s.items:
                s.start = s.finish
                self._push_session(k, session, s)

    def queued_cost(self) -> dict[str, tuple[float, float]]:
        """``{key: (queued tokens, weight)}`` of every key with requests waiting."""
        return {name: (k.queued_cost, k.weight) for name, k in self._keys.items() if k.queued}

    def __iter__(self) -> Iterator[T]:
        """Every waiting request (no particular order)."""
        for k in self._keys.values():
            for s in k.sessions.values():
                yield from s.items

    # -- internals -------------------------------------------------------------------------
    def _push_key(self, name: str, k: _Key[T]) -> None:
        k.token += 1
        heapq.heappush(self._heap, (k.start, next(self._tie), k.token, name))

    def _push_session(self, k: _Key[T], name: str, s: _Session[T]) -> None:
        s.token += 1
        heapq.heappush(k.heap, (s.start, next(self._tie), s.token, name))

    @staticmethod
    def _top(heap: list[tuple[float, int, int, str]], flows: dict) -> str | None:
        while heap:
            _, _, token, name = heap[0]
            f = flows.get(name)
            if f is not None and f.token == token:
                return name
            heapq.heappop(heap)
        return None

    def _take(self, heap: list[tuple[float, int, int, str]], flows: dict) -> str | None:
        name = self._top(heap, flows)
        if name is not None:
            heapq.heappop(heap)
            flows[name].token += 1
        return name

    def _reset(self) -> None:
        self.v = 0.0
        self._keys.clear()
        self._heap.clear()

    def _prune(self) -> None:
        """Forget idle flows whose finish tag the virtual time has passed (they would start
        at the virtual time anyway)."""
        for name in [n for n, k in self._keys.items() if not k.queued and k.finish <= self.v]:
            del self._keys[name]
        for k in self._keys.values():
            for sn in [n for n, s in k.sessions.items() if not s.items and s.finish <= k.v]:
                del k.sessions[sn]
