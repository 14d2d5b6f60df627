"""``MovingDeadline``: the relay's stall window, moved at every read without a timer per read.
Time margins are wide (a deadline 50-200 ms away against sleeps of seconds or a deadline
minutes away): nothing depends on how fast this machine is."""

from __future__ import annotations

import asyncio

import pytest

from gateway.common.moving_deadline import MovingDeadline


async def test_expires_into_timeout_error() -> None:
    loop = asyncio.get_running_loop()
    d = MovingDeadline(loop.time() + 0.05)
    with pytest.raises(TimeoutError):
        async with d:
            await asyncio.sleep(30)
    assert d.expired()


async def test_extended_deadline_does_not_fire_at_the_first_one() -> None:
    loop = asyncio.get_running_loop()
    d = MovingDeadline(loop.time() + 0.05)
    async with d:
        d.extend(loop.time() + 600)  # the first timer fires, finds the deadline moved, re-arms
        await asyncio.sleep(0.3)
    assert not d.expired()


async def test_extension_then_expiry_at_the_moved_deadline() -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    d = MovingDeadline(start + 0.05)
    with pytest.raises(TimeoutError):
        async with d:
            d.extend(start + 0.2)
            await asyncio.sleep(30)
    assert loop.time() - start >= 0.19  # not at the first deadline (one timer tick early at most)


async def test_an_earlier_deadline_is_ignored() -> None:
    loop = asyncio.get_running_loop()
    d = MovingDeadline(loop.time() + 600)
    async with d:
        d.extend(loop.time() - 1)
        await asyncio.sleep(0.1)
    assert not d.expired()


async def test_an_outside_cancel_stays_a_cancel() -> None:
    loop = asyncio.get_running_loop()
    entered = asyncio.Event()

    async def body() -> None:
        async with MovingDeadline(loop.time() + 600):
            entered.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(body())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_outside_cancel_after_expiry_is_not_swallowed() -> None:
    """The deadline passed and someone else cancelled the task too: the cancel wins, as with
    ``asyncio.timeout``."""
    loop = asyncio.get_running_loop()

    async def body() -> None:
        async with MovingDeadline(loop.time()):
            asyncio.current_task().cancel()  # type: ignore[union-attr]
            await asyncio.sleep(30)

    task = asyncio.create_task(body())
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_errors_of_the_block_pass_through() -> None:
    loop = asyncio.get_running_loop()
    with pytest.raises(ValueError):
        async with MovingDeadline(loop.time() + 600):
            raise ValueError("from the block")
