"""Recent rates from the engines' cumulative counters: prefix-cache hit rate and speculative
decoding acceptance per replica, over about the last minute.

The routing load scraper (``gateway.upstream.load_scraper``) already reads every replica's
``/metrics`` each ``load_scrape_interval_s`` and stores the counters on the ``Replica``; no
second scrape is made here. ``EngineRates.sample`` (called when the console's state is built)
keeps, per replica, the counter values of scrapes at least ``min_gap_s`` apart, for at most
``span_s`` seconds (bounded: ``span_s / min_gap_s`` samples per replica, replicas that left
the pool are dropped). A rate is the counters' difference between the newest sample and the
oldest one within ``span_s`` (``over_s`` seconds apart). With a single sample (``over_s``
None), or for a rate whose denominator did not move within the span (no traffic), the rate is
the cumulative ratio since the engine started.

Formulas (as vLLM computes them from these counters: ``vllm/v1/spec_decode/metrics.py``
and ``examples/offline_inference/spec_decode.py`` for speculative decoding, the prefix-cache
stats of ``vllm/v1/metrics/loggers.py``):

- prefix-cache hit rate = Δ``vllm:prefix_cache_hits`` / Δ``vllm:prefix_cache_queries``
  (prompt tokens found in the cache / prompt tokens looked up), 0..1;
- draft acceptance rate = Δ``vllm:spec_decode_num_accepted_tokens`` /
  Δ``vllm:spec_decode_num_draft_tokens`` (accepted / proposed draft tokens), 0..1;
- tokens per step (mean acceptance length) = 1 + Δaccepted / Δ``vllm:spec_decode_num_drafts``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gateway.fleet.pools import Replica

#: Seconds of history a rate covers (about a minute, like the console's "now").
SPAN_S = 60.0
#: Samples closer together than this (s) are not kept.
MIN_GAP_S = 1.0


@dataclass(frozen=True, slots=True)
class CounterSample:
    """A replica's cumulative engine counters at one scrape (``at``: monotonic s)."""

    at: float
    prefix_queries: float
    prefix_hits: float
    drafts: float
    draft_tokens: float
    accepted: float

    @classmethod
    def of(cls, r: Replica) -> CounterSample:
        return cls(r.engine_load_at, r.prefix_queries, r.prefix_hits, r.spec_drafts,
                   r.spec_draft_tokens, r.spec_accepted)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 and num >= 0 else None


class EngineRates:
    """Per-replica history of engine counters (keyed by replica URL)."""

    def __init__(self, span_s: float = SPAN_S, min_gap_s: float = MIN_GAP_S) -> None:
        self.span_s = span_s
        self.min_gap_s = min_gap_s
        self._samples: dict[str, deque[CounterSample]] = {}

    def sample(self, replicas: Iterable[Replica]) -> None:
        """Keep the latest scrape of each replica (if new and ``min_gap_s`` after the last
        kept one); forget replicas not in ``replicas``."""
        seen = set()
        for r in replicas:
            seen.add(r.url)
            if not r.engine_load_at:
                continue  # never scraped
            q = self._samples.get(r.url)
            if q is None:
                q = self._samples[r.url] = deque(maxlen=int(self.span_s / self.min_gap_s) + 2)
            s = CounterSample.of(r)
            if q and s.at - q[-1].at < self.min_gap_s:
                continue
            if q and (s.prefix_queries < q[-1].prefix_queries or s.drafts < q[-1].drafts):
                q.clear()  # the engine restarted: its counters began again
            q.append(s)
            while len(q) > 2 and s.at - q[1].at >= self.span_s:
                q.popleft()
        for url in list(self._samples):
            if url not in seen:
                del self._samples[url]

    def rates(self, r: Replica) -> dict[str, Any]:
        """``prefix_cache_hit_rate``, ``spec_acceptance_rate``, ``spec_tokens_per_step``
        (None where the engine reports no such counters) over the last ``over_s`` seconds
        (None: one sample only). A rate whose denominator did not move in that span (no
        traffic) is the cumulative one since the engine started."""
        q = self._samples.get(r.url)
        if not q:
            return {"prefix_cache_hit_rate": None, "spec_acceptance_rate": None,
                    "spec_tokens_per_step": None, "over_s": None}
        new, old = q[-1], q[0]

        def rate(field_num: str, field_den: str) -> float | None:
            num, den = getattr(new, field_num), getattr(new, field_den)
            d_den = den - getattr(old, field_den)
            if d_den > 0:
                return _ratio(num - getattr(old, field_num), d_den)
            return _ratio(num, den)

        per_step = rate("accepted", "drafts")
        return {
            "prefix_cache_hit_rate": rate("prefix_hits", "prefix_queries"),
            "spec_acceptance_rate": rate("accepted", "draft_tokens"),
            "spec_tokens_per_step": None if per_step is None else 1.0 + per_step,
            "over_s": round(new.at - old.at, 3) if len(q) > 1 else None,
        }
