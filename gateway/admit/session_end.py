"""Sessions that end: explicitly (``x-speedgate-session-end: true`` on the last turn, see
``gateway.admit.session``) or idle (no request for ``session_idle_s``, the longest of the pools'
``routing.session_idle_s``: the window after which routing stops counting a session active).

An ended session's routing state is released: its session → replica binding in every pool
(memory table or Redis key), its place in the active-session ledgers (this process's and, with
Redis, the shared sets) and its entry in the auto tier's session table. Its prefix blocks stay:
they name a replica for any conversation that starts the same way, and a session that comes
back still finds its replica through them. Its usage totals stay (accounting) and say how it
ended (``explicit`` or ``idle``). An explicit end also drops its budget ledger (and those of
nothing else: a subagent's end leaves its parent's); an idle one keeps it, so waiting never
resets a budget: it expires ``budgets.session_ttl_s`` after the last request.

A session with a request in flight is never idle, however long that request runs (a long
generation outlasts ``session_idle_s``): the proxy marks each admitted request running
(``begin``) until it is observed finished (``observe``, or ``done`` on a path that skipped it).

A turn still running when another turn of its session ends it (an agent's parallel tool calls)
finishes after the end: its usage is counted, but it does not bring the session back (its
usage marked ended again, its routing state released again, not swept later as idle). A turn
that starts after the end resumes the session. Told apart by the request's start
(``RequestRecord.t_start``, monotonic) against the end's time on ``clock``.

``SessionEnds`` remembers when each session (per API key, at most ``max_sessions``, least
recently seen dropped first) was last seen and its routing key; ``sweep`` ends those idle
(called on every finished request and every ``idle_s / 4`` by ``run``). With several gateway
replicas each sweeps the sessions it served and releases only its own state (another gateway
may be serving the session): in Redis the active-session sets drop members idle for
``session_idle_s`` and the binding expires with ``routing.table_ttl_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from gateway.admit.budget import SessionBudgets
from gateway.fleet.pools import PoolRegistry
from gateway.routing.table import AffinityTable
from gateway.telemetry.usage_store import UsageStore

log = logging.getLogger("speedgate.sessions")

EXPLICIT, IDLE = "explicit", "idle"


class _Seen(NamedTuple):
    at: float  # monotonic s of its last request
    route_key: str | None  # its routing key (``RouteRequest.session_key``), when routed


class Running:
    """A request of a session in flight (``SessionEnds.begin``); given back once."""

    __slots__ = ("key", "open")

    def __init__(self, key: tuple[str | None, str]) -> None:
        self.key, self.open = key, True


class SessionEnds:
    """Ends sessions and releases their state (module docstring). ``auto_tables``: the auto
    tier's per-model session tables; ``on_end(key_id, session_id, how)`` is told of every
    end (the console). Clock injected for tests (monotonic seconds)."""

    def __init__(
        self,
        pools: PoolRegistry,
        budgets: SessionBudgets,
        usage: UsageStore,
        idle_s: float,
        *,
        auto_tables: Iterable[AffinityTable] = (),
        on_end: Callable[[str | None, str, str], None] | None = None,
        max_sessions: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pools = pools
        self.budgets = budgets
        self.usage = usage
        self.idle_s = idle_s
        self.auto_tables = list(auto_tables)
        self.on_end = on_end
        self.max_sessions = max_sessions
        self.clock = clock
        self.ended: dict[str, int] = {EXPLICIT: 0, IDLE: 0}
        self._seen: OrderedDict[tuple[str | None, str], _Seen] = OrderedDict()
        # explicitly ended sessions → when (clock s): a turn started before stays ended
        self._ended_at: OrderedDict[tuple[str | None, str], float] = OrderedDict()
        # sessions with requests in flight → how many (bounded by the requests in flight)
        self._running: dict[tuple[str | None, str], int] = {}

    def __len__(self) -> int:
        return len(self._seen)

    def begin(self, key_id: str | None, session_id: str | None) -> Running | None:
        """A request of the session was admitted: the session is not idle until it is done
        (``observe`` with the handle, else ``done``). None without a session."""
        if session_id is None:
            return None
        k = (key_id, session_id)
        self._running[k] = self._running.get(k, 0) + 1
        return Running(k)

    def done(self, running: Running | None) -> None:
        """Give back ``begin``'s handle (nothing when it was given back already)."""
        if running is None or not running.open:
            return
        running.open = False
        n = self._running.pop(running.key, 0) - 1
        if n > 0:
            self._running[running.key] = n

    async def observe(self, rec: Any, route_key: str | None,
                      running: Running | None = None) -> None:
        """A request of ``rec.session_id`` (key ``rec.key_id``) finished: end it when it asked
        to (``rec.session_end``), else note it seen now; then end the sessions idle too long.
        ``running``: its ``begin`` handle, given back. Never raises (logged)."""
        self.done(running)
        try:
            if rec.session_id is not None:
                k = (rec.key_id, rec.session_id)
                ended_at = self._ended_at.get(k)
                started = getattr(rec, "t_start", None)
                if rec.session_end:
                    self._seen.pop(k, None)
                    await self.end(rec.key_id, rec.session_id, route_key, EXPLICIT)
                elif (ended_at is not None and started is not None
                      and started <= ended_at):  # in flight at its end: it stays ended
                    await self._release(rec.key_id, rec.session_id, route_key, EXPLICIT)
                    if self.on_end is not None:  # the console marks it ended again
                        self.on_end(rec.key_id, rec.session_id, EXPLICIT)
                else:
                    self._ended_at.pop(k, None)
                    self._seen[k] = _Seen(self.clock(), route_key)
                    self._seen.move_to_end(k)
                    while len(self._seen) > self.max_sessions:
                        self._seen.popitem(last=False)
            await self.sweep()
        except Exception:
            log.exception("session end not applied for request %s", rec.request_id)

    async def sweep(self, now: float | None = None) -> int:
        """End every session idle for more than ``idle_s`` at ``now``; how many ended."""
        now = self.clock() if now is None else now
        n = 0
        while self._seen:
            k, seen = next(iter(self._seen.items()))
            if now - seen.at <= self.idle_s:
                break
            if k in self._running:  # a request in flight: seen now
                self._seen[k] = _Seen(now, seen.route_key)
                self._seen.move_to_end(k)
                continue
            del self._seen[k]
            await self.end(k[0], k[1], seen.route_key, IDLE)
            n += 1
        return n

    async def end(self, key_id: str | None, session_id: str, route_key: str | None,
                  how: str) -> None:
        """End one session ``how`` (``explicit`` or ``idle``): release its routing state under
        ``route_key`` (when it was routed), its budget ledger (explicit only), mark its usage
        totals, tell ``on_end``."""
        self._seen.pop((key_id, session_id), None)
        if how == EXPLICIT:
            self._ended_at[(key_id, session_id)] = self.clock()
            self._ended_at.move_to_end((key_id, session_id))
            while len(self._ended_at) > self.max_sessions:
                self._ended_at.popitem(last=False)
        await self._release(key_id, session_id, route_key, how)
        if how == EXPLICIT:
            try:
                await self.budgets.release(key_id, session_id)
            except Exception as e:  # Redis down: the ledger expires with its TTL
                log.warning("budget ledger of an ended session not released: %r", e)
        self.ended[how] = self.ended.get(how, 0) + 1
        if self.on_end is not None:
            self.on_end(key_id, session_id, how)

    async def _release(self, key_id: str | None, session_id: str, route_key: str | None,
                       how: str) -> None:
        """Release the routing state under ``route_key`` and mark the usage totals ended."""
        if route_key is not None:
            for pool in self.pools.all():
                if pool.router is not None:
                    await pool.router.forget(route_key, shared=how == EXPLICIT)
            for table in self.auto_tables:
                table.delete(route_key)
        await self.usage.end(key_id, session_id, how)

    async def run(self) -> None:
        """Sweep every ``idle_s / 4`` seconds until cancelled (the app's lifespan)."""
        while True:
            await asyncio.sleep(max(1.0, self.idle_s / 4))
            with contextlib.suppress(Exception):
                await self.sweep()
