"""The redis-py asyncio client every Redis user of the gateway builds (``redis_client``), made
to keep a task's cancellation.

redis-py (checked on 8.1.0, the newest release; every 5.x-8.x release has the same command
path) can hand back a command's result to a task that was cancelled while it awaited the
command: the ``CancelledError`` is raised inside the library (in its connection
release/recording steps) and consumed there, so the caller sees an ordinary return and the
cancellation is lost (a probe: 3 of 200 cancelled ``GET`` s returned normally). The gateway
cancels a request's task when its client disconnects (``asgi.DisconnectWatch``), when a
Responses cancel arrives and at shutdown: a lost cancellation during a routing lookup let an
abandoned request run to completion and be billed.

``keep_cancellation`` is the one rule, applied at the two entry points every command passes
through (``execute_command``, ``Pipeline.execute``/``reset``; Lua scripts run through
``execute_command``): when the awaiting task's ``cancelling()`` count grew while the call ran
and the call returned anyway, the cancellation is raised again. A cancellation the library
propagated is untouched; an ``asyncio.timeout`` around a call consumes its own (it uncancels on
exit), so timeouts stay timeouts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

T = TypeVar("T")


async def keep_cancellation(call: Awaitable[T]) -> T:
    """Await ``call``; raise ``CancelledError`` if the current task was cancelled meanwhile
    and ``call`` returned (or raised something else) anyway."""
    task = asyncio.current_task()
    before = task.cancelling() if task is not None else 0
    try:
        result = await call
    except asyncio.CancelledError:
        raise
    except BaseException:
        if task is not None and task.cancelling() > before:
            raise asyncio.CancelledError() from None
        raise
    if task is not None and task.cancelling() > before:
        raise asyncio.CancelledError()
    return result


class CancelSafePipeline(Pipeline):
    """A pipeline whose ``execute`` and ``reset`` keep the task's cancellation."""

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        return await keep_cancellation(super().execute(raise_on_error))

    # redis's own Pipeline.reset is a coroutine too; its stubs also inherit the RESET command's
    # signature (ManagementCommands.reset), which no pipeline override can match
    async def reset(self) -> None:  # type: ignore[override]
        await keep_cancellation(super().reset())


class CancelSafeRedis(Redis):
    """``redis.asyncio.Redis`` whose commands and pipelines keep the task's cancellation."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        return await keep_cancellation(super().execute_command(*args, **options))

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
        return CancelSafePipeline(self.connection_pool, self.response_callbacks, transaction,
                                  shard_hint)


def redis_client(url: str, *, timeout_s: float | None, connect_timeout_s: float) -> Redis:
    """A cancel-safe client for ``url``: reads time out after ``timeout_s`` seconds (None: no
    read timeout, for a subscriber), connects after ``connect_timeout_s``."""
    return CancelSafeRedis.from_url(url, socket_timeout=timeout_s,
                                    socket_connect_timeout=connect_timeout_s)
