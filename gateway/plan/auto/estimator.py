"""Per-pool live estimates for the ``auto`` tier, learned from the gateway's own measurements.

What a request on a pool will cost depends mostly on how busy the pool is: a decode step grows
with the running batch, and a speculative step grows ``k+1`` times faster than a plain one, so
the fast pool wins at low load and loses at high load (vLLM blog, "How Speculative Decoding
Boosts vLLM Performance by up to 2.8x", 2024-10-17; ``engines/sim/perf.py`` models it). A plain
average of recent speeds lags exactly when it matters (a pool that was fast a second ago is
slow now that every request went there), so each pool keeps two small **load-conditioned**
linear models, fitted by exponentially decayed ridge least squares on finished requests:

- TTFT (s) ``= a + b·load + c·uncached_prompt_tokens/1000`` (``c`` is the pool's prefill time
  per 1,000 uncached tokens: the extra prefill a request pays where its prefix is not cached);
- decode time (s, first → last content event) ``= f + (n − 1)·(a + b·load)`` for ``n`` output
  tokens: ``a + b·load`` is the TPOT, ``f`` a fixed cost per request that does not grow with
  its length (the step that sends the finish chunk, a tool call's header). Fitted as TPOT
  ``decode/(n − 1) = a + b·load + f/(n − 1)`` with each request weighted by its ``n − 1``
  tokens (its decode time's variance grows with its length): a short output (``max_tokens``
  4, a tool call) weighs little and its fixed cost lands in ``f``, where a per-request average
  of ``decode/(n − 1)`` would charge it to every token and call the pool slow;

where ``load`` is the pool's mean requests per replica (``gateway.fleet.pools.replica_load``:
in flight here, or the engine's scraped running + waiting when larger), taken when each phase
ran: at dispatch for TTFT (the queue and batch the prompt met), at finish for decode (the batch
its tokens were decoded in; ``gateway.plan.auto.service.measurement``). One average of the two
would, while load ramps up, pair the decode time of a full batch with a half-full batch's load,
and a pool measured only during the ramp would learn a flat TPOT and look slow at any load.
Old samples fade with a half-life (``half_life_s``), but never
below ``MIN_WEIGHT`` samples' (TTFT) or tokens' (decode) worth, so an unused pool keeps its last
fit; and a sample arriving after a silence longer than ``stale_s`` (``explore_stale_s``: the
age at which ``decide`` explores the pool) outweighs that fit at once, since what a stale fit
says may no longer hold: one exploration corrects a wrong estimate. Ridge priors (``PRIOR_*``)
only matter before data arrives, except the load slope's, which is proportional to the fitted
intercept (``RELATIVE_SLOPE``, per tier) and decides until the pool has been measured at more
than one load. ``RELATIVE_SLOPE`` is also the slope's floor: a fit whose load slope comes out
under ρ × its intercept (flat, or negative from noise between a few nearby loads, e.g. the first
requests of a ramp slowed by their neighbours' prefills) is refitted on that bound, since a step
never gets cheaper per sequence as the batch grows (``engines/sim/perf.py``); extrapolated to a
load never measured, a flatter slope calls the pool fast at any load and sends it everything.
For TTFT the same bound is a stand-in (the first token comes out of a step of the batch it
joins, behind the queue ahead of it).

The fast pool's TPOT is also scaled by its speculative acceptance: the mean tokens per step
``1 + accepted / drafts`` from the engines' ``vllm:spec_decode_num_accepted_tokens`` and
``vllm:spec_decode_num_drafts`` counters now, against the same figure while the fitted samples
were taken (a drop in acceptance slows the pool before its requests finish). Pure state: the
caller passes ``now`` (monotonic s); nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: Samples' worth of weight that decay never goes below: a stale fit stays a fit (it still
#: outweighs the priors 100:1) yet gives way to a handful of new samples.
MIN_WEIGHT = 1.0
#: Ridge priors (mean, strength λ) of the TTFT model [a (s), b (s per request of load),
#: c (s per 1,000 uncached tokens)]: ~50 ms base, ~70 ms per 1k prompt tokens (vLLM 70B TP4
#: prefill, see ``engines/sim/perf.py``). The intercepts' priors are weak (a handful of samples
#: override them); the slopes' are stronger, so that data taken at one load and one prompt size
#: is explained by the intercept rather than by a slope it cannot identify (λ = 100 on the load
#: slope weighs like one sample at load 10).
PRIOR_TTFT = ((0.05, 0.01), (0.0, 100.0), (0.07, 1.0))
#: Ridge priors of the decode model [a (s/token), b (s/token per request of load), f (s per
#: request)]: ~12 ms/token, no fixed cost. Weights are tokens here, so λ = 0.01 is a hundredth of
#: a token's worth; the load slope's λ = 100 still weighs like ~one long request at load 10.
PRIOR_TPOT = ((0.012, 0.01), (0.0, 100.0), (0.0, 0.01))
#: The TTFT model's prefill feature is uncached prompt tokens / this (thousands of tokens).
KTOK = 1000.0
#: Prior of the load slopes, relative to the intercept (per request of load): how much slower a
#: step gets per sequence in the batch. Standard decode: 0.1 ms per sequence on a 12 ms step
#: (1/120); speculative (k = 4): the draft's 0.01 ms × k plus verification's 0.1 ms × (k + 1)
#: per sequence on a 16 ms step (0.54/16 ≈ 1/30) — ``engines/sim/perf.py``, calibrated on vLLM's
#: published 70B TP4 measurements. A prior and a floor (``DecayedRidge.beta``): with data at
#: several loads the fit decides above the floor.
#: It matters when a pool was only ever measured idle and load jumps (without it, an idle-only
#: fit would call the fast pool fast at any load until its slow requests finish).
RELATIVE_SLOPE = {"standard": 1 / 120, "fast": 0.54 / 16}
#: Iterations of the relative slope prior's fixed point (each a 3×3 solve, ~10 µs).
FIXED_POINT_STEPS = 6
#: Completion length assumed before any request finished and without ``max_tokens`` (tokens).
DEFAULT_OUTPUT_TOKENS = 256
#: Spec-decode acceptance correction is clamped to this factor either way.
ACCEPTANCE_CLAMP = 2.0


class DecayedRidge:
    """Weighted least squares ``y ≈ x·β`` with exponential time decay and a ridge prior.

    Minimises ``Σ wᵢ (yᵢ − xᵢ·β)² + Σⱼ λⱼ (βⱼ − μⱼ)²`` where ``wᵢ = 2^(−ageᵢ / half_life_s)``,
    kept as decayed sums ``XᵀWX`` and ``XᵀWy`` (O(k²) per sample, k ≤ 3). ``priors``: ``(μⱼ,
    λⱼ)`` per coefficient. Decay stops once the total weight is ``min_weight``, except that a
    sample arriving more than ``stale_s`` after the previous one first cuts the old weight down
    to ``min_weight`` (a stale fit gives way to a fresh measurement)."""

    def __init__(
        self,
        priors: Sequence[tuple[float, float]],
        half_life_s: float,
        min_weight: float = MIN_WEIGHT,
        relative_slope: float | None = None,
        stale_s: float | None = None,
    ) -> None:
        self.k = len(priors)
        self.priors = tuple(priors)
        self.relative_slope = relative_slope  # prior μ₁ = this × β₀ (a slope ∝ the intercept)
        self.half_life_s = half_life_s
        self.min_weight = min_weight
        self.stale_s = stale_s
        self.xtx = [[0.0] * self.k for _ in range(self.k)]
        self.xty = [0.0] * self.k
        self.weight = 0.0  # Σ w: samples' worth of data
        self.samples = 0  # samples ever observed
        self.last_t: float | None = None  # monotonic s of the last sample
        self._beta: list[float] | None = None

    def _decay(self, now: float) -> None:
        if self.last_t is None or now <= self.last_t or self.weight <= self.min_weight:
            return
        f = 2.0 ** (-(now - self.last_t) / self.half_life_s)
        f = max(f, self.min_weight / self.weight)
        if self.stale_s is not None and now - self.last_t > self.stale_s:
            f = min(f, self.min_weight / self.weight)
        for row in self.xtx:
            for j in range(self.k):
                row[j] *= f
        for j in range(self.k):
            self.xty[j] *= f
        self.weight *= f

    def observe(self, x: Sequence[float], y: float, now: float, w: float = 1.0) -> None:
        """Add one sample (features ``x``, target ``y``) at ``now`` with weight ``w`` (samples'
        worth; the decode model passes tokens)."""
        self._decay(now)
        for i in range(self.k):
            xi = x[i] * w
            row = self.xtx[i]
            for j in range(self.k):
                row[j] += xi * x[j]
            self.xty[i] += xi * y
        self.weight += w
        self.samples += 1
        self.last_t = now if self.last_t is None else max(self.last_t, now)
        self._beta = None

    @property
    def beta(self) -> list[float]:
        """The fitted coefficients (the prior means before any sample). With
        ``relative_slope`` ρ: the load slope's prior mean is ρ × the fitted intercept (a fixed
        point), and the slope is at least that (``_solve_on_floor``)."""
        if self._beta is None:
            mus = [mu for mu, _ in self.priors]
            self._beta = self._solve_with(mus)
            if self.relative_slope is not None:  # fixed point of μ₁ = ρ × fitted β₀
                for _ in range(FIXED_POINT_STEPS):
                    mus[1] = self.relative_slope * max(0.0, self._beta[0])
                    self._beta = self._solve_with(mus)
                floor = self.relative_slope * max(0.0, self._beta[0])
                if self._beta[1] < floor:
                    self._beta = self._solve_on_floor(self._beta)
        return self._beta

    def _solve_on_floor(self, beta: list[float]) -> list[float]:
        """``beta`` (whose load slope is under ``ρ β₀``, ρ = ``relative_slope``) refitted on
        the bound ``β₁ = ρ β₀``: a load slope under the physical one (flat, or negative from
        noise at a few nearby loads) extrapolates to a pool that never slows down. Only the
        intercept is refitted (weighted least squares along ``(1, ρ)`` with its ridge prior);
        the other coefficients keep their values in ``beta`` (else a fixed cost collinear with
        the intercept could take the level and leave the slope at ~0). Never a negative
        slope."""
        rho = self.relative_slope or 0.0
        u = (1.0, rho)
        resid = [self.xty[i] - sum(self.xtx[i][j] * beta[j] for j in range(2, self.k))
                 for i in range(2)]
        mu0, lam0 = self.priors[0]
        num = sum(u[i] * resid[i] for i in range(2)) + lam0 * mu0
        den = sum(u[i] * self.xtx[i][j] * u[j] for i in range(2) for j in range(2)) + lam0
        g = num / den if den > 0 else mu0
        return [g, rho * max(0.0, g), *beta[2:]]

    def _solve_with(self, mus: list[float]) -> list[float]:
        a = [row[:] for row in self.xtx]
        b = self.xty[:]
        for j, (_, lam) in enumerate(self.priors):
            a[j][j] += lam
            b[j] += lam * mus[j]
        return _solve(a, b)

    def predict(self, x: Sequence[float]) -> float:
        """``x·β``."""
        return sum(xi * bi for xi, bi in zip(x, self.beta, strict=True))


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (k ≤ 3); singular → zeros where undefined."""
    n = len(b)
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[piv][col]) < 1e-300:
            continue
        a[col], a[piv] = a[piv], a[col]
        b[col], b[piv] = b[piv], b[col]
        for r in range(col + 1, n):
            f = a[r][col] / a[col][col]
            if f:
                for c in range(col, n):
                    a[r][c] -= f * a[col][c]
                b[r] -= f * b[col]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        if abs(a[r][r]) < 1e-300:
            continue
        x[r] = (b[r] - sum(a[r][c] * x[c] for c in range(r + 1, n))) / a[r][r]
    return x


@dataclass(frozen=True, slots=True)
class Measurement:
    """One finished request on one pool, as the gateway measured it (seconds, tokens).

    ``ttft_s``: upstream request sent → first content event (streams), or None;
    ``decode_s``: first → last content event (streams), or None; ``total_s``: upstream time to
    the whole body (JSON responses), or None; ``load``: the pool's mean requests per replica
    while it decoded (at finish); ``ttft_load``: the same when it was dispatched (its TTFT's
    load), None when unknown (then ``load``)."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    load: float
    ttft_s: float | None = None
    decode_s: float | None = None
    total_s: float | None = None
    ttft_load: float | None = None  # the load at dispatch, for TTFT (None: ``load``)


@dataclass(frozen=True, slots=True)
class PoolEstimate:
    """A pool's fitted models, frozen for one decision (pure input of ``decide``)."""

    ttft_beta: tuple[float, float, float]
    tpot_beta: tuple[float, float]
    samples: int  # TPOT samples observed (how much to trust it)
    age_s: float  # seconds since the pool's last sample (inf: never)
    acceptance_factor: float = 1.0  # TPOT multiplier from spec-decode acceptance now vs fit
    decode_fixed_s: float = 0.0  # f: decode time per request that does not grow with length

    def ttft_s(self, load: float, uncached_tokens: float) -> float:
        """Predicted TTFT (s) at ``load`` requests per replica with ``uncached_tokens`` to
        prefill; never below 0."""
        a, b, c = self.ttft_beta
        return max(0.0, a + b * load + c * uncached_tokens / KTOK)

    def tpot_s(self, load: float) -> float:
        """Predicted seconds per output token after the first at ``load``; > 0."""
        a, b = self.tpot_beta
        return max(1e-6, (a + b * load) * self.acceptance_factor)

    @property
    def prefill_s_per_token(self) -> float:
        """The fitted prefill time per uncached prompt token (s/token), ≥ 0."""
        return max(0.0, self.ttft_beta[2] / KTOK)

    def decode_s(self, load: float, output_tokens: float) -> float:
        """Expected first → last content event (s): f + (output − 1) × TPOT; 0 for ≤ 1 token."""
        if output_tokens <= 1:
            return 0.0
        return self.decode_fixed_s + (output_tokens - 1) * self.tpot_s(load)

    def completion_s(self, load: float, uncached_tokens: float, output_tokens: float) -> float:
        """Expected upstream time (s) of a request: TTFT + f + (output − 1) × TPOT."""
        return self.ttft_s(load, uncached_tokens) + self.decode_s(load, output_tokens)


class PoolEstimator:
    """The live estimate of one pool: TTFT and TPOT models, typical completion length,
    measured speed (for telemetry), and spec-decode acceptance (mean tokens per step)."""

    def __init__(
        self, half_life_s: float = 30.0, tier: str | None = None, stale_s: float | None = None
    ) -> None:
        self.half_life_s = half_life_s
        rel = RELATIVE_SLOPE.get(tier or "")
        self.ttft = DecayedRidge(PRIOR_TTFT, half_life_s, relative_slope=rel, stale_s=stale_s)
        self.tpot = DecayedRidge(PRIOR_TPOT, half_life_s, relative_slope=rel, stale_s=stale_s)
        self.output_tokens = Ewma(half_life_s)  # completion tokens per request
        self.measured_tps = Ewma(half_life_s)  # output tokens/s of decode, token-weighted
        self.measured_ttft = Ewma(half_life_s)  # s
        self.tokens_per_step: float | None = None  # spec decode now (scraped); None: unknown
        self.tokens_per_step_fit = Ewma(half_life_s)  # the same while samples were taken

    def observe(self, m: Measurement, now: float) -> None:
        """Learn from one finished request."""
        uncached = max(0, m.prompt_tokens - m.cached_tokens)
        ttft_load = m.load if m.ttft_load is None else m.ttft_load
        if m.completion_tokens > 0:
            self.output_tokens.add(m.completion_tokens, now)
        if m.ttft_s is not None:
            self.ttft.observe((1.0, ttft_load, uncached / KTOK), m.ttft_s, now)
            self.measured_ttft.add(m.ttft_s, now)
        decode = m.decode_s
        if decode is None and m.total_s is not None and m.ttft_s is None:
            # a JSON response: total = TTFT + decode; take the TTFT the model predicts
            ttft = max(0.0, self.ttft.predict((1.0, ttft_load, uncached / KTOK)))
            decode = max(0.0, m.total_s - ttft)
        if decode is not None and m.completion_tokens > 1 and decode > 0:
            steps = m.completion_tokens - 1
            tpot = decode / steps
            self.tpot.observe((1.0, m.load, 1.0 / steps), tpot, now, w=float(steps))
            self.measured_tps.add(1.0 / tpot, now, weight=float(steps))
            if self.tokens_per_step is not None:
                self.tokens_per_step_fit.add(self.tokens_per_step, now)

    def set_tokens_per_step(self, value: float | None) -> None:
        """The pool's current spec-decode tokens per step (``1 + accepted / drafts`` over the
        last scrape interval); None when the pool reports no spec-decode counters."""
        self.tokens_per_step = value

    def acceptance_factor(self) -> float:
        """TPOT multiplier: tokens per step while fitting / now, clamped; 1 without data."""
        now_tps, fit = self.tokens_per_step, self.tokens_per_step_fit.value
        if not now_tps or not fit:
            return 1.0
        return min(ACCEPTANCE_CLAMP, max(1.0 / ACCEPTANCE_CLAMP, fit / now_tps))

    def snapshot(self, now: float) -> PoolEstimate:
        """The models as they stand at ``now``."""
        t = self.ttft.beta
        p = self.tpot.beta
        last = self.tpot.last_t
        return PoolEstimate(
            (t[0], t[1], t[2]),
            (p[0], p[1]),
            self.tpot.samples,
            math.inf if last is None else max(0.0, now - last),
            self.acceptance_factor(),
            max(0.0, p[2]),
        )


class Ewma:
    """Exponentially time-decayed mean: each value's weight halves every ``half_life_s``."""

    __slots__ = ("half_life_s", "last_t", "total", "weight")

    def __init__(self, half_life_s: float) -> None:
        self.half_life_s = half_life_s
        self.total = 0.0
        self.weight = 0.0
        self.last_t: float | None = None

    def add(self, value: float, now: float, weight: float = 1.0) -> None:
        """Add ``value`` observed at ``now`` (monotonic s), counted ``weight`` times."""
        if self.last_t is not None and now > self.last_t:
            f = 2.0 ** (-(now - self.last_t) / self.half_life_s)
            self.total *= f
            self.weight *= f
        self.total += value * weight
        self.weight += weight
        self.last_t = now if self.last_t is None else max(self.last_t, now)

    @property
    def value(self) -> float | None:
        """The decayed mean, or None before any value."""
        return self.total / self.weight if self.weight > 0 else None


def expected_output_tokens(max_tokens: int | None, typical: float | None) -> float:
    """Output tokens to plan for: the typical completion length of recent requests, capped by
    ``max_tokens``; ``max_tokens`` alone when nothing finished yet; else
    ``DEFAULT_OUTPUT_TOKENS``."""
    if typical is not None and typical > 0:
        return min(float(max_tokens), typical) if max_tokens else typical
    if max_tokens:
        return float(max_tokens)
    return float(DEFAULT_OUTPUT_TOKENS)
