"""Cancel across gateway replicas: a ``POST /v1/responses/{id}/cancel`` may reach a gateway
process other than the one running the response. With Redis configured, every running response
has a marker ``<prefix>run:<id>`` (its API key id, TTL = its deadline) while it runs, and a
cancel reaching another gateway publishes the id on ``<prefix>cancel``; each gateway subscribes
and the one running it aborts it (as for a local cancel: its replica is told, the upstream
connection closed). The markers are written and deleted off the request path (background
tasks), so a slow or absent Redis adds nothing to a request's latency; a lost marker only means
that a cancel from another gateway answers 404.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.protocols.responses.ids import CANCEL_CHANNEL, RUN_SPACE

log = logging.getLogger("speedgate.responses")

RECONNECT_S = 1.0  # wait before subscribing again after Redis failed


class CancelBus:
    """Markers and the cancel channel in Redis. ``client`` (short timeouts) runs commands;
    ``subscriber`` (no read timeout) holds the subscription. ``start(on_cancel)`` in the app's
    lifespan, ``stop()`` at shutdown."""

    def __init__(self, client: Any, subscriber: Any, prefix: str) -> None:
        self.client, self.subscriber = client, subscriber
        self.channel = prefix + CANCEL_CHANNEL
        self.run_prefix = prefix + RUN_SPACE
        self._tasks: set[asyncio.Task[Any]] = set()
        self._listener: asyncio.Task[None] | None = None

    @classmethod
    def from_url(cls, url: str, *, timeout_s: float, prefix: str) -> CancelBus:
        """A bus on new clients for ``url`` (commands time out after ``timeout_s``)."""
        from gateway.common.redis_client import redis_client

        client = redis_client(url, timeout_s=timeout_s, connect_timeout_s=timeout_s)
        subscriber = redis_client(url, timeout_s=None, connect_timeout_s=timeout_s)
        return cls(client, subscriber, prefix)

    def _background(self, coro: Awaitable[Any]) -> None:
        async def run() -> None:
            with contextlib.suppress(Exception):
                await coro

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def started(self, response_id: str, key: str, ttl_s: float) -> None:
        """Mark ``response_id`` as running here (background)."""
        ms = max(1000, int(ttl_s * 1000))
        self._background(self.client.set(self.run_prefix + response_id, key, px=ms))

    def ended(self, response_id: str) -> None:
        """Remove the marker (background)."""
        self._background(self.client.delete(self.run_prefix + response_id))

    async def owner(self, response_id: str) -> str | None:
        """The key id of a response running on some gateway, or None (not running, or Redis
        unavailable)."""
        try:
            raw = await self.client.get(self.run_prefix + response_id)
        except Exception:
            return None
        return raw.decode() if isinstance(raw, bytes) else raw

    async def publish(self, response_id: str) -> None:
        """Ask every gateway to cancel ``response_id`` (raises on a Redis failure)."""
        await self.client.publish(self.channel, response_id)

    def start(self, on_cancel: Callable[[str], Awaitable[None]]) -> None:
        """Listen for cancels; ``on_cancel(id)`` runs for each (ids not running here are
        ignored by it)."""
        self._listener = asyncio.get_running_loop().create_task(self._listen(on_cancel))

    async def _listen(self, on_cancel: Callable[[str], Awaitable[None]]) -> None:
        while True:
            try:
                pubsub = self.subscriber.pubsub(ignore_subscribe_messages=True)
                await pubsub.subscribe(self.channel)
                try:
                    async for msg in pubsub.listen():
                        data = msg.get("data")
                        rid = data.decode() if isinstance(data, bytes) else str(data)
                        try:
                            await on_cancel(rid)
                        except Exception:
                            log.exception("cancel of response %s failed", rid)
                finally:
                    await pubsub.aclose()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # Redis down: try again later
                log.warning("responses cancel channel: %r; resubscribing", e)
                await asyncio.sleep(RECONNECT_S)

    async def stop(self) -> None:
        """Stop listening, finish pending marker writes, close the clients."""
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listener
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.client.aclose()
        await self.subscriber.aclose()
