"""One request's decision in picker mode, and what its answer teaches the ledgers.

``Picker.pick`` runs the gateway's own steps 1-2 (``gateway.handler``) on the request Envoy
holds: key and entitlements, rate limits, the body's protocol (model, stream, conversation),
tier (header, alias, ``service_tier``, ``auto`` with live estimates), priority band and
session budget, the queue of a saturated pool, then the pool's router (prefix and session
affinity under the bounded-load rule) for the first replica. The answer is an ordered list of
``ip:port``: the router's choice, the other usable replicas of its pool (fewest in flight
first), then those of the fallback chain's later pools that serve the same engine model name
(Envoy's retries walk the list before the first byte, as the proxy's failover does).

``Picker.served`` and ``Picker.finish`` feed the answer back: the replica that served (from
the response's metadata) holds the request's in-flight slot until the response ends, a 5xx
counts against it for outlier ejection (a 2xx-4xx as a success), the session's affinity
binding moves to it when Envoy had to retry elsewhere, and the usage read from a response
body streamed to the picker settles the session budget and the rate-limit reservation.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from gateway.admit.admission import Ticket
from gateway.admit.flow.flow_control import BYTES_PER_TOKEN
from gateway.admit.flow.refusal import QueueRefused
from gateway.admit.ratelimit import Reservation
from gateway.admit.session import derived_session
from gateway.common.ids import bounded_id
from gateway.common.usage import Usage
from gateway.errors import GatewayError, NoHealthyReplica
from gateway.fleet.pools import Pool, Replica
from gateway.picker.runtime import PickerRuntime
from gateway.plan.auto.service import choose_auto
from gateway.plan.chain import Plan, plan_request
from gateway.protocols.base import Protocol
from gateway.protocols.body import ParsedBody
from gateway.routing import RouteRequest, pick_least_inflight, pick_replica
from gateway.routing.keys import affinity_id
from gateway.telemetry.cost import cost_usd
from gateway.telemetry.record import RequestRecord


def endpoint_of(replica: Replica) -> str:
    """``ip:port`` of a replica's base URL (the form of the protocol's header; port 80/443
    by scheme when the URL has none)."""
    u = urlsplit(replica.url)
    port = u.port or (443 if u.scheme == "https" else 80)
    host = u.hostname or ""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(slots=True, eq=False)
class Pick:
    """A decided request. ``endpoints``: the ordered replicas whose ``ip:port`` list goes to
    Envoy; ``payload``: the body sent upstream (``model`` rewritten to the engine's name);
    ``held``: the replica whose in-flight count this request holds (the first pick, then the
    one that served); ``status``: the upstream's HTTP status once its headers came back."""

    rec: RequestRecord
    protocol: Protocol
    body: ParsedBody
    plan: Plan
    endpoints: list[Replica]
    payload: bytes
    ticket: Ticket | None = None
    reservation: Reservation | None = None
    held: Replica | None = None
    served: Replica | None = None
    status: int = 0
    finished: bool = False
    headers: list[tuple[str, str]] = field(default_factory=list)

    @property
    def destination(self) -> str:
        """The header / metadata value: ``ip:port,ip:port,...`` in order."""
        return ",".join(endpoint_of(r) for r in self.endpoints)


class Picker:
    """Decisions of one picker process over ``runtime``; ``protocols`` by client path.

    ``max_endpoints``: the length of the ordered list (1: the router's choice alone, what an
    ``ORIGINAL_DST`` cluster takes; more for a data plane whose retries walk the list, such
    as Envoy's ``override_host`` load-balancing policy)."""

    def __init__(
        self, runtime: PickerRuntime, protocols: dict[str, Protocol], max_endpoints: int = 1
    ) -> None:
        if max_endpoints < 1:
            raise ValueError("max_endpoints must be at least 1")
        self.runtime = runtime
        self.protocols = protocols
        self.max_endpoints = max_endpoints

    def _pool_of(self, replica: Replica) -> Pool | None:
        model, tier = replica.pool_key.rsplit("/", 1)
        return self.runtime.pools.get(model, tier)

    def _replica_at(self, endpoint: str) -> Replica | None:
        for r in self.runtime.pools.replicas():
            if endpoint_of(r) == endpoint:
                return r
        return None

    async def pick(
        self, headers: dict[str, str], raw: bytes, subset: list[str] | None
    ) -> Pick:
        """Decide where the request with ``headers`` (lower-case names, pseudo-headers
        included) and body ``raw`` goes; ``subset``: the data plane's allowed ``ip:port`` list
        (None: any). Raises ``GatewayError`` in the client API's terms: 404 for a path the
        picker does not serve, 400/413 for a bad body, 401/403/429 from the key, 429 (with
        ``Retry-After``) when admission sheds, 503 ``NoHealthyReplica`` when no endpoint (of
        the subset) is usable."""
        rt = self.runtime
        path = headers.get(":path", "").split("?", 1)[0].rstrip("/")
        protocol = self.protocols.get(path)
        rid = headers.get("x-request-id") or uuid.uuid4().hex
        rec = RequestRecord(request_id=rid, path=path)
        if protocol is None:
            raise GatewayError(f"picker mode does not serve {path!r}", status=404,
                               type="invalid_request_error", code="unknown_url")
        rec.operation = protocol.operation
        sid = headers.get("x-session-id")
        rec.session_id = bounded_id(sid) if sid is not None else None
        scope = {"type": "http", "path": path, "client": None,
                 "headers": [(k.encode("latin-1"), v.encode("latin-1"))
                             for k, v in headers.items() if not k.startswith(":")]}
        limit = rt.config.server.max_body_bytes
        if len(raw) > limit:
            raise GatewayError(f"request body larger than {limit} bytes", status=413,
                               type="invalid_request_error", code="request_too_large")
        key = rt.gate.authenticate(scope, rec)
        body = protocol.parse(raw)
        body.assemble = False  # Envoy carries the engine's own answer: JSON stays JSON
        treq = rt.models.resolve(body.doc["model"], headers.get("x-speedgate-tier"),
                                 protocol.service_tier(body.doc),
                                 default_only=protocol.default_tier_only)
        allowed = rt.gate.entitle(key, treq, scope, rec)
        reservation, _ = await rt.gate.reserve(key, body, protocol, len(raw))
        pick: Pick | None = None
        ticket: Ticket | None = None
        try:
            if rec.session_id is None:  # none named: the conversation (gateway.admit.session)
                rec.session_id, rec.session_src = derived_session(
                    body.chain_root, body.conversation, rec.key_id)
            ticket = await rt.admission.enter(key, treq, allowed, scope, body, len(raw), rec)
            route = RouteRequest.from_doc(
                body.conversation, affinity_id(rec.session_id, rec.session_src, body.session_hint),
                scope=rec.key_id)
            choice = await choose_auto(rt.auto, treq, route, body.conversation, allowed,
                                       ticket.over_soft_budget)
            plan = plan_request(treq, rt.pools, allowed, choice)
            plan.route, plan.engine_priority = route, ticket.engine_priority
            rec.model, rec.asked_tier, rec.stream = treq.model_name, treq.tier, body.stream
            try:
                await rt.admission.wait(ticket, plan, None, rec)
            except QueueRefused as e:  # shed: 429, the data plane's "dropped under load"
                raise GatewayError(e.message, status=429, type="rate_limit_error",
                                   code=e.code, retry_after_s=e.retry_after_s) from None
            pick = await self._choose(plan, body, protocol, rec, subset)
            pick.ticket, pick.reservation = ticket, reservation
            return pick
        finally:
            if pick is None:  # refused: give the slot, the budget and the reservation back
                await rt.admission.leave(ticket, rec)
                await rt.gate.release(reservation, rec)

    async def _choose(
        self, plan: Plan, body: ParsedBody, protocol: Protocol, rec: RequestRecord,
        subset: list[str] | None,
    ) -> Pick:
        """The ordered endpoints of ``plan`` (module docstring), the first by the router."""
        now = time.monotonic()
        allowed = set(subset) if subset is not None else None
        first_pool = None
        ordered: list[Replica] = []
        reasons: list[str] = [plan.reason] if plan.reason == "tier-unavailable" else []
        for pool in plan.chain:
            if first_pool is not None and (pool.config.served_model_name
                                           != first_pool.config.served_model_name):
                continue  # one body for the whole list: only pools of the same engine model
            usable = [r for r in pool.usable(now)
                      if allowed is None or endpoint_of(r) in allowed]
            if not usable:
                reasons.append(f"{pool.tier}:no-usable-replica")
                continue
            if first_pool is None:
                first = await pick_replica(pool, plan.route, usable)
                assert first is not None
                first_pool = pool
                ordered.append(first)
                rec.served_tier = rec.tried_tier = pool.tier
                rec.replica = first.name
                if pool is not plan.chain[0] or plan.reason == "tier-unavailable":
                    rec.fallback = ",".join(reasons)
            rest = [r for r in usable if r not in ordered]
            for _ in range(max(0, pool.config.retry.max_attempts - 1)):
                if len(ordered) >= self.max_endpoints:
                    break
                nxt = pick_least_inflight(rest)
                if nxt is None:
                    break
                ordered.append(nxt)
                rest.remove(nxt)
        if first_pool is None:
            rec.fallback = ",".join(reasons) or None
            raise NoHealthyReplica(
                f"no healthy replica for model {plan.request.model_name!r}", retry_after_s=1
            )
        prio = plan.engine_priority if first_pool.config.scheduling_policy == "priority" else None
        payload = protocol.upstream_body(body, first_pool.config.served_model_name,
                                         priority=prio)
        pick = Pick(rec, protocol, body, plan, ordered, payload)
        pick.held = ordered[0]
        ordered[0].inflight += 1
        pick.headers = self._response_headers(pick)
        return pick

    @staticmethod
    def _response_headers(pick: Pick) -> list[tuple[str, str]]:
        rec = pick.rec
        out = [("x-request-id", rec.request_id)]
        if rec.served_tier:
            out.append(("x-speedgate-tier", rec.served_tier))
        if rec.fallback:
            out.append(("x-speedgate-fallback", rec.fallback))
        if pick.ticket is not None:
            out += [(k.decode(), v.decode()) for k, v in pick.ticket.headers()]
        return out

    async def served(self, pick: Pick, endpoint: str | None, status: int) -> list[tuple[str, str]]:
        """The upstream answered ``status`` from ``endpoint`` (``ip:port``; None: unknown,
        taken as the first pick). Moves the in-flight slot and the session's binding to the
        replica that served, feeds outlier ejection; returns the headers to add to the
        client's response (tier, replica name, request id)."""
        pick.status = status
        served = self._replica_at(endpoint) if endpoint else None
        served = served or pick.endpoints[0]
        pick.served = served
        pool = self._pool_of(served)
        now = time.monotonic()
        if pool is not None:
            if served is not pick.held and pick.held is not None:
                # Envoy retried: the earlier endpoints of the list failed before this one
                failed = pick.endpoints[:pick.endpoints.index(served)] if (
                    served in pick.endpoints) else []
                for r in failed:
                    rp = self._pool_of(r)
                    if rp is not None:
                        rp.record_failure(r, now)
                self._release(pick)
                served.inflight += 1
                pick.held = served
                await pick_replica(pool, pick.plan.route, [served])  # the binding follows
            if status >= 500:
                pool.record_failure(served, now)
            else:
                pool.record_success(served)
            pick.rec.served_tier = pool.tier
        pick.rec.replica, pick.rec.status = served.name, status
        headers = self._response_headers(pick)
        headers.append(("x-speedgate-replica", served.name))
        return headers

    def _estimate(self, pick: Pick) -> Usage:
        """Usage of a served request the picker saw no usage for (the response body not
        streamed to it): the body's bytes at ``BYTES_PER_TOKEN`` for the prompt and its output
        cap (``max_tokens``, ``max_completion_tokens``, else ``flow_control.
        default_output_tokens``) for the completion, the estimates admission reserved with:
        such a request is charged, not refunded."""
        doc = pick.body.doc
        cap = doc.get("max_completion_tokens") or doc.get("max_tokens")
        if not isinstance(cap, int) or isinstance(cap, bool) or cap <= 0:
            cap = self.runtime.config.flow_control.default_output_tokens
        return Usage(prompt=int(len(pick.body.raw) / BYTES_PER_TOKEN), completion=cap)

    def _release(self, pick: Pick) -> None:
        held, pick.held = pick.held, None
        if held is None:
            return
        pool = self._pool_of(held)
        if pool is not None:
            pool.release(held)
        else:
            held.inflight -= 1

    async def finish(self, pick: Pick, usage: Usage | None) -> None:
        """The request is over (response ended, or the stream closed): the in-flight slot,
        the admission slot, the session budget (at the cost of ``usage``, the engine's usage
        read from the response body, when the picker saw it) and the rate-limit reservation
        back. Idempotent."""
        if pick.finished:
            return  # (a 2xx answer whose usage the picker did not see is charged its estimate)
        pick.finished = True
        rec = pick.rec
        if usage is None and 200 <= pick.status < 300:
            usage, rec.usage_estimated = self._estimate(pick), True
        rec.usage = usage
        served = pick.served or pick.endpoints[0]
        pool = self._pool_of(served)
        if usage is not None and pool is not None:
            rec.cost_usd = cost_usd(usage, pool.config.prices, rec.flex)
        rec.outcome = "ok" if 200 <= pick.status < 300 else rec.outcome or "error"
        self._release(pick)
        try:
            await self.runtime.admission.leave(pick.ticket, rec)
        finally:
            await self.runtime.gate.release(pick.reservation, rec)
