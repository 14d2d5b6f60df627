"""A session's usage as a tree: the session, its subagents' sessions (children, recorded by the
usage store when a subagent's request names its parent) and theirs, each with its own totals
and its totals rolled up (its own plus every descendant's). ``/v1/usage`` answers with it.

Bounded: at most ``MAX_DEPTH`` levels below the session and ``MAX_CHILDREN`` children listed
per session (``gateway.telemetry.usage_store``); a cycle (a client naming a descendant as a
parent) is cut where a session comes back.
"""

from __future__ import annotations

from typing import Any

from gateway.telemetry.usage_store import UsageStore, UsageTotals

#: Levels of subagents read below a session (a subagent's subagent is level 2).
MAX_DEPTH = 4


async def session_tree(
    store: UsageStore, key_id: str | None, session_id: str, depth: int = MAX_DEPTH
) -> dict[str, Any] | None:
    """``session_id``'s totals rolled up over its subagents (the top-level fields), its
    ``own`` totals, and its ``children``, each the same shape; None when the store knows
    neither requests nor children of it (an unknown session). Raises
    ``UsageStoreUnavailable`` when the store cannot answer."""
    tree = await _node(store, key_id, session_id, depth, set())
    if tree is None:
        return None
    return tree[1]


async def _node(
    store: UsageStore, key_id: str | None, session_id: str, depth: int, seen: set[str]
) -> tuple[UsageTotals, dict[str, Any]] | None:
    seen.add(session_id)
    own = await store.get_session(key_id, session_id)
    kids: list[dict[str, Any]] = []
    total = own
    if depth > 0:
        for child in await store.children(key_id, session_id):
            if child in seen:
                continue
            got = await _node(store, key_id, child, depth - 1, seen)
            if got is None:
                continue
            total = total.merged(got[0])
            kids.append(got[1])
    if own.requests == 0 and not kids:
        return None
    node = {"session_id": session_id, **total.to_dict(), "own": own.to_dict(),
            "children": kids}
    node["ended"] = own.ended or None
    return total, node
