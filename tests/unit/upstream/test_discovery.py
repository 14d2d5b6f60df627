"""DNS replica discovery: ordering, last good list on failure, change events, loop, localhost."""

from __future__ import annotations

import asyncio
import socket

import pytest

from gateway.upstream.discovery import DnsDiscovery, endpoint_urls


class StubResolver:
    """Answers from a script: each call pops the next answer (a list, or an exception to raise);
    the last answer repeats. Records the names it was asked."""

    def __init__(self, *answers: list[str] | BaseException) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append((host, port))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return list(answer)


def test_urls_are_sorted_numerically_and_deduplicated() -> None:
    addrs = ["10.0.0.10", "10.0.0.9", "10.0.0.10", "10.0.1.2"]
    assert endpoint_urls(addrs, 8000) == [
        "http://10.0.0.9:8000",
        "http://10.0.0.10:8000",
        "http://10.0.1.2:8000",
    ]


def test_order_does_not_depend_on_resolver_order() -> None:
    a = ["10.1.0.3", "10.1.0.1", "10.1.0.2"]
    assert endpoint_urls(a, 80) == endpoint_urls(reversed(a), 80)


def test_auto_family_prefers_ipv4_and_falls_back_to_ipv6() -> None:
    dual = ["fd00::2", "10.0.0.2", "fd00::1", "10.0.0.1"]
    assert endpoint_urls(dual, 8000) == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert endpoint_urls(["fd00::2", "fd00::1"], 8000, "https") == [
        "https://[fd00::1]:8000",
        "https://[fd00::2]:8000",
    ]
    assert endpoint_urls(dual, 1, family="ipv6") == ["http://[fd00::1]:1", "http://[fd00::2]:1"]
    assert len(endpoint_urls(dual, 1, family="any")) == 4


async def test_change_events_and_last_good_list_on_failure() -> None:
    resolver = StubResolver(
        ["10.0.0.2", "10.0.0.1"],
        socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
        [],  # an empty answer is a failure too: it must not empty the pool
        ["10.0.0.3", "10.0.0.1", "10.0.0.2"],
        ["10.0.0.1", "10.0.0.2", "10.0.0.3"],  # same set, other order: no event
    )
    seen: list[list[str]] = []
    d = DnsDiscovery("engine-standard", 8000, resolver=resolver, on_change=seen.append)
    first = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]

    assert await d.resolve_once() == first
    assert (d.failures, d.last_error) == (0, None)
    assert await d.resolve_once() == first
    assert d.failures == 1 and d.last_error is not None and "gaierror" in d.last_error
    assert await d.resolve_once() == first
    assert d.failures == 2 and d.last_error is not None and "LookupError" in d.last_error
    grown = [*first, "http://10.0.0.3:8000"]
    assert await d.resolve_once() == grown
    assert d.failures == 0
    assert await d.resolve_once() == grown

    assert seen == [first, grown]
    assert resolver.calls == [("engine-standard", 8000)] * 5


async def test_failure_before_any_answer_leaves_empty_list_and_no_event() -> None:
    seen: list[list[str]] = []
    d = DnsDiscovery("nope", 1, resolver=StubResolver(OSError("down")), on_change=seen.append)
    assert await d.resolve_once() == []
    assert seen == [] and d.failures == 1


async def test_slow_resolver_times_out_and_keeps_list() -> None:
    async def slow(host: str, port: int) -> list[str]:
        await asyncio.sleep(10)
        return ["10.9.9.9"]

    d = DnsDiscovery("slow", 1, timeout_s=0.05, resolver=slow)
    d.urls = ["http://10.0.0.1:1"]
    assert await d.resolve_once() == ["http://10.0.0.1:1"]
    assert d.last_error is not None and "Timeout" in d.last_error


async def test_a_failing_callback_does_not_stop_discovery() -> None:
    def boom(urls: list[str]) -> None:
        raise RuntimeError("subscriber bug")

    d = DnsDiscovery("x", 1, resolver=StubResolver(["10.0.0.1"]), on_change=boom)
    assert await d.resolve_once() == ["http://10.0.0.1:1"]


async def test_loop_re_resolves_on_interval_and_stops() -> None:
    resolver = StubResolver(["10.0.0.1"], ["10.0.0.1"], ["10.0.0.1", "10.0.0.2"])
    changed = asyncio.Event()
    seen: list[list[str]] = []

    def record(urls: list[str]) -> None:
        seen.append(urls)
        if len(urls) == 2:
            changed.set()

    d = DnsDiscovery("pool", 9, interval_s=0.01, resolver=resolver, on_change=record)
    d.start()
    d.start()  # idempotent: still one loop
    try:
        await asyncio.wait_for(changed.wait(), 5)
    finally:
        await d.stop()
    calls = len(resolver.calls)
    await asyncio.sleep(0.05)
    assert len(resolver.calls) == calls, "no resolution after stop()"
    assert seen == [["http://10.0.0.1:9"], ["http://10.0.0.1:9", "http://10.0.0.2:9"]]


def test_rejects_non_positive_interval() -> None:
    with pytest.raises(ValueError):
        DnsDiscovery("x", 1, interval_s=0)


async def test_localhost_resolves_through_the_event_loop() -> None:
    d = DnsDiscovery("localhost", 8000)
    urls = await d.resolve_once()
    assert d.failures == 0, d.last_error
    # localhost is 127.0.0.1 and/or ::1; "auto" keeps one family, so one replica, not two
    assert urls in (["http://127.0.0.1:8000"], ["http://[::1]:8000"])
    assert await d.resolve_once() == urls


async def test_any_family_on_localhost_is_sorted_ipv4_first() -> None:
    urls = await DnsDiscovery("localhost", 80, family="any").resolve_once()
    assert urls and urls == sorted(urls, key=lambda u: ("[" in u, u))
