"""Move or wait: where a session's turn goes when its warm replica has no KV room. Pure.

With capacity-aware placement on (a ``headroom`` weight), a turn whose tokens (prompt + output
cap) do not fit the free KV of the replica holding its conversation (``fit.has_room``) either

- **moves** to a replica with room, paying the prefill of what that replica has not cached:
  ``move_s = (prompt − cached_there) / prefill_tok_s``, ``cached_there`` the replica's known
  prefix depth (blocks × ``chunk_chars`` / 4: OpenAI's ~4 characters a token), the best
  roomy candidate's; or
- **waits** on the warm replica (the engine queues it, its prefix stays cached) until enough
  blocks free: this gateway's open attempts there finish after their remaining output,
  ``max(0, cap − decode_tok_s × elapsed) / decode_tok_s``; ``wait_s`` is the time at which the
  finished ones' KV tokens first cover the shortfall (``need − free``), infinite when all of
  them together do not (other gateways' requests, or a request larger than the pool). An
  attempt that set no output cap (0) may generate up to the context length: vLLM caps an unset
  ``max_tokens`` at ``max_model_len − prompt`` (its ``get_max_tokens``), which is used; with
  no known ``max_model_len`` its end is unknown and it frees nothing.

The smaller wins (a tie waits: the cache stays warm); no roomy candidate: wait. Rates are the
pool's measured ones (``gateway.fleet.rates``, documented defaults before measurements).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from gateway.fleet.pools import Replica
from gateway.fleet.rates import PoolRates
from gateway.routing.fit import free_kv_tokens, has_room

CHARS_PER_TOKEN = 4  # OpenAI's rule of thumb (as ``plan.kv_fit``)


@dataclass(frozen=True, slots=True)
class Placement:
    """The choice and its figures (seconds; None when not computed: ``stay``)."""

    choice: Literal["stay", "move", "wait"]
    move_s: float | None = None
    wait_s: float | None = None

    def figures(self) -> str | None:
        """``"move_s=… wait_s=…"`` for the access log (``inf``: never), None for ``stay``."""
        if self.choice == "stay":
            return None
        return f"move_s={_fmt(self.move_s)} wait_s={_fmt(self.wait_s)}"


def _fmt(v: float | None) -> str:
    return "-" if v is None else ("inf" if math.isinf(v) else f"{v:.3f}")


def wait_s(home: Replica, need: int, now: float, decode_tok_s: float) -> float:
    """Seconds until ``home`` has ``need`` KV tokens free, from its open attempts' remaining
    output at ``decode_tok_s`` tokens/s each (module docstring; an attempt without an output
    cap, 0, runs to ``max_model_len`` at most); 0.0 when it has them now, ``math.inf`` when
    the attempts it knows of never free enough."""
    free = free_kv_tokens(home, now)
    if free is None:
        return 0.0
    short = need - free
    if short <= 0:
        return 0.0
    rate = max(decode_tok_s, 1e-9)
    longest = home.max_model_len or 0
    ends = sorted((max(0.0, (cap or longest - kv) - rate * max(0.0, now - t0)) / rate, kv)
                  for kv, cap, t0 in home.open_kv.values() if cap > 0 or longest > kv)
    freed = 0
    for t, kv in ends:
        freed += kv
        if freed >= short:
            return t
    return math.inf


def decide(
    home: Replica, others: Sequence[Replica], need: int, output_cap: int,
    cached_tokens: Callable[[Replica], int], rates: PoolRates, now: float,
) -> tuple[Placement, list[Replica]]:
    """Stay, move or wait for a turn of ``need`` tokens (``output_cap`` of them output) whose
    warm replica is ``home``; ``others`` the other candidates, ``cached_tokens(r)`` the prompt
    tokens ``r`` holds cached. Returns the placement and, for ``move``, the roomy candidates
    (where the turn may go)."""
    if has_room(home, need, now):
        return Placement("stay"), []
    roomy = [r for r in others if has_room(r, need, now)]
    wait = wait_s(home, need, now, rates.decode_tok_s)
    if not roomy:
        return Placement("wait", None, wait), []
    prompt = max(0, need - output_cap)
    uncached = min(prompt - min(prompt, cached_tokens(r)) for r in roomy)
    move = uncached / max(rates.prefill_tok_s, 1e-9)
    if move < wait:
        return Placement("move", move, wait), roomy
    return Placement("wait", move, wait), []
