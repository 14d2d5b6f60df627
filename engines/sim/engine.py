"""Continuous-batching scheduler: one loop task per replica advances the running batch.

Faithful to vLLM's V1 scheduler in spirit:

- at most ``max_num_seqs`` sequences run; the rest wait in a queue
  (``vllm:num_requests_waiting``); a waiting sequence is admitted when a slot and its KV blocks
  are free (the head of the queue blocks the rest, no reordering). The queue is FIFO under
  ``scheduling_policy="fcfs"``; under ``"priority"`` it is ordered by (request ``priority``,
  arrival), lower first, as vLLM V1's priority request queue (``vllm/v1/core/sched/
  request_queue.py``); like vLLM, a running sequence is not preempted for a batch slot (V1's
  ``Scheduler.schedule`` stops admitting when the running batch is full; under priority it
  preempts the lowest-priority running request only when KV blocks run out, which cannot
  happen here: a sequence's blocks for prompt + output are allocated when it is admitted);
- each step processes one token per decoding sequence plus up to ``max_num_batched_tokens``
  of uncached prompt tokens (chunked prefill, oldest first); a sequence gets its first token in
  the step that finishes its prefill, so TTFT = queue wait + prefill of its uncached tokens (+
  the steps it shares);
- a step lasts ``perf.forward_s(decoding, prefill_tokens)`` (the weights are read once per
  step, a prefill-only step included), scaled by
  ``time_scale``; with ``time_scale == 0`` the loop yields once per step (fair interleaving) and
  sleeps on an event when idle (no busy spin);
- in speculative mode each decoding sequence gains ``accepted + 1`` tokens per step, drawn
  from a seeded RNG (:meth:`engines.sim.perf.PerfModel.draw_accepted`).

A request (:class:`Job`) owns one sequence per choice; the loop appends ``(index, tokens,
done)`` to the job's outbox and sets its event. The handler drains the outbox at its own pace,
so a slow client never slows the engine (tokens coalesce, as in vLLM's output processor).
"""

from __future__ import annotations

import asyncio
import bisect
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import count
from typing import Literal

from engines.sim.kvcache import Allocation, PrefixCache
from engines.sim.metrics import SimMetrics
from engines.sim.perf import PerfModel


@dataclass(eq=False, slots=True)
class Sequence:
    """One choice of one request, as the scheduler sees it."""

    job: Job
    index: int
    prompt_tokens: int
    block_hashes: list[int]
    output_tokens: int  # tokens to generate before finishing
    generated: int = 0
    prefill_left: int = 0  # uncached prompt tokens still to compute
    cached_tokens: int = 0
    alloc: Allocation | None = None
    done: bool = False
    order: tuple[int, int] = field(default=(0, 0))  # (priority, arrival) in the waiting queue


class Job:
    """One HTTP request's handle: its sequences, its ``priority`` (vLLM's request field; lower
    runs earlier under priority scheduling) and the outbox the engine fills."""

    __slots__ = ("event", "outbox", "priority", "seqs")

    def __init__(self, priority: int = 0) -> None:
        self.seqs: list[Sequence] = []
        self.outbox: list[tuple[int, int, bool]] = []
        self.event = asyncio.Event()
        self.priority = priority

    def add(self, index: int, prompt_tokens: int, hashes: list[int], output_tokens: int) -> None:
        """Add the sequence of choice ``index``."""
        self.seqs.append(Sequence(self, index, prompt_tokens, hashes, output_tokens))

    async def next(self) -> list[tuple[int, int, bool]]:
        """Wait for and take the pending ``(choice index, new tokens, finished)`` outputs."""
        while not self.outbox:
            self.event.clear()
            await self.event.wait()
        out, self.outbox = self.outbox, []
        return out

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache (first choice; n>1 shares the prompt)."""
        return self.seqs[0].cached_tokens if self.seqs else 0


class WaitingQueue:
    """The waiting sequences: FIFO (``fcfs``) or by (priority, arrival) (``priority``)."""

    def __init__(self, policy: Literal["fcfs", "priority"] = "fcfs") -> None:
        self.policy = policy
        self._items: deque[Sequence] | list[Sequence] = deque() if policy == "fcfs" else []
        self._arrivals = count()

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self._items)

    def add(self, s: Sequence) -> None:
        """Queue ``s`` (behind everything under fcfs; behind its priority's earlier arrivals
        under priority)."""
        s.order = (s.job.priority, next(self._arrivals))
        if isinstance(self._items, deque):
            self._items.append(s)
        else:
            bisect.insort(self._items, s, key=lambda x: x.order)

    def head(self) -> Sequence:
        """The next sequence to admit."""
        return self._items[0]

    def pop_head(self) -> Sequence:
        """Take the head."""
        if isinstance(self._items, deque):
            return self._items.popleft()
        return self._items.pop(0)

    def remove(self, s: Sequence) -> None:
        """Take ``s`` out (aborted); ValueError when it is not waiting."""
        self._items.remove(s)

    def push_front(self, s: Sequence) -> None:
        """Put a preempted ``s`` back: first under fcfs (vLLM ``prepend_request``), at its
        original (priority, arrival) place under priority."""
        if isinstance(self._items, deque):
            self._items.appendleft(s)
        else:
            bisect.insort(self._items, s, key=lambda x: x.order)


@dataclass(slots=True)
class EngineStats:
    """Counters since start or the last reset."""

    steps: int = 0
    generated: int = 0
    preemptions: int = 0  # running sequences preempted by recompute (``preemption`` mode)


class Engine:
    """The scheduler loop of one replica. Start with :meth:`start`, stop with :meth:`stop`."""

    def __init__(
        self,
        perf: PerfModel,
        cache: PrefixCache,
        metrics: SimMetrics,
        *,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        time_scale: float = 1.0,
        seed: int = 0,
        scheduling_policy: Literal["fcfs", "priority"] = "fcfs",
        preemption: bool = False,
    ) -> None:
        self.perf = perf
        self.preemption = preemption
        self.cache = cache
        self.metrics = metrics
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.time_scale = time_scale
        self.rng = random.Random(seed)
        self.scheduling_policy = scheduling_policy
        self.waiting = WaitingQueue(scheduling_policy)
        self.running: list[Sequence] = []
        self.stats = EngineStats()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- control ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the loop task (call from the running event loop)."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        """Cancel the loop task."""
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def submit(self, job: Job) -> None:
        """Queue every sequence of ``job``. Raises ValueError if one can never fit the cache."""
        bs = self.cache.block_size
        for s in job.seqs:
            if -(-(s.prompt_tokens + s.output_tokens) // bs) > self.cache.num_blocks:
                raise ValueError("request needs more KV-cache blocks than the replica has")
        for s in job.seqs:
            self.waiting.add(s)
        self._wake.set()

    def abort(self, job: Job) -> None:
        """Remove ``job``'s unfinished sequences (client gone, or a stop string reached)."""
        for s in job.seqs:
            self.finish(s)

    def finish(self, s: Sequence) -> None:
        """Finish one sequence early and release its blocks."""
        if s.done:
            return
        s.done = True
        if s.alloc is not None:
            self.cache.free(s.alloc)
            s.alloc = None
            self.running.remove(s)
        else:
            try:
                self.waiting.remove(s)
            except ValueError:
                pass

    @property
    def num_running(self) -> int:
        """Sequences in the running batch."""
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """Sequences in the waiting queue."""
        return len(self.waiting)

    # -- loop ------------------------------------------------------------------------------
    def _admit(self) -> None:
        cache, bs, m = self.cache, self.cache.block_size, self.metrics
        while self.waiting and len(self.running) < self.max_num_seqs:
            s = self.waiting.head()
            # preemption mode: the prompt (and, recomputed, the output so far) plus the first
            # new token, decode blocks later (_grow); else prompt + whole output up front
            held = s.prompt_tokens + (s.generated + 1 if self.preemption else s.output_tokens)
            total_blocks = max(-(-held // bs), len(s.block_hashes))
            alloc = cache.allocate(s.block_hashes, s.prompt_tokens, total_blocks)
            if alloc is None:
                return
            self.waiting.pop_head()
            s.alloc = alloc
            s.cached_tokens = alloc.cached_tokens(bs)
            s.prefill_left = s.prompt_tokens + s.generated - s.cached_tokens
            self.running.append(s)
            m.prefix_queries.inc(s.prompt_tokens)
            if s.cached_tokens:
                m.prefix_hits.inc(s.cached_tokens)
            m.prompt_tokens.inc(s.prompt_tokens)

    async def _run(self) -> None:
        perf = self.perf
        while True:
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            self._admit()
            if self.preemption:
                self._grow()
            if not self.running:  # defensive: the queue head cannot be placed yet
                self._wake.clear()
                await self._wake.wait()
                continue
            decoding = [s for s in self.running if s.prefill_left == 0]
            budget = max(0, self.max_num_batched_tokens - len(decoding))
            prefill_tokens = 0
            prefilled: list[Sequence] = []
            for s in self.running:
                if s.prefill_left and budget:
                    take = min(s.prefill_left, budget)
                    s.prefill_left -= take
                    budget -= take
                    prefill_tokens += take
                    if s.prefill_left == 0:
                        prefilled.append(s)
            delay = perf.forward_s(len(decoding), prefill_tokens) * self.time_scale
            await asyncio.sleep(delay)
            self._emit(decoding, prefilled)

    def _grow(self) -> None:
        """Give every decoding sequence the blocks this step's tokens need; when the pool has
        none left, preempt the newest running sequence by recompute (vLLM V1
        ``Scheduler.schedule``: ``self.running.pop()``, its blocks freed, back at the front of
        the waiting queue to prefill prompt + output so far again), counted in
        ``vllm:num_preemptions``."""
        bs, step = self.cache.block_size, self.perf.num_speculative_tokens + 1
        for s in list(self.running):
            if s.alloc is None or s.prefill_left or s.done:
                continue
            need = -(-(s.prompt_tokens + s.generated + min(step, s.output_tokens - s.generated))
                     // bs) - len(s.alloc.hashes) - s.alloc.private
            while need > 0 and s.alloc is not None and not self.cache.grow(s.alloc, need):
                self._preempt(self.running[-1])  # possibly s itself, the newest

    def _preempt(self, victim: Sequence) -> None:
        if victim.alloc is not None:
            self.cache.free(victim.alloc)
            victim.alloc = None
        self.running.remove(victim)
        victim.prefill_left = 0
        self.waiting.push_front(victim)
        self.stats.preemptions += 1
        self.metrics.preemptions.inc()
        self.metrics.sim_recomputed.inc(victim.prompt_tokens + victim.generated)

    def _emit(self, decoding: list[Sequence], prefilled: list[Sequence]) -> None:
        """Hand out this step's tokens; finish sequences that reached their length."""
        perf, m = self.perf, self.metrics
        spec = perf.speculative
        k = perf.num_speculative_tokens
        total = 0
        accepted_total = 0
        drafts = 0
        for s in decoding:
            if s.done:  # aborted while the step ran
                continue
            n = 1
            if spec:
                acc = perf.draw_accepted(self.rng)
                drafts += 1
                accepted_total += acc
                n = acc + 1
            total += self._give(s, n)
        for s in prefilled:
            if not s.done:
                total += self._give(s, 1)
        self.stats.steps += 1
        self.stats.generated += total
        if total:
            m.generation_tokens.inc(total)
        if drafts and m.spec_drafts is not None:
            m.spec_drafts.inc(drafts)
            m.spec_draft_tokens.inc(drafts * k)
            m.spec_accepted.inc(accepted_total)

    def _give(self, s: Sequence, n: int) -> int:
        n = min(n, s.output_tokens - s.generated)
        s.generated += n
        done = s.generated >= s.output_tokens
        job = s.job
        job.outbox.append((s.index, n, done))
        job.event.set()
        if done:
            s.done = True
            if s.alloc is not None:
                self.cache.free(s.alloc)
                s.alloc = None
            self.running.remove(s)
        return n
