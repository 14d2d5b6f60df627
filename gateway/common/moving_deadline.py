"""A timeout whose deadline only moves later, at the cost of a float store per move.

A stream's stall limit restarts at every upstream read: with ``asyncio.timeout_at`` that is a
``reschedule`` per read, which cancels the loop timer and schedules a new one (a heap push and,
on uvloop, a libuv timer restart) for every token of every stream. ``MovingDeadline`` keeps
the timer it armed and, when it fires, re-arms it at the deadline as it stands then, if that
moved: one timer event per stall window, not one per token (the idle-timer pattern of
Netty's ``IdleStateHandler``). Cancellation works as in ``asyncio.timeouts.Timeout``
(CPython 3.11): the task is cancelled when the deadline passes, and the ``CancelledError`` is
turned into ``TimeoutError`` on exit unless someone else also cancelled the task.
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class MovingDeadline:
    """``async with MovingDeadline(when) as d:`` … ``d.extend(later)`` … (loop time, seconds).

    Raises ``TimeoutError`` out of the block when the loop time passes the deadline, which is
    ``when`` or the latest ``extend`` value, whichever is later. Like ``asyncio.timeout_at``,
    it may fire up to one timer resolution (~1 ms on uvloop) early."""

    __slots__ = ("_armed", "_cancelling", "_expired", "_handle", "_loop", "_task", "_when")

    def __init__(self, when: float) -> None:
        self._when = when
        self._armed = when
        self._expired = False
        self._cancelling = 0
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[object] | None = None

    def extend(self, when: float) -> None:
        """Move the deadline to ``when`` if that is later (an earlier one is ignored)."""
        if when > self._when:
            self._when = when

    def expired(self) -> bool:
        """True once the deadline passed inside the block."""
        return self._expired

    async def __aenter__(self) -> MovingDeadline:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("MovingDeadline must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._loop = asyncio.get_running_loop()
        self._arm(self._when)
        return self

    def _arm(self, when: float) -> None:
        assert self._loop is not None
        self._armed = when
        self._handle = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._handle = None
        if self._when > self._armed:  # moved meanwhile: wait for the rest
            self._arm(self._when)
            return
        self._expired = True
        assert self._task is not None
        self._task.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None  # the handle holds ``_fire``: no reference cycle left
        task, self._task = self._task, None
        if self._expired and task is not None:
            if task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc
