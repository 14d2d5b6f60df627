"""The Responses API state the gateway owns (so engines stay stateless): stored responses for
``previous_response_id`` and ``GET``/``DELETE /v1/responses/{id}``, and the responses running
on this process for ``POST /v1/responses/{id}/cancel``.

- **Expanding** ``previous_response_id``: the earlier turns' input and output items, oldest
  first, then the new input (OpenAI API reference, "Conversation state": the previous
  response's ``instructions`` are not carried over). Records are scoped to the API key that
  made them: another key gets 404, as for a missing or expired id.
- **Storing** (``store`` true, the API's default): after a response completes, its turn's
  input items, output items and response object (``ResponseStore``).
- **Affinity**: the conversation's first response id is the request's session key when the
  client sent no ``x-session-id``, so every turn of a chain routes to the replica that holds
  its KV prefix, on any gateway replica (bindings are in Redis).
- **Cancel**: aborts a response in flight here (its task is cancelled, the upstream
  connection closes, the engine stops) after telling its replica (vLLM's own cancel, best
  effort); the client of that request gets 409 ``response_cancelled`` (or an in-band ``error``
  event if it streams). With Redis, a cancel reaching another gateway process is passed to the
  one running the response (``responses.cancel.CancelBus``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import GatewayError, InvalidRequest
from gateway.protocols.base import Running
from gateway.protocols.body import ParsedBody
from gateway.protocols.responses.cancel import CancelBus
from gateway.protocols.responses.ids import is_response_id
from gateway.protocols.responses.input_list import listed_item
from gateway.protocols.responses.items import chat_view
from gateway.protocols.responses.store import ResponseStore, StoreUnavailable
from gateway.telemetry.record import RequestRecord

log = logging.getLogger("speedgate.responses")


def _shown(response_id: str) -> str:
    """An id as an error message quotes it: at most 64 characters (ids are client input)."""
    return response_id if len(response_id) <= 64 else response_id[:61] + "..."


class ResponseNotFound(GatewayError):
    """404: no stored response of this id for this API key (missing, expired, deleted)."""

    status = 404
    type = "invalid_request_error"
    code = "response_not_found"


class ResponseCancelled(GatewayError):
    """409: the response was cancelled (``POST /v1/responses/{id}/cancel``) while running."""

    status = 409
    type = "invalid_request_error"
    code = "response_cancelled"


class StateUnavailable(GatewayError):
    """503: the response store (Redis) does not answer."""

    status = 503
    type = "server_error"
    code = "state_unavailable"


@dataclass(slots=True)
class Turn:
    """One Responses request's own state (``ParsedBody.ext``)."""

    response_id: str
    previous_id: str | None
    store: bool
    items: list[Any]  # this turn's input items
    chain: list[str] = field(default_factory=list)  # earlier responses, oldest first
    root: str = ""  # the conversation's first response id
    full_input: list[Any] | None = None  # earlier turns + this input, when expanded
    upstream_id: str | None = None  # the engine's own id, when it ignored ``request_id``


class Flight(Running):
    """A response running on this gateway process (for ``cancel`` and ``GET``)."""

    __slots__ = ("cancelled", "created_at", "key", "model", "response_id", "task", "turn")

    def __init__(self, response_id: str, key: str, model: str, turn: Turn | None = None) -> None:
        super().__init__()
        self.response_id, self.key, self.model = response_id, key, model
        self.turn = turn  # its ``upstream_id`` names the response to the engine
        self.created_at = int(time.time())
        self.task = asyncio.current_task()
        self.cancelled = False

    def cancel(self) -> None:
        """Stop the request: its task is cancelled, which closes the upstream connection."""
        if not self.cancelled and self.task is not None:
            self.cancelled = True
            self.task.cancel()

    def object(self, status: str) -> dict[str, Any]:
        """A minimal response object for this response in ``status``."""
        return {"id": self.response_id, "object": "response", "created_at": self.created_at,
                "model": self.model, "status": status, "output": [], "usage": None}


class ResponsesState:
    """Stored responses (``store``) and the responses in flight on this process.
    ``attach(upstream, bus, marker_ttl_s)`` in the app's lifespan: the upstream client tells a
    replica about a cancel; the optional ``CancelBus`` passes cancels between gateway
    processes, its markers expiring after ``marker_ttl_s`` (the longest request deadline)."""

    def __init__(self, store: ResponseStore) -> None:
        self.store = store
        self.flights: dict[str, Flight] = {}
        self.upstream: Any = None
        self.bus: CancelBus | None = None
        self.marker_ttl_s = 3600.0

    def attach(self, upstream: Any, bus: CancelBus | None, marker_ttl_s: float) -> None:
        """Wire the upstream client and the cancel bus (which starts listening)."""
        self.upstream, self.bus, self.marker_ttl_s = upstream, bus, marker_ttl_s
        if bus is not None:
            bus.start(self._cancel_here)

    async def _cancel_here(self, response_id: str) -> None:
        flight = self.flights.get(response_id)
        if flight is not None:
            await self._abort(flight)

    async def expand(self, body: ParsedBody, key_id: str | None) -> None:
        """Expand ``previous_response_id`` into the full input (``turn.full_input``,
        ``body.view``, ``body.session_hint``, ``body.chain_root``; a first turn that will be
        stored starts a chain: ``chain_root`` its own id): 404 ``ResponseNotFound`` when it is
        not this key's or has expired, 503 ``StateUnavailable`` when the store does not answer."""
        turn: Turn = body.ext
        if turn.previous_id is None:
            turn.root = turn.response_id
            body.chain_root = turn.response_id if turn.store else None
            return
        if not is_response_id(turn.previous_id):  # names nothing: no lookup
            raise ResponseNotFound(
                f"Previous response with id '{_shown(turn.previous_id)}' not found.",
                param="previous_response_id",
            )
        try:
            prev = await self.store.get(turn.previous_id)
            if prev is None or prev.get("key") != (key_id or ""):
                raise ResponseNotFound(
                    f"Previous response with id '{turn.previous_id}' not found.",
                    param="previous_response_id",
                )
            earlier = await self.store.get_many(list(prev.get("chain") or ()))
        except StoreUnavailable as e:
            raise StateUnavailable(str(e), retry_after_s=1) from None
        if any(r is None for r in earlier):
            raise ResponseNotFound(
                f"Previous response with id '{turn.previous_id}' continues a conversation "
                "whose earlier responses expired.",
                param="previous_response_id",
            )
        full: list[Any] = []
        for r in [*earlier, prev]:
            assert r is not None
            full += r.get("items") or []
            full += r.get("output") or []
        full += turn.items
        turn.full_input, turn.chain = full, [*prev.get("chain", ()), turn.previous_id]
        turn.root = prev.get("root") or turn.previous_id
        body.session_hint, body.chain_root = "resp:" + turn.root, turn.root
        body.view = chat_view(body.doc, full)

    @contextlib.asynccontextmanager
    async def running(self, body: ParsedBody, rec: RequestRecord) -> AsyncIterator[Running]:
        """Registers the response as in flight; a ``cancel`` of it ends the context with
        ``ResponseCancelled`` instead of the task's cancellation."""
        turn: Turn = body.ext
        flight = Flight(turn.response_id, rec.key_id or "", body.doc["model"], turn)
        self.flights[turn.response_id] = flight
        if self.bus is not None:
            self.bus.started(turn.response_id, flight.key, self.marker_ttl_s)
        try:
            yield flight
        except asyncio.CancelledError:
            task = flight.task
            if flight.cancelled and task is not None and task.uncancel() == 0:
                rec.outcome = "cancelled"
                raise ResponseCancelled(
                    f"Response '{turn.response_id}' was cancelled.", param="response_id"
                ) from None
            raise
        finally:
            self.flights.pop(turn.response_id, None)
            if self.bus is not None:
                self.bus.ended(turn.response_id)

    async def save(self, body: ParsedBody, key_id: str | None, final: dict[str, Any]) -> None:
        """Store a completed response (``store`` true); a store failure is logged (the client
        already has its answer)."""
        turn: Turn = body.ext
        if not turn.store or not isinstance(final.get("id"), str):
            return
        record = {
            "id": final["id"], "key": key_id or "", "created_at": final.get("created_at"),
            "model": body.doc["model"], "status": final.get("status"), "response": final,
            "items": turn.items, "output": final.get("output") or [],
            "chain": turn.chain, "root": turn.root or final["id"],
        }
        try:
            await self.store.put(record)
        except StoreUnavailable as e:
            log.warning("response %s not stored: %s", final["id"], e)
        except Exception:  # never fail a request that was already answered
            log.exception("response %s not stored", final["id"])

    async def _record(self, response_id: str, key_id: str | None) -> dict[str, Any]:
        if not is_response_id(response_id):  # names nothing: no lookup
            raise ResponseNotFound(
                f"Response with id '{_shown(response_id)}' not found.", param="response_id"
            )
        try:
            rec = await self.store.get(response_id)
        except StoreUnavailable as e:
            raise StateUnavailable(str(e), retry_after_s=1) from None
        if rec is None or rec.get("key") != (key_id or ""):
            raise ResponseNotFound(
                f"Response with id '{response_id}' not found.", param="response_id"
            )
        return rec

    async def retrieve(self, response_id: str, key_id: str | None) -> dict[str, Any]:
        """``GET /v1/responses/{id}``: the stored response object (``in_progress`` while it
        runs on this process); ``ResponseNotFound`` (404) otherwise."""
        flight = self.flights.get(response_id) if is_response_id(response_id) else None
        if flight is not None and flight.key == (key_id or ""):
            return flight.object("in_progress")
        response: dict[str, Any] = (await self._record(response_id, key_id))["response"]
        return response

    async def input_items(self, response_id: str, key_id: str | None) -> list[dict[str, Any]]:
        """``GET /v1/responses/{id}/input_items``: every input item the engine saw for a stored
        response, oldest first (earlier turns' inputs and outputs, then its own input), shaped
        by ``responses.input_list.listed_item``; 404 ``ResponseNotFound``, 503
        ``StateUnavailable``."""
        rec = await self._record(response_id, key_id)
        try:
            earlier = await self.store.get_many(list(rec.get("chain") or ()))
        except StoreUnavailable as e:
            raise StateUnavailable(str(e), retry_after_s=1) from None
        out: list[dict[str, Any]] = []
        for r in earlier:
            if r is None:  # an expired turn of the chain: what is left is still listed
                continue
            items = [*(r.get("items") or ()), *(r.get("output") or ())]
            out += [listed_item(item, r["id"], i) for i, item in enumerate(items)]
        out += [listed_item(item, response_id, i) for i, item in enumerate(rec.get("items") or ())]
        return out

    async def delete(self, response_id: str, key_id: str | None) -> dict[str, Any]:
        """``DELETE /v1/responses/{id}``: ``{"id", "object": "response.deleted", "deleted"}``."""
        await self._record(response_id, key_id)
        try:
            await self.store.delete(response_id)
        except StoreUnavailable as e:
            raise StateUnavailable(str(e), retry_after_s=1) from None
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    async def cancel(self, response_id: str, key_id: str | None) -> dict[str, Any]:
        """``POST /v1/responses/{id}/cancel``: a response running on this process is told to
        its replica (best effort) and aborted here; one running on another gateway process
        (Redis marker, same key) is passed to it; a finished one is 400, an unknown one 404."""
        key = key_id or ""
        if not is_response_id(response_id):
            await self._record(response_id, key_id)  # the 404 of an id that names nothing
        flight = self.flights.get(response_id)
        if flight is not None and flight.key == key:
            await self._abort(flight)
            return flight.object("cancelled")
        if self.bus is not None and await self.bus.owner(response_id) == key:
            try:
                await self.bus.publish(response_id)
            except Exception as e:
                raise StateUnavailable(f"cancel not delivered: {e!r}", retry_after_s=1) from None
            return {"id": response_id, "object": "response", "status": "cancelled",
                    "output": [], "usage": None}
        await self._record(response_id, key_id)
        raise InvalidRequest(
            f"Response '{response_id}' is not in progress; only a running response can be "
            "cancelled.",
            param="response_id",
        )

    async def _abort(self, flight: Flight) -> None:
        if flight.replica is not None and self.upstream is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2.0):
                    engine_id = (flight.turn.upstream_id if flight.turn is not None else None
                                 ) or flight.response_id
                    resp = await self.upstream.post(
                        f"{flight.replica}/v1/responses/{engine_id}/cancel", b"",
                        {"content-type": "application/json"}, 1.0,
                    )
                    resp.close()
        flight.cancel()
