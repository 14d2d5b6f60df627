"""Replica choice within a pool: filters → weighted scorers → picker.

- ``keys``: session key and prefix block chain of a request (no tokenizer);
- ``filters``: not-yet-tried, bounded load, overloaded; ``session_ledger``: active sessions per
  replica; ``scorers/``: one file per scorer, each in [0, 1]; ``picker``: best weighted
  score or round robin; ``pipeline``: one pool's router;
- ``store``: session and prefix bindings, in memory or Redis; ``table``: the bounded LRU+TTL
  table; ``hashring``: rendezvous order (the load signals are the fleet's,
  ``gateway.fleet.pools.replica_load``, scraped by ``gateway.upstream.load_scraper``);
- ``service``: builds it all in the app's lifespan (store, breaker, metrics).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from gateway.fleet.pools import Pool, Replica
from gateway.routing.keys import RouteRequest
from gateway.routing.least_inflight import pick_least_inflight


async def pick_replica(
    pool: Pool,
    route: RouteRequest | None,
    candidates: Sequence[Replica],
    exclude: Collection[Replica] = (),
) -> Replica | None:
    """The replica for the next attempt on ``pool`` (never one in ``exclude``): the pool's
    router when the routing service runs, else the fewest in-flight requests."""
    if pool.router is None:
        return pick_least_inflight(candidates, exclude=exclude)
    return await pool.router.pick(route, candidates, exclude)


__all__ = ["RouteRequest", "pick_least_inflight", "pick_replica"]
