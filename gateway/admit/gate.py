"""Step 1 of a request, admit: API key → entitlements → rate limits.

``Gate`` is what the handler calls, in this order:

1. ``check_key(request, rec)`` before the body is read (a bad key costs no body read): 401;
   the key comes from ``Authorization: Bearer`` (OpenAI SDKs) or ``x-api-key`` (Anthropic's);
2. ``entitle(key, treq, request, rec)`` after tier resolution: 403, or the tiers the
   planner may use;
3. ``reserve(key, body, protocol, raw_size)`` after planning: 429 (or 503 fail-closed), else a
   ``Reservation`` and the ``x-ratelimit-*`` headers for the response;
4. ``release(reservation, rec)`` exactly once after accounting, on every exit path
   (disconnects included), with the request's actual usage.

With auth disabled every call is a no-op and ``key`` is None.
"""

from __future__ import annotations

import asyncio
import logging

from gateway.admit.audit import AuditLog, client_addr
from gateway.admit.auth import (
    ApiKey,
    AuthenticationError,
    KeyRing,
    PermissionDenied,
    check_request,
    fingerprint,
    presented_key,
)
from gateway.admit.ratelimit import (
    Limiter,
    MemoryLimiter,
    RateLimited,
    Reservation,
    release,
)
from gateway.admit.ratelimit_redis import RedisLimiter
from gateway.admit.request import ClientRequest
from gateway.asgi import Scope, header
from gateway.common.redis_conn import RedisConnection
from gateway.config import GatewayConfig
from gateway.plan.kv_fit import estimate_tokens_upto
from gateway.plan.tiers import TierRequest
from gateway.protocols.base import Protocol
from gateway.protocols.body import ParsedBody
from gateway.telemetry.record import RequestRecord

log = logging.getLogger("speedgate.admission")


class Gate:
    """Authentication, entitlements and rate limits of one gateway process. ``redis``: the
    gateway's shared Redis connection (client and breaker) for the limits; None with
    ``state.redis_url`` set builds a private one (closed by ``close``)."""

    def __init__(
        self,
        config: GatewayConfig,
        keyring: KeyRing | None = None,
        limiter: Limiter | None = None,
        audit: AuditLog | None = None,
        redis: RedisConnection | None = None,
    ) -> None:
        self.config = config
        self.keyring = keyring or KeyRing(config.auth)
        self.audit = audit or AuditLog()
        self._own_redis: RedisConnection | None = None
        self.limiter: Limiter = limiter or self._limiter(config, redis)
        self._releases: set[asyncio.Task[None]] = set()
        if not self.keyring.enabled and config.server.host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("auth is off and the gateway listens on %s: anyone who reaches it can "
                        "use every model and tier (set auth.keys or auth.keys_file)",
                        config.server.host)

    def _limiter(self, config: GatewayConfig, redis: RedisConnection | None) -> Limiter:
        rl = config.rate_limits
        if not config.state.redis_url:
            return MemoryLimiter()
        if redis is None:
            redis = self._own_redis = RedisConnection.from_config(config.state)
        assert redis is not None
        return RedisLimiter(
            redis.client,
            prefix=rl.redis_prefix,
            slot_ttl_s=rl.slot_ttl_s,
            fail_mode=rl.fail_mode,
            breaker=redis.breaker,
        )

    @property
    def enabled(self) -> bool:
        """Whether requests must carry a valid API key."""
        return self.keyring.enabled

    def authenticate(self, scope: Scope, rec: RequestRecord | None = None) -> ApiKey | None:
        """The caller's key from an ASGI ``scope`` (the app's own routes); see
        ``check_key``."""
        return self._key(header(scope, b"authorization"), header(scope, b"x-api-key"),
                         rec.request_id if rec else scope.get("speedgate.request_id"),
                         client_addr(scope), scope.get("path"), rec)

    def check_key(self, request: ClientRequest, rec: RequestRecord) -> ApiKey | None:
        """The key of ``request``'s credentials, read from its headers before its body (a
        bad key costs no body read): None with auth disabled; 401 ``AuthenticationError``
        otherwise. Sets ``rec.key_id``. Audits failures."""
        return self._key(request.authorization, request.api_key, rec.request_id,
                         request.client, request.path, rec)

    def _key(self, authorization: str | None, api_key: str | None, request_id: str | None,
             client: str | None, path: str | None, rec: RequestRecord | None) -> ApiKey | None:
        if not self.keyring.enabled:
            return None
        try:
            key = self.keyring.authenticate(authorization, api_key)
        except AuthenticationError as e:
            token = presented_key(authorization, api_key)
            self.audit.event(
                "auth_failed",
                code=e.code,
                request_id=request_id,
                key_fingerprint=fingerprint(token) if token else None,
                client=client,
                path=path,
            )
            raise
        if rec is not None:
            rec.key_id = key.id
        return key

    def entitle(
        self, key: ApiKey | None, treq: TierRequest, request: ClientRequest, rec: RequestRecord
    ) -> frozenset[str] | None:
        """Tiers of ``treq``'s model the key may be served on (None: no restriction); 403
        ``PermissionDenied`` (audited) when the model or an explicit tier is not the key's."""
        if key is None:
            return None
        try:
            return check_request(key, treq, frozenset(treq.model.tiers))
        except PermissionDenied as e:
            self.audit.event(
                "permission_denied",
                code=e.code,
                request_id=rec.request_id,
                key_id=key.id,
                model=treq.model_name,
                tier=treq.tier,
                tier_source=treq.source,
                client=request.client,
                path=request.path,
            )
            raise

    async def reserve(
        self,
        key: ApiKey | None,
        body: ParsedBody,
        protocol: Protocol,
        raw_size: int,
    ) -> tuple[Reservation | None, list[tuple[bytes, bytes]]]:
        """Reserve the key's limits for this request: ``(reservation, response headers)``.
        Tokens are estimated on the body's chat-shaped conversation, counted no further than
        ``tokens_per_min`` (a request above the bucket's size is refused whatever its exact
        count, which the message then gives as a lower bound); a protocol that generates
        nothing (token counting) reserves a request only.

        Raises ``RateLimited`` (429 + Retry-After + ``x-ratelimit-*``) or, fail-closed with
        Redis down, ``LimiterUnavailable`` (503)."""
        if key is None:
            return None, []
        limits = key.config.limits
        if not (limits.requests_per_min or limits.tokens_per_min or limits.concurrent):
            return None, []
        tokens = 0
        if limits.tokens_per_min and protocol.generates:
            # counted no further than the bucket holds: more is refused whatever the rest
            tokens = (await estimate_tokens_upto(
                body.conversation,
                protocol.count_kind,  # type: ignore[arg-type]
                raw_size,
                self.config.telemetry.usage_estimate_encoding,
                limits.tokens_per_min,
            )).tokens
        decision, reservation = await self.limiter.reserve(key.id, limits, tokens)
        if reservation is None:
            raise RateLimited(key.id, decision)
        return reservation, decision.headers()

    async def release(self, reservation: Reservation | None, rec: RequestRecord) -> None:
        """Release ``reservation`` with the request's actual tokens (prompt + completion; 0
        when no engine was reached). Survives cancellation of the calling task: the release
        runs as its own task and is awaited under ``shield``."""
        if reservation is None or reservation.released:
            return
        u = rec.usage if rec.served_tier else None
        actual = u.prompt + u.completion if u is not None else 0
        task = asyncio.get_running_loop().create_task(release(reservation, actual))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            pass  # the task finishes on its own
        except Exception:
            log.exception("rate-limit release failed for key %s", reservation.key_id)

    async def close(self) -> None:
        """Wait for pending releases and close the Redis client."""
        if self._releases:
            await asyncio.gather(*self._releases, return_exceptions=True)
        close = getattr(self.limiter, "close", None)
        if close is not None:
            await close()
        if self._own_redis is not None:
            await self._own_redis.close()

