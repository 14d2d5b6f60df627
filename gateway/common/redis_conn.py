"""The gateway's one Redis connection: a redis-py asyncio client (its connection pool) and the
circuit breaker guarding it, built once from ``state`` (``redis_url``, ``redis_timeout_s``,
``breaker_failures``, ``breaker_cooldown_s``) and shared by every Redis user: the routing store,
the rate limiter and the usage store. One breaker per connection, so a Redis outage seen by any
of them is seen by all (the others skip Redis at once instead of each paying the timeout until
its own breaker opens), and ``degraded`` (``/readyz``, ``speedgate_state_store_degraded``) is
one fact about Redis, whoever noticed it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.common.breaker import CircuitBreaker
from gateway.config import StateConfig


@dataclass(slots=True, eq=False)
class RedisConnection:
    """``client``: a ``redis.asyncio.Redis`` whose connect and read timeouts are ``timeout_s``
    seconds; ``breaker``: the circuit breaker every call through it must use."""

    client: Any
    breaker: CircuitBreaker
    timeout_s: float

    @classmethod
    def from_config(cls, state: StateConfig) -> RedisConnection | None:
        """The connection of ``state`` (None without ``redis_url``). No socket is opened
        here: redis-py connects on first use, inside the event loop that uses it."""
        if not state.redis_url:
            return None
        from gateway.common.redis_client import redis_client

        t = state.redis_timeout_s
        client = redis_client(state.redis_url, timeout_s=t, connect_timeout_s=t)
        breaker = CircuitBreaker(
            "redis", failures=state.breaker_failures, cooldown_s=state.breaker_cooldown_s
        )
        return cls(client, breaker, t)

    @property
    def degraded(self) -> bool:
        """True while Redis is considered down (from the breaker opening until a call
        succeeds)."""
        return self.breaker.degraded

    async def close(self) -> None:
        """Close the client's connections (its owner calls this once, at shutdown)."""
        await self.client.aclose()
