"""Background tasks of the gateway (probes, scrapers, discovery): one loop, one way to stop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable


async def every(interval_s: float, step: Callable[[], Awaitable[object]]) -> None:
    """Run ``step`` now and then every ``interval_s`` seconds after it returns, until
    cancelled (the loop of a background task)."""
    while True:
        await step()
        await asyncio.sleep(interval_s)


async def cancel_and_wait(tasks: Iterable[asyncio.Task[None] | None]) -> None:
    """Cancel every task (None entries skipped) and wait until each has finished."""
    live = [t for t in tasks if t is not None]
    for t in live:
        t.cancel()
    for t in live:
        with contextlib.suppress(asyncio.CancelledError):
            await t
