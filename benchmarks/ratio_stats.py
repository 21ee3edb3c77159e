"""Paired ratios for the benchmarks: per-round values, a point estimate, a bootstrap interval.

Every ratio a benchmark reports (CPP over fixed, TTFT or throughput) is computed per round from
runs that ran close together in time, so machine drift cancels within a pair. The point
estimate is the geometric mean of the per-round ratios (the mean of their logarithms: a ratio
of 0.5 and one of 2.0 average to 1.0). The interval is a percentile bootstrap of that mean at
95%: resample the rounds with replacement, take the geometric mean of each resample, keep the
2.5th and 97.5th percentiles.

Reading it: with 3 rounds the bootstrap interval is exactly [min, max] of the rounds (a
resample of all-minimum has probability 1/27 > 2.5%), so three rounds can only call a
difference when every round agrees on its side of 1.0, which happens one time in four when
there is no difference at all. A claim says "faster"/"slower" (or "higher"/"lower"
throughput) only when the interval excludes 1.0, otherwise "no difference measured"; with
fewer than 3 rounds, no verdict at all. The percentile bootstrap under-covers at small n
(about 75%, 85%, 88% at 3, 5, 8 rounds in tests/unit/test_ratio_stats.py's simulations), so
read an interval from few rounds as a minimum spread, not a guarantee.

Quoted form (docs and results alike, so tests/unit/test_quoted_ratios.py can check them):
`0.968x [0.905-1.070]`: three decimals, an `x`, the interval in brackets.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

LEVEL = 0.95
RESAMPLES = 10000
NO_DIFFERENCE = "no difference measured"
# Fewer rounds give an interval of one or two points: no verdict at all.
MIN_ROUNDS = 3
TOO_FEW = "too few rounds for a verdict"


def geomean(values: Sequence[float]) -> float:
    logs = [math.log(v) for v in values]
    return math.exp(sum(logs) / len(logs))


def bootstrap_interval(values: Sequence[float], *, level: float = LEVEL,
                       resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the geometric mean of positive ``values``."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        raise ValueError("no values")
    if not np.all(np.isfinite(arr) & (arr > 0)):
        raise ValueError("ratios must be positive and finite")
    lo, hi = _bootstrap_mean(np.log(arr), level, resamples, seed)
    return float(math.exp(lo)), float(math.exp(hi))


def mean_interval(values: Sequence[float], *, level: float = LEVEL,
                  resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the arithmetic mean of finite ``values`` (paired
    differences, e.g. of shares, which may be zero or negative)."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        raise ValueError("no values")
    if not np.all(np.isfinite(arr)):
        raise ValueError("values must be finite")
    lo, hi = _bootstrap_mean(arr, level, resamples, seed)
    return float(lo), float(hi)


def _bootstrap_mean(arr: np.ndarray, level: float, resamples: int,
                    seed: int) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, arr.size, size=(resamples, arr.size))
    means = arr[idx].mean(axis=1)
    tail = (1.0 - level) / 2.0
    # "inverted_cdf": the interval's ends are values a resample can take (with 3 rounds,
    # exactly the smallest and largest round), not interpolations between them.
    lo, hi = np.quantile(means, [tail, 1.0 - tail], method="inverted_cdf")
    return float(lo), float(hi)


@dataclass(frozen=True)
class Ratio:
    """A paired ratio: per-round values, geometric mean, bootstrap interval."""

    values: tuple[float, ...]
    point: float
    lo: float
    hi: float

    @property
    def excludes_one(self) -> bool:
        return self.hi < 1.0 or self.lo > 1.0

    def verdict(self, lower_is: str = "faster", higher_is: str = "slower") -> str:
        """``lower_is`` when the whole interval is below 1.0, ``higher_is`` when above."""
        if len(self.values) < MIN_ROUNDS:
            return TOO_FEW
        if self.hi < 1.0:
            return lower_is
        if self.lo > 1.0:
            return higher_is
        return NO_DIFFERENCE

    def quoted(self) -> str:
        """The form docs quote: ``0.968x [0.905-1.070]``."""
        return f"{self.point:.3f}x [{self.lo:.3f}-{self.hi:.3f}]"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["values"] = list(self.values)
        d["quoted"] = self.quoted()
        return d


def ratio(values: Sequence[float], *, seed: int = 0) -> Ratio:
    vals = tuple(float(v) for v in values)
    lo, hi = bootstrap_interval(vals, seed=seed)
    return Ratio(vals, geomean(vals), lo, hi)


def paired(numerators: Sequence[float], denominators: Sequence[float], *,
           seed: int = 0) -> Ratio:
    """Round-by-round ``numerator / denominator`` (pairs ran in the same round)."""
    if len(numerators) != len(denominators):
        raise ValueError("paired ratios need one numerator per denominator")
    return ratio([a / b for a, b in zip(numerators, denominators)], seed=seed)


def ttft_verdict(r: Ratio) -> str:
    return r.verdict("faster", "slower")


def throughput_verdict(r: Ratio) -> str:
    return r.verdict("lower throughput", "higher throughput")
