"""What admission lent one request, as one handle given back once: ``Lent``.

A request admitted (``gateway.admit.path.admit_and_plan``) holds up to four things that other
requests wait for: the key's rate-limit reservation (its ``concurrent`` lease and reserved
tokens, ``Gate.reserve``), its admission ``Ticket`` (priority band, session budget hold and,
once ``wait`` returned, a slot on a saturated pool's queue), and, in picker mode, the in-flight
count of the replica it was sent to (``hold``; the proxy's attempts count their own). The edge
that admitted the request creates the handle before admission starts, so that whatever was
taken before a refusal is on it too, and calls ``release`` exactly when the request is over,
on every exit path; ``release`` is idempotent, so a second call gives nothing back twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.admit.admission import AdmissionControl, Ticket
    from gateway.admit.gate import Gate
    from gateway.admit.ratelimit import Reservation
    from gateway.fleet.pools import Pool, Replica
    from gateway.plan.chain import Plan
    from gateway.telemetry.record import RequestRecord


@dataclass(slots=True, eq=False)
class Lent:
    """The handle (module docstring). ``gate``: the key's limits (None: an open gateway);
    ``admission``: bands, queues, budgets. Filled as admission goes: ``reservation``,
    ``ticket``, ``replica`` (with its ``pool``) and ``headers`` (the ``x-ratelimit-*`` and
    admission headers every answer carries, lower-case byte pairs, in order)."""

    gate: Gate | None
    admission: AdmissionControl
    reservation: Reservation | None = None
    ticket: Ticket | None = None
    replica: Replica | None = None
    pool: Pool | None = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    released: bool = False

    async def wait(self, plan: Plan, timeout_s: float | None, rec: RequestRecord) -> float | None:
        """A slot on ``plan``'s first pool (``AdmissionControl.wait``): the timeout left, or
        ``QueueRefused``. Needs the ticket (``admit_and_plan`` succeeded)."""
        assert self.ticket is not None, "wait before admission"
        return await self.admission.wait(self.ticket, plan, timeout_s, rec)

    def hold(self, replica: Replica, pool: Pool | None) -> None:
        """Count this request in flight on ``replica`` (of ``pool``), giving back the one it
        held before (the data plane retried elsewhere)."""
        self._drop_replica()
        replica.inflight += 1
        self.replica, self.pool = replica, pool

    def _drop_replica(self) -> None:
        replica, pool = self.replica, self.pool
        self.replica = self.pool = None
        if replica is None:
            return
        if pool is not None:
            pool.release(replica)
        else:
            replica.inflight -= 1

    async def release(self, rec: RequestRecord) -> None:
        """Give everything back once (idempotent): the replica's in-flight count, the
        rate-limit reservation with the request's actual usage (``rec``), then the pool slot
        and the session budget's hold settled at ``rec.cost_usd``; each even when the one
        before raised."""
        if self.released:
            return
        self.released = True
        try:
            self._drop_replica()
        finally:
            try:
                if self.reservation is not None and self.gate is not None:
                    await self.gate.release(self.reservation, rec)
            finally:
                await self.admission.leave(self.ticket, rec)
