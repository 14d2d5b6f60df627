"""The one decision path of a request, for both edges: ``admit_and_plan``.

The ASGI proxy (``gateway.handler``) and the ext_proc picker (``gateway.picker``) each read
their transport into a ``ClientRequest``, check its key on the headers (``Gate.check_key``:
401 before a body byte is kept), read its body, then call ``admit_and_plan``, which runs the
rest in this order, each step able to refuse in the client API's terms:

1. the body parsed and checked (``gateway.admit.parse``: JSON shape and depth, sampling
   parameters, body schema; 400) and its ``prompt_cache_key`` taken as the session when no
   header named one;
2. the tier asked for (header, alias, ``service_tier``) resolved (404 for an unknown model)
   and entitled to the key (403);
3. the protocol's preparation (e.g. ``previous_response_id`` expanded: 404) and the derived
   session when none was named (``gateway.admit.session``);
4. the key's rate limits (429 or 503 fail-closed) and admission (priority band, session
   budget: 400/403/429) into the edge's ``Lent`` handle;
5. the routing keys (sessions scoped to the API key), the auto tier's choice with live
   estimates, the plan (tier and fallback chain) and KV fit (``gateway.admit.kv_fit``: only
   replicas whose context and KV pool hold the request; 400 when it fits none, or, when only
   its output cap does not fit, sent without it and said so in ``x-speedgate-output-cap``).

What the edge still does itself: the queue wait on the plan's first pool (``Lent.wait``: the
proxy waits inside its disconnect watch with its keep-alive armed, the picker at once) and
its own carrying of the request (the proxy's attempts; the picker's endpoint list).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gateway.admit.parse import read_checked
from gateway.admit.session import body_session, derived_session
from gateway.plan.auto.service import choose_auto
from gateway.plan.chain import plan_request
from gateway.plan.kv_fit import fit_replicas, lowered_note
from gateway.routing import RouteRequest
from gateway.routing.keys import affinity_id

if TYPE_CHECKING:
    from gateway.admit.admission import AdmissionControl
    from gateway.admit.auth import ApiKey
    from gateway.admit.gate import Gate
    from gateway.admit.lent import Lent
    from gateway.admit.request import ClientRequest
    from gateway.config import GatewayConfig
    from gateway.fleet.pools import PoolRegistry
    from gateway.plan.auto.service import AutoTier
    from gateway.plan.chain import Plan
    from gateway.plan.tiers import ModelIndex
    from gateway.protocols.base import Protocol as ApiProtocol
    from gateway.protocols.body import ParsedBody
    from gateway.telemetry.record import RequestRecord


class AdmitDeps(Protocol):
    """What the path reads of a process's runtime (the proxy's ``GatewayState``, the
    picker's ``PickerRuntime``)."""

    @property
    def config(self) -> GatewayConfig: ...
    @property
    def models(self) -> ModelIndex: ...
    @property
    def pools(self) -> PoolRegistry: ...
    @property
    def admission(self) -> AdmissionControl: ...
    @property
    def auto(self) -> AutoTier: ...


@dataclass(slots=True, eq=False)
class Admitted:
    """An admitted, planned request: its checked ``body``, its ``plan`` (``plan.route``: the
    routing keys and, where limits are known, its token count) and ``lent``, the handle to
    give back."""

    body: ParsedBody
    plan: Plan
    lent: Lent


async def admit_and_plan(
    deps: AdmitDeps, gate: Gate | None, protocol: ApiProtocol, request: ClientRequest,
    key: ApiKey | None, rec: RequestRecord, lent: Lent,
) -> Admitted:
    """Admit and plan ``request`` (with its body) under ``key`` (``Gate.check_key``'s), in
    the module docstring's order, recording into ``rec`` (session, band, model, tier, auto
    choice) and lending into ``lent``, which the caller created and releases: on a refusal it
    holds what was taken before it. Raises ``GatewayError`` in ``protocol``'s terms."""
    body = await read_checked(protocol, request.body, deps.config.server.max_json_depth,
                              rec.note_asked)
    if rec.session_id is None:
        rec.session_id, rec.session_src = body_session(body.doc)
    treq = deps.models.resolve(body.doc["model"], request.tier, protocol.service_tier(body.doc),
                               default_only=protocol.default_tier_only)
    allowed = gate.entitle(key, treq, request, rec) if gate is not None else None
    await protocol.prepare(body, rec.key_id)  # e.g. previous_response_id expanded
    if rec.session_id is None:  # none named: the Responses chain, else the conversation
        rec.session_id, rec.session_src = derived_session(
            body.chain_root, body.conversation, rec.key_id)
    if gate is not None:  # before any routing work: a refused request costs ~0
        lent.reservation, limit_headers = await gate.reserve(key, body, protocol, request.size)
        lent.headers.extend(limit_headers)
    lent.ticket = ticket = await deps.admission.enter(key, treq, allowed, request, body, rec)
    lent.headers.extend(ticket.headers())
    route = RouteRequest.from_doc(
        body.conversation, affinity_id(rec.session_id, rec.session_src, body.session_hint),
        scope=rec.key_id,
    )
    # auto weighs each pool's live estimate for this request; past its soft budget share
    # the session takes the cheaper tier
    choice = await choose_auto(deps.auto, treq, route, body.conversation, allowed,
                               ticket.over_soft_budget)
    plan = plan_request(treq, deps.pools, allowed, choice)
    plan.route, rec.auto_choice = route, plan.auto
    # only replicas whose context and KV pool hold it; fits none: refused now
    await fit_replicas(plan, route, body, request.size, protocol,
                       deps.config.telemetry.usage_estimate_encoding)
    if (lowered := lowered_note(route)) is not None:  # sent without its output cap
        rec.output_cap = lowered
        lent.headers.append((b"x-speedgate-output-cap", lowered.replace(" ", "; ").encode()))
    plan.engine_priority = ticket.engine_priority
    rec.model, rec.asked_tier, rec.stream = treq.model_name, treq.tier, body.stream
    return Admitted(body, plan, lent)
