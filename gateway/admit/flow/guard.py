"""The first-token guard of one pool: after a top-band request takes a slot, for
the top band's typical time to first token (``first_token_guard_s`` at most), a lower band may
not take the *last* slot free to it, so no batch prompt is prefilled in a full engine step that
the first token waits for. Pure: times are seconds on the caller's monotonic clock.

The rule, and why an unsaturated pool pays nothing: vLLM schedules one step over every running
sequence, so a batch prefill delays a first token only when it lands on that first token's
replica in a step with no room to spare. The gateway picks the replica after the slot (least
loaded), so while one more slot stays free after a lower-band dispatch, that prompt has room
beside the first token; only the dispatch that would fill the pool (the last free slot) is held.
And a lower-band request is held at most ``first_token_guard_s`` in all, however often new
top-band dispatches renew the guard: one first token's delay, never a starvation.
"""

from __future__ import annotations


class FirstTokenGuard:
    """``cap_s``: ``first_token_guard_s`` (0 = off); ``ttft_s``: the top band's measured time
    to first token (EWMA, weight 0.2 to the newest; None until one is measured); ``until``:
    lower bands may be held before this time."""

    def __init__(self, cap_s: float) -> None:
        self.cap_s = cap_s
        self.ttft_s: float | None = None
        self.until = 0.0

    def learn(self, ttft_s: float) -> None:
        """A top-band request's measured time to first token (s)."""
        prev = self.ttft_s
        self.ttft_s = ttft_s if prev is None else prev + 0.2 * (ttft_s - prev)

    def renew(self, now: float) -> float | None:
        """A top-band request took a slot at ``now``: hold lower bands for ``min(ttft_s,
        cap_s)``. Returns that hold (s) when it moved ``until`` later (the caller serves the
        queue again then), else None (guard off, nothing learned, or already held longer)."""
        if self.cap_s <= 0 or self.ttft_s is None:
            return None
        hold_s = min(self.ttft_s, self.cap_s)
        if now + hold_s <= self.until:
            return None
        self.until = now + hold_s
        return hold_s

    def binds(self, now: float, oldest_lower: float | None) -> bool:
        """Whether the guard may hold a lower-band dispatch at ``now``: a first token is due
        and the oldest waiting lower-band request (its arrival, ``oldest_lower``; None: none
        waits yet) has waited less than ``cap_s``. The caller applies it to the last free
        slot only (see the module docstring)."""
        if now >= self.until:
            return False
        return oldest_lower is None or now - oldest_lower < self.cap_s
