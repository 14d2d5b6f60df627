"""Flow control of one gateway process: a queue per pool in front of saturated replicas.
What the handler calls:

1. ``classify(key, header, doc, raw_size, session)`` → ``Admission``: band (``bands``), flex,
   fair-queuing flows and the request's estimated cost in tokens;
2. ``acquire(pool, admission, budget_s)`` → a ``Slot`` (or None for a pool with no saturation
   bound: it pays nothing). Unsaturated, and nobody of its band or above waiting: the slot is
   taken at once (a counter). Else the request is refused at once when its expected wait
   (``drain.shed``) exceeds ``budget_s`` or the queue is full, or it waits in the pool's
   ``BandedQueue`` until a slot frees (dispatched at once by ``release``), its deadline
   passes (refused then), or the client leaves (cancellation removes it);
3. ``release(slot, actual_tokens, ttft_s)`` exactly once when the request ends, on every exit
   path.

Slots per band: ``saturation.band_limits`` (reservations are work-conserving). First-token
guard: after a top-band request takes a slot, for the top band's typical time to first token
(``first_token_guard_s`` at most) a lower band may not take the *last* slot free to it, so no
batch prompt is prefilled in a full engine step that first token waits for. An unsaturated
pool pays nothing: the replica is picked after the slot (least loaded), so while another slot
stays free the lower-band prompt has room beside the first token; and no lower-band request is
held more than ``first_token_guard_s`` in all, however often top-band dispatches renew it.

Refusals are 503 (``queue_full``, ``queue_wait_too_long``, ``queue_timeout``) with a
``Retry-After`` from the drain rate; a flex request gets OpenAI's 429 ``resource_unavailable``
instead. One pump task per pool runs only while requests wait (deadlines, promotions, and
re-reading replica health and engine queues every ``recheck_interval_s``). Times in seconds on
the injected ``clock`` (monotonic).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.admit.flow.bands import HEADER, BandChoice, resolve_band
from gateway.admit.flow.drain import DrainMeter, expected_wait_s, retry_after_s, shed
from gateway.admit.flow.guard import FirstTokenGuard
from gateway.admit.flow.queue import BandedQueue, BandRule, Waiter
from gateway.admit.flow.refusal import ADMIT_TIME_HEADER, QueueRefused
from gateway.admit.flow.saturation import EngineQueues, band_limits, slot_capacity
from gateway.config import ApiKeyConfig, GatewayConfig
from gateway.fleet.pools import Pool, PoolRegistry

log = logging.getLogger("speedgate.flow")

#: Characters per token of the admission estimate (OpenAI: "~4 characters of English text").
BYTES_PER_TOKEN = 4

@dataclass(slots=True)
class Admission:
    """One request as flow control sees it: its band, flex semantics, fair-queuing flows
    (``key``, ``session``, ``weight``) and ``cost`` in estimated tokens (prompt bytes / 4 +
    the output cap, or ``default_output_tokens`` without one)."""

    band: BandChoice
    key: str
    session: str
    weight: float
    cost: float

    @property
    def flex(self) -> bool:
        return self.band.flex


@dataclass(slots=True, eq=False)
class Slot:
    """A request's place on a pool, held until ``FlowControl.release``. ``waited_s``: time it
    spent in the gateway queue (0 when it went straight through); ``band``: the band it was
    dispatched from (after any promotion); ``charged``: it was served by that band's fair
    queue (not promoted), whose charge ``release`` corrects to the actual tokens."""

    pool: _PoolFlow
    admission: Admission
    band: int
    queued: bool
    waited_s: float = 0.0
    started: float = 0.0
    released: bool = False
    charged: bool = False

    def remaining_s(self, timeout_s: float | None) -> float | None:
        """A request timeout (s) less the time spent queued (never below 1 ms)."""
        return None if timeout_s is None else max(0.001, timeout_s - self.waited_s)


class _PoolFlow:
    """Queue, counters and pump of one pool."""

    def __init__(self, owner: FlowControl, pool: Pool) -> None:
        cfg = owner.config.flow_control
        self.owner = owner
        self.pool = pool
        self.queue = BandedQueue([BandRule(b.name, b.max_wait_s) for b in cfg.bands])
        self.shares = [b.reserved_share for b in cfg.bands]
        self.drain = DrainMeter(cfg.drain_half_life_s)
        self.key_drain: dict[str, DrainMeter] = {}  # per API key, while it has some waiting
        self.key_queued: Counter[str] = Counter()
        self.service_s: list[float | None] = [None] * len(cfg.bands)  # hold time EWMA, band
        self.guard = FirstTokenGuard(cfg.first_token_guard_s)
        self.engine = EngineQueues()
        self.active = 0
        self.held = [0] * len(cfg.bands)  # slots held per band (the band dispatched from)
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.dispatched: Counter[str] = Counter()  # band name → requests dispatched after waiting

    @property
    def gated(self) -> bool:
        """Whether this pool can saturate at all (a slot cap or an engine-queue bound)."""
        c = self.pool.config
        return bool(c.max_inflight_per_replica) or c.max_engine_waiting is not None

    def lowest_band(self, now: float) -> int | None:
        """The lowest-priority band that may take a slot now (None: none may). While the
        first-token guard is on, a lower band still takes a slot when one more stays free after
        it (``guard.FirstTokenGuard``)."""
        if self.engine.saturated(self.pool, now):
            return None
        cap = slot_capacity(self.pool, now)
        if cap is None:  # bounded by the engines' queues only: no slot to be the last one
            return len(self.shares) - 1
        guarded = self.guard.binds(now, self.queue.oldest_arrival(1))
        lowest = None
        for i, limit in enumerate(band_limits(cap, self.shares, self.held)):
            if self.active < limit and (i == 0 or not guarded or self.active + 1 < limit):
                lowest = i
        return lowest

    def take(self, admission: Admission, band: int, queued: bool, waited_s: float) -> Slot:
        now = self.owner.clock()
        self.active += 1
        self.held[band] += 1
        self.engine.sent += 1
        if admission.band.index == 0 and (hold_s := self.guard.renew(now)) is not None:
            self.later(hold_s)
        return Slot(self, admission, band, queued, waited_s, now)

    def later(self, delay_s: float) -> None:
        """Serve the queue again in ``delay_s`` (a timer on the running loop, if any)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a pure test): the next tick serves the queue
            return
        loop.call_later(delay_s, self.guard_over)

    def guard_over(self) -> None:
        """A guard's time passed: hand free slots to waiting lower-band requests."""
        if len(self.queue):
            self.dispatch(self.owner.clock())

    def key_event(self, now: float, key: str, delta: int, cost: float | None = None) -> None:
        """A request of ``key`` joined (+1) or left (-1) the queue; ``cost`` when it left for
        an engine (the key's drain meter counts it)."""
        self.key_queued[key] += delta
        waiting = self.key_queued[key] > 0
        if not waiting:
            del self.key_queued[key]
        meter = self.key_drain.get(key)
        if meter is None:
            meter = self.key_drain[key] = DrainMeter(self.drain.half_life_s)
        if cost is None:
            meter.mark(now, waiting)
        else:
            meter.dispatched(now, cost, waiting)

    def wait_s(self, band: int, adm: Admission) -> float | None:
        """Expected wait of a new request ``adm`` in ``band`` (``drain.expected_wait_s``)."""
        now = self.owner.clock()
        self.drain.mark(now, bool(len(self.queue)))  # the backlog so far counts
        ahead = self.queue.tokens_ahead(band, adm.key, adm.cost, adm.weight)
        meter = self.key_drain.get(adm.key) if self.key_queued[adm.key] else None
        if meter is not None:
            meter.mark(now, True)
        own = self.queue.key_tokens(band, adm.key)
        return expected_wait_s(ahead, self.drain.rate(), own,
                               meter.rate() if meter is not None else None)

    def served(self, slot: Slot, now: float) -> None:
        """Learn the band's typical slot hold time (EWMA, weight 0.2 to the newest)."""
        held = now - slot.started
        prev = self.service_s[slot.band]
        self.service_s[slot.band] = held if prev is None else prev + 0.2 * (held - prev)

    def dispatch(self, now: float) -> None:
        """Hand free slots to waiting requests, highest band first."""
        while len(self.queue):
            lowest = self.lowest_band(now)
            if lowest is None:
                break
            w = self.queue.pop(lowest)
            if w is None:
                break
            fut, adm = w.payload
            if fut.done():  # its request is gone (cancelled): nothing to hand over
                self.key_event(now, w.key, -1)
                continue
            self.drain.dispatched(now, w.cost, bool(len(self.queue)))
            self.key_event(now, w.key, -1, w.cost)
            slot = self.take(adm, w.band, True, now - w.arrived)
            slot.charged = not w.promoted
            fut.set_result(slot)
            name = self.owner.band_names[w.band]
            self.dispatched[name] += 1
            self.owner.observe_wait(self.pool, name, now - w.arrived)

    def start_pump(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._pump())

    def tick(self, now: float) -> None:
        """Refuse expired requests, promote starving ones, fill free slots (the pump's step;
        tests call it with their own clock)."""
        for w in self.queue.expired(now):
            self.fail(w, "timeout", now)
        for _w, src, dst in self.queue.promote(now):
            self.owner.promotions[(self.pool.key, self.owner.band_names[src],
                                   self.owner.band_names[dst])] += 1
        self.dispatch(now)
        self.drain.mark(now, bool(len(self.queue)))

    async def _pump(self) -> None:
        interval = self.owner.config.flow_control.recheck_interval_s
        while len(self.queue):
            self.tick(self.owner.clock())
            if not len(self.queue):
                break
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self.wake.wait()

    def fail(self, w: Waiter, reason: str, now: float) -> None:
        """Refuse a waiting request (its deadline passed)."""
        fut, adm = w.payload
        self.key_event(now, w.key, -1)
        if fut.done():
            return
        retry = retry_after_s(self.wait_s(w.band, adm))
        self.owner.count_shed(self.pool, self.owner.band_names[w.first_band], reason)
        fut.set_exception(QueueRefused(reason, retry, adm.flex,
                                       f" ({now - w.arrived:.1f}s)"))


class FlowControl:
    """The per-pool queues of one gateway process (see the module docstring)."""

    def __init__(
        self,
        config: GatewayConfig,
        pools: PoolRegistry,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.clock = clock
        self.band_names = [b.name for b in config.flow_control.bands]
        self.enabled = config.flow_control.enabled
        self.pools: dict[str, _PoolFlow] = {p.key: _PoolFlow(self, p) for p in pools.all()}
        self.shed: Counter[tuple[str, str, str]] = Counter()  # (pool, band, reason)
        self.promotions: Counter[tuple[str, str, str]] = Counter()  # (pool, from, to)
        self.wait_observer: Callable[[str, str, float], None] | None = None
        self.refusal_observer: Callable[[str, str, str, float], None] | None = None

    # -- the request path ------------------------------------------------------------------
    def classify(
        self,
        key: ApiKeyConfig | None,
        header: str | None,
        doc: dict[str, Any],
        raw_size: int,
        session: str | None,
    ) -> Admission:
        """The request's band and cost. Raises 400/403 for a bad ``x-speedgate-priority``."""
        fc = self.config.flow_control
        band = resolve_band(fc, key, header, doc.get("service_tier"))
        out = doc.get("max_completion_tokens", doc.get("max_tokens"))
        if not isinstance(out, int) or isinstance(out, bool) or out < 0:
            out = fc.default_output_tokens  # 0: the prompt echoed, nothing generated
        cost = raw_size / BYTES_PER_TOKEN + min(out, 10_000_000)
        return Admission(band, key.id if key is not None else "", session or "",
                         key.weight if key is not None else 1.0, cost)

    async def acquire(self, pool: Pool, adm: Admission, budget_s: float) -> Slot | None:
        """A slot on ``pool`` for ``adm``, waiting at most ``budget_s`` seconds (see the module
        docstring). Raises ``QueueRefused``; cancellation (client gone) leaves the queue."""
        pf = self.pools.get(pool.key)
        if pf is None or not self.enabled or not pf.gated:
            return None
        now = self.clock()
        band = adm.band.index
        lowest = pf.lowest_band(now)
        if lowest is not None and band <= lowest and not any(pf.queue.lengths()[: band + 1]):
            return pf.take(adm, band, False, 0.0)
        decision = shed(pf.wait_s(band, adm), budget_s, len(pf.queue),
                        self.config.flow_control.max_queue_len)
        if decision.reason is not None:
            self.count_shed(pool, adm.band.name, decision.reason)
            detail = (f" ({decision.expected_wait_s:.1f}s > {budget_s:.1f}s)"
                      if decision.expected_wait_s is not None else "")
            raise QueueRefused(decision.reason, decision.retry_after_s, adm.flex, detail)
        fut: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        w = Waiter(adm.key, adm.session, adm.cost, band, now, now + budget_s, adm.weight,
                   payload=(fut, adm))
        pf.drain.mark(now, True)
        pf.queue.push(w)
        pf.key_event(now, adm.key, +1)
        pf.dispatch(now)  # a slot may be free for it already (a higher band was waiting)
        if band > 0 and not fut.done() and now < pf.guard.until:
            pf.later(pf.guard.cap_s)  # the guard holds it at most this long
        if not fut.done():
            pf.start_pump()
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release(fut.result(), None)  # dispatched as the client left
            elif pf.queue.remove(w):
                pf.drain.mark(self.clock(), bool(len(pf.queue)))
                pf.key_event(self.clock(), adm.key, -1)
            raise

    def release(
        self, slot: Slot | None, actual_tokens: int | None, ttft_s: float | None = None
    ) -> None:
        """Give the slot back (idempotent) and dispatch the next waiting request at once.
        ``actual_tokens`` (prompt + completion; None when unknown) corrects the fair queue's
        charge of a request that waited; ``ttft_s`` (its measured time to first token, None
        when it had none) teaches a top-band request's first-token guard."""
        if slot is None or slot.released:
            return
        slot.released = True
        pf = slot.pool
        pf.active -= 1
        pf.held[slot.band] -= 1
        pf.engine.finished += 1
        pf.served(slot, self.clock())
        adm = slot.admission
        if ttft_s is not None and adm.band.index == 0:
            pf.guard.learn(ttft_s)
        if slot.charged and actual_tokens is not None:
            pf.queue.bands[slot.band].fair.settle(adm.key, adm.session, actual_tokens - adm.cost)
        if len(pf.queue):
            pf.dispatch(self.clock())
            pf.wake.set()

    def service_s(self, pool: Pool, band: int) -> float:
        """Typical seconds a request of ``band`` holds a slot on ``pool`` (0 until measured):
        the queue budget leaves this much of a request's deadline for its own service."""
        pf = self.pools.get(pool.key)
        return (pf.service_s[band] or 0.0) if pf is not None else 0.0

    # -- telemetry ---------------------------------------------------------------------------
    def count_shed(self, pool: Pool, band: str, reason: str) -> None:
        """Count one refused request (``speedgate_queue_shed_total``)."""
        self.shed[(pool.key, band, reason)] += 1

    def observe_refusal(self, pool: Pool, band: str, reason: str, decision_s: float) -> None:
        """Report a refusal's time from arrival at the gateway to the decision (seconds) to
        the metrics (``speedgate_queue_refusal_seconds``, if wired)."""
        if self.refusal_observer is not None:
            self.refusal_observer(pool.key, band, reason, decision_s)

    def observe_wait(self, pool: Pool, band: str, waited_s: float) -> None:
        """Report the queue wait of a dispatched request to the metrics (if wired)."""
        if self.wait_observer is not None:
            self.wait_observer(pool.key, band, waited_s)

    async def close(self) -> None:
        """Stop the pumps; requests still waiting are refused."""
        for pf in self.pools.values():
            now = self.clock()
            for w in list(pf.queue):
                pf.queue.remove(w)
                pf.fail(w, "timeout", now)
            pf.key_drain.clear()
            if pf.task is not None:
                pf.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pf.task


__all__ = ["ADMIT_TIME_HEADER", "HEADER", "Admission", "FlowControl", "QueueRefused", "Slot"]
