"""DNS-based replica discovery: re-resolve one name on an interval and emit the endpoint URLs.

A pool declared by a DNS name (a Kubernetes headless Service, a compose network alias, a
round-robin record) has one replica per address the name resolves to. ``DnsDiscovery`` resolves
``host`` every ``interval_s`` with the event loop's ``getaddrinfo`` (or an injected resolver) and
calls ``on_change(urls)`` whenever the set of replicas changes, so a pool scales without a config
edit.

Choices, and why:
- **Stable order.** URLs are sorted by address (numerically, IPv4 before IPv6), never in resolver
  order, which rotates: every gateway replica then sees the same list, and consistent hashing
  over it agrees across gateways.
- **Last good list on failure.** A resolver error, a timeout or an empty answer keeps the previous
  list: a DNS hiccup must not empty a pool. Replicas that are really gone are taken out by the
  health probes; the next good answer drops them from the list. (A headless Service scaled to
  zero answers NXDOMAIN, which is therefore also "keep the last list": zero replicas is the one
  state this loop cannot express, by design.)
- **One family.** A dual-stack name returns an IPv4 and an IPv6 address for the same server;
  counting both would make two "replicas" of one engine. ``family="auto"`` keeps IPv4 when there
  is any, else IPv6.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import Literal

from gateway.common.tasks import cancel_and_wait, every
from gateway.fleet.pools import PoolRegistry

log = logging.getLogger("speedgate.discovery")

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""``resolver(host, port)`` → addresses (strings) the name resolves to; raises on failure."""

Family = Literal["auto", "ipv4", "ipv6", "any"]


async def getaddrinfo_resolver(host: str, port: int) -> list[str]:
    """Resolve ``host`` with the running loop's ``getaddrinfo`` (TCP); addresses, unsorted."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return [str(info[4][0]) for info in infos]


def _sort_key(addr: str) -> tuple[int, int, str]:
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:  # a stub resolver may hand back names: sort them after addresses
        return (9, 0, addr)
    return (ip.version, int(ip), addr)


def _select_family(addrs: Iterable[str], family: Family) -> list[str]:
    def version(a: str) -> int:
        try:
            return ipaddress.ip_address(a).version
        except ValueError:
            return 0

    addrs = list(addrs)
    if family == "ipv4":
        return [a for a in addrs if version(a) == 4]
    if family == "ipv6":
        return [a for a in addrs if version(a) == 6]
    if family == "auto":
        v4 = [a for a in addrs if version(a) in (0, 4)]
        return v4 or [a for a in addrs if version(a) == 6]
    return addrs


def endpoint_urls(
    addrs: Iterable[str], port: int, scheme: str = "http", family: Family = "auto"
) -> list[str]:
    """Base URLs for ``addrs`` (deduplicated, one family, sorted), e.g. ``http://10.0.0.5:8000``;
    IPv6 addresses in brackets. Pure."""
    chosen = sorted(set(_select_family(addrs, family)), key=_sort_key)
    urls = []
    for a in chosen:
        host = f"[{a}]" if ":" in a else a
        urls.append(f"{scheme}://{host}:{port}")
    return urls


class DnsDiscovery:
    """Keeps ``urls`` (the last good endpoint list of ``host:port``) fresh.

    ``await resolve_once()`` resolves now and returns the current list; ``start()`` runs that
    every ``interval_s`` in a task until ``await stop()``. ``on_change(urls)`` is called (from the
    loop) when the list changes, including the first good answer. ``failures`` counts resolutions
    in a row that failed (0 after a good one); ``last_error`` says why the last one failed.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        interval_s: float = 5.0,
        timeout_s: float = 2.0,
        scheme: str = "http",
        family: Family = "auto",
        resolver: Resolver | None = None,
        on_change: Callable[[list[str]], None] | None = None,
    ) -> None:
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError("interval_s and timeout_s must be > 0")
        self.host = host
        self.port = port
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.scheme = scheme
        self.family: Family = family
        self.resolver: Resolver = resolver or getaddrinfo_resolver
        self.on_change = on_change
        self.urls: list[str] = []
        self.failures = 0
        self.last_error: str | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        """``host:port``, for logs."""
        return f"{self.host}:{self.port}"

    async def resolve_once(self) -> list[str]:
        """Resolve now; on success adopt the answer, on failure keep the last good list.
        Returns the current list either way. Never raises (but lets cancellation through)."""
        try:
            addrs = await asyncio.wait_for(self.resolver(self.host, self.port), self.timeout_s)
            urls = endpoint_urls(addrs, self.port, self.scheme, self.family)
            if not urls:
                raise LookupError("no addresses")
        except asyncio.CancelledError:
            raise
        except Exception as e:  # resolver errors are data here: log, count, keep serving
            self.failures += 1
            self.last_error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            log.warning(
                "discovery %s failed (%d in a row: %s); keeping %d endpoint(s)",
                self.name, self.failures, self.last_error, len(self.urls),
            )
            return self.urls
        self.failures = 0
        self.last_error = None
        if urls != self.urls:
            log.info("discovery %s: %d endpoint(s) %s", self.name, len(urls), urls)
            self.urls = urls
            if self.on_change is not None:
                try:
                    self.on_change(list(urls))
                except Exception:
                    log.exception("discovery %s: on_change failed", self.name)
        return self.urls

    def start(self) -> None:
        """Start the re-resolve loop in the running event loop (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                every(self.interval_s, self.resolve_once)
            )

    async def stop(self) -> None:
        """Stop the loop and wait for it."""
        await cancel_and_wait([self._task])
        self._task = None



async def start_discoveries(pools: PoolRegistry) -> list[DnsDiscovery]:
    """One started ``DnsDiscovery`` per pool whose config has ``discovery``, each resolved once
    before it returns (a pool starts with its endpoints), feeding ``pool.set_endpoints``. The
    caller stops each (``await d.stop()``) at shutdown."""
    started: list[DnsDiscovery] = []
    for pool in pools.all():
        d = pool.config.discovery
        if d is not None:
            disc = DnsDiscovery(
                d.host, d.port, interval_s=d.interval_s, timeout_s=d.timeout_s,
                scheme=d.scheme, family=d.family, on_change=pool.set_endpoints,
            )
            await disc.resolve_once()
            disc.start()
            started.append(disc)
    return started
