"""Session budgets for agent runs: a session's spend in USD, checked at admission.

A request with a session (``x-session-id``) and a budget (header
``x-speedgate-session-budget-usd`` capped by the key's maximum, else the key's
``session_budget_usd``, else ``budgets.default_session_budget_usd``) is admitted while the
session's committed spend (finished requests at their cost, cached tokens at the cached price,
plus requests in flight at their estimate) is below the budget; then its own estimate is
reserved, atomically with the check (one Lua script in Redis, so every gateway replica sees one
spend). When it ends, the reservation is replaced by its actual cost. Past ``soft_share`` of the
budget ``auto`` takes the cheaper tier. Past the budget: 429 ``session_budget_exceeded`` with
the remaining budget header. Ledgers are scoped by API key (two keys never share a session).

The arithmetic (``check``, ``estimate_usd``) is pure; ``MemoryBudgetLedger`` keeps one process's
ledgers, ``gateway.admit.budget_redis.RedisBudgetLedger`` the shared ones. USD throughout.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.config import ApiKeyConfig, GatewayConfig, Prices
from gateway.errors import GatewayError, InvalidRequest

log = logging.getLogger("speedgate.budget")

HEADER = "x-speedgate-session-budget-usd"
REMAINING_HEADER = "x-speedgate-session-budget-remaining-usd"
#: Most ledgers one request is charged to: its session and its ancestors, the parent links
#: learned from earlier requests followed this far up (a deeper tree is still bounded by
#: its root's ledger, which a subagent's agent names on every request where it can).
MAX_ANCESTRY = 8
#: Parent links remembered (sessions), least recently used dropped first: as many as the
#: memory ledger keeps sessions.
MAX_PARENT_LINKS = 100_000


@dataclass(frozen=True, slots=True)
class Verdict:
    """``admit``: committed < budget; ``soft``: committed ≥ soft share × budget;
    ``remaining_usd``: budget − committed (≥ 0), committed = spent + reserved."""

    admit: bool
    soft: bool
    remaining_usd: float


def check(spent_usd: float, reserved_usd: float, budget_usd: float, soft_share: float) -> Verdict:
    """The admission rule of one request against its session's ledger."""
    committed = spent_usd + reserved_usd
    return Verdict(committed < budget_usd, committed >= soft_share * budget_usd,
                   max(0.0, budget_usd - committed))


def estimate_usd(prompt_tokens: float, output_tokens: float, prices: Iterable[Prices]) -> float:
    """A request's cost estimate: uncached prompt and output tokens at the dearest of
    ``prices`` (the tiers it may be served on; a fallback may land on any of them)."""
    best = 0.0
    for p in prices:
        best = max(best, (prompt_tokens * p.input_per_mtok_usd
                          + output_tokens * p.output_per_mtok_usd) / 1e6)
    return best


class BudgetExceeded(GatewayError):
    """429 ``session_budget_exceeded``: the session spent its budget. Not worth retrying
    (``x-should-retry: false``, read by the OpenAI SDKs)."""

    status = 429
    type = "insufficient_quota"
    code = "session_budget_exceeded"

    def __init__(self, budget_usd: float, remaining_usd: float) -> None:
        super().__init__(
            f"This session has used its budget of ${budget_usd:.6g} "
            f"(remaining ${remaining_usd:.6g}); start a new session or raise the budget."
        )
        self.budget_usd, self.remaining_usd = budget_usd, remaining_usd

    def headers(self) -> dict[str, str]:
        return {HEADER: f"{self.budget_usd:.6f}", REMAINING_HEADER: f"{self.remaining_usd:.6f}",
                "x-should-retry": "false"}


class BudgetUnavailable(GatewayError):
    """503: the budget store cannot answer and ``budgets.fail_mode`` is ``closed``."""

    status = 503
    type = "server_error"
    code = "budget_store_unavailable"


@dataclass(slots=True)
class BudgetEntry:
    """A session's ledger: the budget last applied, spend of finished requests, and the
    estimates of requests in flight (all USD)."""

    budget_usd: float = 0.0
    spent_usd: float = 0.0
    reserved_usd: float = 0.0


class BudgetLedger(Protocol):
    """Where session ledgers live (``MemoryBudgetLedger``, ``RedisBudgetLedger``)."""

    async def reserve(
        self, ledger_id: str, budget_usd: float, estimate_usd: float, request_id: str
    ) -> tuple[bool, BudgetEntry]:
        """Atomically: admitted iff spent + reserved < budget, then reserve ``estimate_usd``
        under the hold id ``request_id`` (unique per admitted request: a second reservation
        under one id replaces the first). Returns (admitted, the state before this
        reservation)."""
        ...

    async def settle(self, ledger_id: str, request_id: str, actual_usd: float) -> None:
        """Replace ``request_id``'s reservation by its actual cost (nothing when the ledger
        was dropped meanwhile: its session ended)."""
        ...

    async def read(self, ledger_id: str) -> BudgetEntry | None:
        """The ledger (None when the session has none)."""
        ...

    async def delete(self, ledger_id: str) -> None:
        """Drop the ledger (its session ended)."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


@dataclass(slots=True)
class _Entry:
    state: BudgetEntry = field(default_factory=BudgetEntry)
    holds: dict[str, tuple[float, float]] = field(default_factory=dict)  # rid → (usd, expiry)


class MemoryBudgetLedger:
    """Ledgers of one process, LRU-bounded to ``max_sessions``; reservations expire after
    ``reservation_ttl_s`` (a request that never settled)."""

    def __init__(self, reservation_ttl_s: float = 3600.0, max_sessions: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = reservation_ttl_s
        self.max_sessions = max_sessions
        self.clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def _entry(self, ledger_id: str) -> _Entry:
        e = self._entries.get(ledger_id)
        if e is None:
            e = self._entries[ledger_id] = _Entry()
            if len(self._entries) > self.max_sessions:
                self._entries.popitem(last=False)
        self._entries.move_to_end(ledger_id)
        now = self.clock()
        for rid in [r for r, (_, exp) in e.holds.items() if exp <= now]:
            del e.holds[rid]
        e.state.reserved_usd = sum(usd for usd, _ in e.holds.values())
        return e

    async def reserve(self, ledger_id: str, budget_usd: float, estimate_usd: float,
                      request_id: str) -> tuple[bool, BudgetEntry]:
        e = self._entry(ledger_id)
        e.state.budget_usd = budget_usd
        before = BudgetEntry(budget_usd, e.state.spent_usd, e.state.reserved_usd)
        if before.spent_usd + before.reserved_usd >= budget_usd:
            return False, before
        e.holds[request_id] = (estimate_usd, self.clock() + self.ttl_s)
        e.state.reserved_usd += estimate_usd
        return True, before

    async def settle(self, ledger_id: str, request_id: str, actual_usd: float) -> None:
        if ledger_id not in self._entries:  # dropped meanwhile (its session ended)
            return
        e = self._entry(ledger_id)
        held = e.holds.pop(request_id, None)
        if held is not None:
            e.state.reserved_usd = max(0.0, e.state.reserved_usd - held[0])
        e.state.spent_usd += actual_usd

    async def delete(self, ledger_id: str) -> None:
        self._entries.pop(ledger_id, None)

    def sessions(self) -> int:
        """How many sessions have a ledger here."""
        return len(self._entries)

    async def read(self, ledger_id: str) -> BudgetEntry | None:
        if ledger_id not in self._entries:
            return None
        s = self._entry(ledger_id).state
        return BudgetEntry(s.budget_usd, s.spent_usd, s.reserved_usd)

    async def close(self) -> None:
        return None


@dataclass(slots=True)
class BudgetHold:
    """An admitted request's reservation: release it with ``SessionBudgets.settle``."""

    ledger_id: str
    request_id: str  # the hold's id: the request id plus a gateway-made suffix, never reused
    budget_usd: float
    remaining_usd: float
    soft: bool
    settled: bool = False
    #: the ancestors' ledgers (a subagent's parent and root session) also charged
    also: tuple[str, ...] = ()

    def headers(self) -> list[tuple[bytes, bytes]]:
        """Response headers: the session's budget and what remained at admission."""
        return [(HEADER.encode(), f"{self.budget_usd:.6f}".encode()),
                (REMAINING_HEADER.encode(), f"{self.remaining_usd:.6f}".encode())]


def hold_id(request_id: str) -> str:
    """The id a request's reservation is held under: its request id (traceable in the store)
    and 64 random bits the gateway draws. A client's ``x-request-id`` is its own choice and
    may repeat across concurrent requests; keyed by it alone, the holds of those requests
    would overwrite each other and the session would be charged for one of them only."""
    return f"{request_id}/{secrets.token_hex(8)}"


def ledger_id(key_id: str | None, session_id: str) -> str:
    """A session's ledger name, scoped by its API key id (``-`` with auth off)."""
    return f"{key_id or '-'}/{session_id}"


class SessionBudgets:
    """Session budgets of one gateway process (see the module docstring)."""

    def __init__(self, config: GatewayConfig, ledger: BudgetLedger | None = None) -> None:
        self.config = config.budgets
        self.models = config.models
        self.ledger: BudgetLedger = ledger or MemoryBudgetLedger(config.budgets.reservation_ttl_s)
        self.refusals: dict[str, int] = {}  # model → requests refused for their budget
        self.soft: dict[str, int] = {}  # model → requests admitted past the soft share
        self._settles: set[asyncio.Task[None]] = set()
        # ledger id → its parent's ledger id, as the session's requests named it (LRU,
        # bounded like the memory ledgers): a subagent's subagent is charged up the whole tree
        self._parents: OrderedDict[str, str] = OrderedDict()

    def _chain(self, scope: str | None, session_id: str, ancestors: Sequence[str]) -> list[str]:
        """The ledgers a request is charged to: its session's, its named parent's, then each
        parent's parent as learned from that parent's own requests (a client that names only
        the direct parent, as OpenCode's ``x-parent-session-id`` does, would otherwise let a
        grandchild spend past the grandparent's budget), at most ``MAX_ANCESTRY`` and each
        once (a cycle of parents stops where a session comes back), then the other named
        ancestors (the tree's root)."""
        lids = [ledger_id(scope, session_id)]
        named = [ledger_id(scope, a) for a in ancestors]
        if not named:
            return lids
        self._parents[lids[0]] = named[0]
        self._parents.move_to_end(lids[0])
        if len(self._parents) > MAX_PARENT_LINKS:
            self._parents.popitem(last=False)
        cur: str | None = named[0]
        while cur is not None and cur not in lids and len(lids) < MAX_ANCESTRY:
            lids.append(cur)
            cur = self._parents.get(cur)
        lids += [lid for lid in named if lid not in lids]
        return lids

    def budget_for(self, key: ApiKeyConfig | None, header: str | None) -> float | None:
        """The budget (USD) of a request: the header capped by the key's maximum (the key's
        own budget when it has no maximum), else the key's budget, else the default.
        Raises ``InvalidRequest`` (400) for a header that is not a positive number."""
        own = key.session_budget_usd if key is not None else None
        if header is not None:
            try:
                asked = float(header)
            except ValueError:
                asked = math.nan
            if not math.isfinite(asked) or asked <= 0:
                raise InvalidRequest(f"{HEADER} must be a positive number of USD", param=HEADER)
            cap = (key.max_session_budget_usd or own) if key is not None else (
                self.config.max_session_budget_usd)
            return min(asked, cap) if cap is not None else asked
        if own is not None:
            return own
        return self.config.default_session_budget_usd

    async def reserve(
        self,
        key: ApiKeyConfig | None,
        session_id: str | None,
        header: str | None,
        model: str,
        estimate: float,
        request_id: str,
        ancestors: Sequence[str] = (),
    ) -> BudgetHold | None:
        """Check and reserve the session's budget for one request (None: no session or no
        budget). A subagent's request is charged to its ``ancestors``' ledgers too (its
        parent's and root's sessions, and the parent's own ancestors as its requests named
        them, ``_chain``; each under the same budget): admitted only when every one of them
        has room, reported with the least remaining. Raises ``BudgetExceeded``
        (429), ``BudgetUnavailable`` (503, fail closed)."""
        budget = self.budget_for(key, header)
        if session_id is None or budget is None:
            return None
        scope = key.id if key is not None else None
        lids = self._chain(scope, session_id, ancestors)
        hid = hold_id(request_id)
        taken: list[str] = []
        least: Verdict | None = None
        try:
            for lid in lids:
                admitted, before = await self.ledger.reserve(lid, budget, estimate, hid)
                v = check(before.spent_usd, before.reserved_usd, budget, self.config.soft_share)
                if not admitted:
                    await self._release(taken, hid)
                    self.refusals[model] = self.refusals.get(model, 0) + 1
                    raise BudgetExceeded(budget, v.remaining_usd)
                taken.append(lid)
                if least is None or v.remaining_usd < least.remaining_usd:
                    least = v
        except BudgetExceeded:
            raise
        except Exception as e:  # Redis down or slow
            await self._release(taken, hid)
            if self.config.fail_mode == "closed":
                raise BudgetUnavailable("session budget store unavailable; try again",
                                        retry_after_s=1) from None
            log.warning("session budget not checked (store unavailable): %r", e)
            return None
        assert least is not None
        soft = least.soft
        if soft:
            self.soft[model] = self.soft.get(model, 0) + 1
        return BudgetHold(lids[0], hid, budget, least.remaining_usd, soft,
                          also=tuple(lids[1:]))

    async def _release(self, lids: Sequence[str], hid: str) -> None:
        """Give back the holds ``hid`` already taken on ``lids`` (a later ledger refused)."""
        for lid in lids:
            try:
                await self.ledger.settle(lid, hid, 0.0)
            except Exception as e:  # it expires with the reservation TTL
                log.warning("session budget hold not released for %s: %r", lid, e)

    async def release(self, key_id: str | None, session_id: str) -> None:
        """Drop the session's ledger: it ended (``gateway.admit.session_end``). Its spend
        stays in the usage totals; a later request naming the same id starts a new one."""
        await self.ledger.delete(ledger_id(key_id, session_id))

    async def settle(self, hold: BudgetHold | None, actual_usd: float) -> None:
        """Replace the reservation by the request's actual cost (0 when nothing was served).
        Idempotent; survives cancellation of the caller (runs as its own task)."""
        if hold is None or hold.settled:
            return
        hold.settled = True
        task = asyncio.get_running_loop().create_task(self._settle_all(hold, actual_usd))
        self._settles.add(task)
        task.add_done_callback(self._settles.discard)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            pass
        except Exception as e:
            log.warning("session budget not settled for %s: %r", hold.ledger_id, e)

    async def _settle_all(self, hold: BudgetHold, actual_usd: float) -> None:
        for lid in (hold.ledger_id, *hold.also):
            await self.ledger.settle(lid, hold.request_id, actual_usd)

    async def read(self, key_id: str | None, session_id: str) -> dict[str, float] | None:
        """``{budget_usd, spent_usd, reserved_usd, remaining_usd}`` of a session (None when
        it has no ledger)."""
        s = await self.ledger.read(ledger_id(key_id, session_id))
        if s is None:
            return None
        v = check(s.spent_usd, s.reserved_usd, s.budget_usd, self.config.soft_share)
        return {"budget_usd": s.budget_usd, "spent_usd": s.spent_usd,
                "reserved_usd": s.reserved_usd, "remaining_usd": v.remaining_usd}

    def collector(self) -> Collector:
        """Prometheus collector: ``speedgate_session_budget_refusals_total{model}`` (429
        ``session_budget_exceeded``) and ``speedgate_session_budget_soft_total{model}``
        (admitted past the soft share)."""
        return _BudgetCollector(self)

    async def close(self) -> None:
        """Wait for pending settles and close the store."""
        if self._settles:
            await asyncio.gather(*self._settles, return_exceptions=True)
        await self.ledger.close()


class _BudgetCollector(Collector):
    def __init__(self, budgets: SessionBudgets) -> None:
        self.budgets = budgets

    def collect(self) -> Iterator[Metric]:
        refused = CounterMetricFamily("speedgate_session_budget_refusals",
                                      "Requests refused: their session spent its budget",
                                      labels=["model"])
        for model, n in sorted(self.budgets.refusals.items()):
            refused.add_metric([model], float(n))
        soft = CounterMetricFamily("speedgate_session_budget_soft",
                                   "Requests admitted past their session budget's soft share",
                                   labels=["model"])
        for model, n in sorted(self.budgets.soft.items()):
            soft.add_metric([model], float(n))
        yield from (refused, soft)
