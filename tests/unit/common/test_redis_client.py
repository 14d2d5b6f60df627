"""``keep_cancellation`` and the cancel-safe redis-py client: a cancellation the library
swallows (it returns the command's result instead) is raised again; a timeout stays a
timeout; a call nobody cancelled returns its result."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from gateway.common.redis_client import CancelSafeRedis, keep_cancellation


async def _swallowing() -> str:
    """What redis-py does when the cancellation lands in its release step: return anyway."""
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        return "result"
    return "never"


async def _cancel_soon(coro) -> asyncio.Task:
    task = asyncio.get_running_loop().create_task(coro)
    await asyncio.sleep(0.01)
    assert task.cancel()
    return task


async def test_a_swallowed_cancellation_is_raised_again():
    plain = await _cancel_soon(_swallowing())
    assert await plain == "result"  # the bug: the caller never learns it was cancelled
    safe = await _cancel_soon(keep_cancellation(_swallowing()))
    with pytest.raises(asyncio.CancelledError):
        await safe


async def test_a_timeout_around_a_swallowing_call_stays_a_timeout():
    async def call() -> None:
        async with asyncio.timeout(0.01):
            await keep_cancellation(_swallowing())

    with pytest.raises(TimeoutError):
        await call()
    assert asyncio.current_task().cancelling() == 0


async def test_an_uncancelled_call_returns_its_result():
    async def quick() -> int:
        await asyncio.sleep(0)
        return 7

    assert await keep_cancellation(quick()) == 7


async def test_the_client_keeps_the_cancellation_of_a_command(monkeypatch):
    async def swallowing_command(self, *args, **options):
        return await _swallowing()

    monkeypatch.setattr(Redis, "execute_command", swallowing_command)
    client = CancelSafeRedis()
    task = await _cancel_soon(client.get("k"))
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await (await _cancel_soon(Redis().get("k"))) == "result"  # redis-py's own
