"""``Pool.release`` and ``wait_for_slot``: a continuation waiting for a saturated pool is woken
by the release of a slot, in any of the pools it waits on, and leaves no waiter behind."""

import asyncio

from gateway.config import GatewayConfig
from gateway.fleet.pools import PoolRegistry, wait_for_slot


def _pools():
    tiers = {t: {"served_model_name": "m", "endpoints": ["http://h:1"],
                 "max_inflight_per_replica": 1} for t in ("fast", "standard")}
    reg = PoolRegistry(GatewayConfig(models={"m": {"tiers": tiers}}))
    return reg.get("m", "fast"), reg.get("m", "standard")


def test_release_wakes_a_waiter_of_any_pool():
    async def main():
        fast, std = _pools()
        replica = std.replicas[0]
        replica.inflight = 1
        assert std.usable(0.0) == []
        waiting = asyncio.create_task(wait_for_slot([fast, std], 3600))
        await asyncio.sleep(0)  # the waiter registers
        assert len(fast.slot_waiters) == len(std.slot_waiters) == 1
        std.release(replica)
        assert await waiting is True
        assert replica.inflight == 0 and std.usable(0.0) == [replica]
        assert not fast.slot_waiters and not std.slot_waiters

    asyncio.run(main())


def test_no_wait_without_time_and_cancel_leaves_no_waiter():
    async def main():
        fast, std = _pools()
        assert await wait_for_slot([fast], 0) is False
        waiting = asyncio.create_task(wait_for_slot([fast, std], 3600))
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert not fast.slot_waiters and not std.slot_waiters

    asyncio.run(main())
