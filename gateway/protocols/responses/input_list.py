"""``GET /v1/responses/{id}/input_items``: a stored response's input items as OpenAI's list.

Shape (OpenAI API reference, "Responses: list input items"): ``{"object": "list", "data":
[items], "first_id", "last_id", "has_more"}``; query ``limit`` (1..100, default 20), ``order``
(``asc`` | ``desc``, default ``desc``: newest first), ``after`` (an item id: the page starts
after it in that order), ``include`` (accepted; every stored field is returned already).

The items are the whole input the engine saw for that response: for a chained response
(``previous_response_id``) the earlier turns' inputs and outputs, oldest first, then its own
input. Each item is returned as stored, with ``type`` and ``id`` filled in where the client
left them out: ids are stable (``<kind>_<response hex><index>``, derived from the response that
first carried the item), so ``after`` pages reliably; a message's string ``content`` becomes
one ``input_text`` part (``output_text`` for the assistant), as OpenAI returns it. Pure.

The page cursor is an item's id (the SDKs' auto-pagers send the last item's ``id`` as
``after``), so ids are unique within one list: an id the client sent on two items (a chained
turn that re-sends an earlier item, say) names its first occurrence, and each later occurrence
is listed as ``<id>~<position>`` (its position, oldest first, from 0). Without that an ``after``
naming the second occurrence resumed after the first, and an auto-pager looped for ever.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import InvalidRequest

MAX_LIMIT = 100
DEFAULT_LIMIT = 20
_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
              "reasoning": "rs"}


def listed_item(item: Any, response_id: str, index: int) -> dict[str, Any]:
    """``item`` (input item ``index`` of ``response_id``) as a list entry: ``type`` and ``id``
    filled in, a message's string content as one text part."""
    if not isinstance(item, dict):
        item = {"type": "message", "role": "user", "content": str(item)}
    out = dict(item)
    kind = out.setdefault("type", "message")
    if not isinstance(out.get("id"), str):
        hex_id = response_id.removeprefix("resp_")
        out["id"] = f"{_ID_PREFIX.get(kind, 'item')}_{hex_id}{index:04d}"
    if kind == "message" and isinstance(out.get("content"), str):
        part = "output_text" if out.get("role") == "assistant" else "input_text"
        out["content"] = [{"type": part, "text": out["content"]}]
    return out


def unique_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items`` (oldest first) with each repeated ``id`` after its first occurrence made
    ``<id>~<position>`` (more ``~`` while that too is taken); the rest as they are."""
    taken = {i["id"] for i in items}
    seen: set[str] = set()
    out = []
    for pos, item in enumerate(items):
        if item["id"] in seen:
            new = f"{item['id']}~{pos}"
            while new in taken:
                new += "~"
            taken.add(new)
            item = {**item, "id": new}
        seen.add(item["id"])
        out.append(item)
    return out


def parse_limit(value: str | None) -> int:
    """The ``limit`` query value; ``InvalidRequest`` (400) unless an integer in 1..100."""
    if value is None:
        return DEFAULT_LIMIT
    try:
        n = int(value)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_LIMIT:
        raise InvalidRequest(f"limit: must be an integer from 1 to {MAX_LIMIT}", param="limit")
    return n


def list_page(
    items: list[dict[str, Any]], *, after: str | None, limit: int, order: str | None
) -> dict[str, Any]:
    """One page of ``items`` (oldest first, ``listed_item``-shaped; ids made unique by
    ``unique_ids``) in OpenAI's list shape (module docstring); ``InvalidRequest`` (400) for an
    unknown ``order`` or ``after`` id."""
    order = order or "desc"
    if order not in ("asc", "desc"):
        raise InvalidRequest("order: must be 'asc' or 'desc'", param="order")
    items = unique_ids(items)
    ordered = items if order == "asc" else items[::-1]
    start = 0
    if after is not None:
        ids = [i["id"] for i in ordered]
        if after not in ids:
            raise InvalidRequest(f"after: no input item with id '{after}'", param="after")
        start = ids.index(after) + 1
    page = ordered[start:start + limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": start + limit < len(ordered),
    }
