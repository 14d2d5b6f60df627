"""A priority band's reserved slots end to end: kept free *for* the band, not on top
of what it holds. One replica with three slots (``max_inflight_per_replica: 3``), one of them
reserved for the interactive band (``reserved_share: 0.3``). Slots are held by "blockers":
streams the engine paces (``sim_faults.chunk_interval_s``) that the test closes when it
chooses, so whether a request waits is decided by the slot rule, never by timing luck.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.e2e.helpers import CHAT, metric, wait_for
from tests.e2e.stack import MODEL, Stack

pytestmark = pytest.mark.e2e

POOL = f"{MODEL}/standard"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(
        tmp_path_factory.mktemp("flow-reserve"),
        replicas_per_tier=1,
        timeouts={"connect_s": 2, "ttft_s": 300, "stall_s": 5, "total_s": 600},
        sim_args=("--time-scale", "0.02", "--scheduling-policy", "priority"),
        pool_overrides={"outlier": {"enabled": False}},
        tier_overrides={"standard": {"max_inflight_per_replica": 3,
                                     "scheduling_policy": "priority"}},
        config_extra={"flow_control": {"bands": [
            {"name": "interactive", "max_queue_s": 600, "reserved_share": 0.3},
            {"name": "standard", "max_queue_s": 600},
            {"name": "batch", "max_queue_s": 900},
        ]}},
    )
    try:
        s.start()
        yield s
    finally:
        s.stop()


class Blocker:
    """A stream of ``band`` holding one slot of the standard pool until ``close()``."""

    def __init__(self, stack: Stack, band: str) -> None:
        self._client = httpx.Client(base_url=stack.base_url, timeout=30)
        body = {"model": MODEL, "stream": True, "max_tokens": 1000, "ignore_eos": True,
                "messages": [{"role": "user", "content": f"blocker-{band}"}],
                "sim_faults": {"chunk_interval_s": 0.1}}
        self._cm = self._client.stream("POST", CHAT, json=body,
                                       headers={"x-speedgate-priority": band})
        r = self._cm.__enter__()
        assert r.status_code == 200
        self._events = r.iter_raw()  # kept: dropping the iterator would close the stream
        next(self._events)  # the first event: the slot is taken

    def close(self) -> None:
        if self._client.is_closed:
            return
        self._cm.__exit__(None, None, None)
        self._client.close()


def ask(stack: Stack, band: str) -> httpx.Response:
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": band}]}
    return httpx.post(stack.base_url + CHAT, json=body, timeout=60,
                      headers={"x-speedgate-priority": band})


def queued(stack: Stack) -> float:
    return metric(stack, "speedgate_queue_length", pool=POOL)


def test_an_unused_reservation_stays_free_and_a_used_one_costs_the_others_nothing(
        stack: Stack):
    standard = Blocker(stack, "standard")
    top: Blocker | None = None
    try:
        with ThreadPoolExecutor(2) as pool:
            # 1 of 3 slots held; the reserved one is unused: batch may fill up to 2 in use
            assert ask(stack, "batch").status_code == 200
            second = Blocker(stack, "batch")  # 2 in use now: the 3rd is the reservation
            waiting = pool.submit(ask, stack, "batch")
            assert wait_for(lambda: queued(stack) >= 1, timeout_s=10)
            assert not waiting.done()
            # the interactive band takes its reserved slot straight away...
            top = Blocker(stack, "interactive")
            # ...and, the reservation in use, nothing more is kept free: 3 of 3 in use
            assert queued(stack) == 1 and not waiting.done()
            second.close()  # a slot frees: the batch request goes, though interactive holds 1
            assert waiting.result(timeout=30).status_code == 200
            assert wait_for(lambda: queued(stack) == 0, timeout_s=10)
            # with the interactive request in its reserved slot, batch fills every other slot
            assert ask(stack, "batch").status_code == 200
    finally:
        standard.close()
        if top is not None:
            top.close()
