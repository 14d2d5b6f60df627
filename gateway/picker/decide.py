"""One request's decision in picker mode, and what its answer teaches the ledgers.

``Picker.admit_head`` checks the request's headers as soon as Envoy sends them (the client API
its path names: 404; its key: 401), before a body byte is kept. ``Picker.pick`` then runs the
proxy's own decision path on the whole request (``gateway.admit.path.admit_and_plan``: body
checks, tier and entitlement, rate limits, priority band and session budget, the plan with
``auto``'s live estimates, KV fit), the queue of a saturated pool, then the pool's router
(prefix and session affinity under the bounded-load rule) for the first replica among those
the request fits. The answer is an ordered list of
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
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from gateway.admit.auth import ApiKey
from gateway.admit.flow.flow_control import BYTES_PER_TOKEN
from gateway.admit.flow.refusal import QueueRefused
from gateway.admit.lent import Lent
from gateway.admit.path import Admitted, admit_and_plan
from gateway.admit.request import ClientRequest
from gateway.common.usage import Usage
from gateway.errors import GatewayError, NoHealthyReplica
from gateway.fleet.pools import Pool, Replica
from gateway.picker.runtime import PickerRuntime
from gateway.plan.chain import Plan
from gateway.protocols.base import Protocol
from gateway.protocols.body import ParsedBody
from gateway.routing import pick_least_inflight, pick_replica
from gateway.routing.fit import fitting
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
    ``lent``: what admission lent it, the in-flight count on the replica that holds it (the
    first pick, then the one that served) included, given back by ``Picker.finish``;
    ``status``: the upstream's HTTP status once its headers came back (0: unparseable)."""

    rec: RequestRecord
    protocol: Protocol
    body: ParsedBody
    plan: Plan
    endpoints: list[Replica]
    payload: bytes
    lent: Lent
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

    def admit_head(self, request: ClientRequest) -> tuple[RequestRecord, ApiKey | None]:
        """Check ``request``'s headers before its body is read: the record of a path the
        picker serves (404 ``unknown_url`` otherwise) and the caller's key (401, audited).
        Raises ``GatewayError`` in the client API's terms."""
        protocol = self.protocol_of(request.path)
        rec = RequestRecord(request_id=request.request_id, path=request.path,
                            operation=protocol.operation)
        request.name(rec)  # its session (a subagent's under its parent), its end
        return rec, self.runtime.gate.check_key(request, rec)

    def protocol_of(self, path: str) -> Protocol:
        """The client API of ``path``; 404 ``GatewayError`` for a path not served here."""
        protocol = self.protocols.get(path)
        if protocol is None:
            raise GatewayError(f"picker mode does not serve {path!r}", status=404,
                               type="invalid_request_error", code="unknown_url")
        return protocol

    async def pick(
        self, request: ClientRequest, key: ApiKey | None, rec: RequestRecord,
        subset: list[str] | None,
    ) -> Pick:
        """Decide where ``request`` (with its decoded body; ``key`` and ``rec`` from
        ``admit_head``) goes; ``subset``: the data plane's allowed ``ip:port`` list (None:
        any). Raises ``GatewayError`` in the client API's terms: 400/404/403/429 from
        ``admit_and_plan``, 429 (with ``Retry-After``) when a saturated pool's queue sheds,
        503 ``NoHealthyReplica`` when no endpoint (of the subset) is usable; what admission
        lent is given back before it raises, else by ``finish``."""
        rt = self.runtime
        protocol = self.protocol_of(request.path)
        lent = Lent(rt.gate, rt.admission)
        try:
            admitted = await admit_and_plan(rt, rt.gate, protocol, request, key, rec, lent)
            admitted.body.assemble = False  # Envoy carries the engine's answer: JSON stays JSON
            try:
                await lent.wait(admitted.plan, None, rec)
            except QueueRefused as e:  # shed: 429, the data plane's "dropped under load"
                raise GatewayError(e.message, status=429, type="rate_limit_error",
                                   code=e.code, retry_after_s=e.retry_after_s) from None
            return await self._choose(admitted, protocol, rec, subset)
        except BaseException:  # refused: the slot, the budget and the reservation back
            await lent.release(rec)
            raise

    async def _choose(
        self, admitted: Admitted, protocol: Protocol, rec: RequestRecord,
        subset: list[str] | None,
    ) -> Pick:
        """The ordered endpoints of ``admitted.plan`` (module docstring), the first by the
        router, each a replica the request fits (``plan.route.tokens``, when counted)."""
        plan, body = admitted.plan, admitted.body
        tokens = plan.route.tokens if plan.route is not None else 0
        now = time.monotonic()
        allowed = set(subset) if subset is not None else None
        first_pool = None
        ordered: list[Replica] = []
        reasons: list[str] = [plan.reason] if plan.reason == "tier-unavailable" else []
        for pool in plan.chain:
            if first_pool is not None and (pool.config.served_model_name
                                           != first_pool.config.served_model_name):
                continue  # one body for the whole list: only pools of the same engine model
            usable = fitting([r for r in pool.usable(now)
                              if allowed is None or endpoint_of(r) in allowed], tokens)
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
        pick = Pick(rec, protocol, body, plan, ordered, payload, admitted.lent)
        pick.lent.hold(ordered[0], first_pool)
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
        if rec.output_cap:  # sent without its output cap (plan.kv_fit)
            out.append(("x-speedgate-output-cap", rec.output_cap.replace(" ", "; ")))
        if pick.lent.ticket is not None:
            out += [(k.decode(), v.decode()) for k, v in pick.lent.ticket.headers()]
        return out

    async def served(self, pick: Pick, endpoint: str | None, status: int) -> list[tuple[str, str]]:
        """The upstream answered ``status`` from ``endpoint`` (``ip:port``; None: unknown,
        taken as the first pick; ``status`` 0: unparseable, counted neither way). Moves the
        in-flight slot and the session's binding to the replica that served, feeds outlier
        ejection; returns the headers to add to the
        client's response (tier, replica name, request id)."""
        pick.status = status
        served = self._replica_at(endpoint) if endpoint else None
        served = served or pick.endpoints[0]
        pick.served = served
        pool = self._pool_of(served)
        now = time.monotonic()
        if pool is not None:
            if served is not pick.lent.replica and pick.lent.replica is not None:
                # Envoy retried: the earlier endpoints of the list failed before this one
                failed = pick.endpoints[:pick.endpoints.index(served)] if (
                    served in pick.endpoints) else []
                for r in failed:
                    rp = self._pool_of(r)
                    if rp is not None:
                        rp.record_failure(r, now)
                pick.lent.hold(served, pool)
                await pick_replica(pool, pick.plan.route, [served])  # the binding follows
            if status >= 500:
                pool.record_failure(served, now)
            elif status:
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
        await pick.lent.release(rec)
