"""Consistent-hash order of a pool's replicas for a session: rendezvous (highest random weight)
hashing (Thaler and Ravishankar 1998). Every gateway replica computes the same order from the
session key and the replica names alone, so with Redis down they still agree; a replica that
leaves moves only its own sessions, each to the next replica in its order. Pure.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from gateway.fleet.pools import Replica


def _weight(key: str, name: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}\x00{name}".encode(), digest_size=8).digest())


def hash_order(key: str, replicas: Sequence[Replica]) -> list[Replica]:
    """``replicas`` in ``key``'s rendezvous order (first = its home replica)."""
    return sorted(replicas, key=lambda r: _weight(key, r.name), reverse=True)
