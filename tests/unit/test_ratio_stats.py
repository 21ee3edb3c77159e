"""benchmarks/ratio_stats.py against distributions whose answer is known."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import ratio_stats as rs  # noqa: E402


@pytest.mark.parametrize("true_ratio", [0.9, 1.0, 1.07])
def test_interval_covers_the_true_ratio_about_95_percent(true_ratio: float) -> None:
    # Per-round ratios log-normal around the true ratio (its geometric mean), 20 rounds.
    rng = np.random.default_rng(1234)
    sims, hits = 300, 0
    for k in range(sims):
        values = true_ratio * np.exp(rng.normal(0.0, 0.08, size=20))
        lo, hi = rs.bootstrap_interval(values, resamples=2000, seed=k)
        hits += lo <= true_ratio <= hi
    coverage = hits / sims
    # The percentile bootstrap under-covers a little at n = 20 (about 93%); a broken interval
    # (too narrow, off-centre, the wrong quantiles) lands far outside this band.
    assert 0.89 <= coverage <= 0.985, coverage


def test_interval_is_too_narrow_when_asked_for_less() -> None:
    # The same simulation at a 50% level must cover far less: the level is really used.
    rng = np.random.default_rng(99)
    hits = 0
    for k in range(200):
        values = 1.1 * np.exp(rng.normal(0.0, 0.08, size=20))
        lo, hi = rs.bootstrap_interval(values, level=0.5, resamples=2000, seed=k)
        hits += lo <= 1.1 <= hi
    assert 0.35 <= hits / 200 <= 0.65


def test_three_rounds_give_min_to_max() -> None:
    # A resample of three equal draws has probability 1/27 > 2.5%: the ends are the extremes.
    r = rs.ratio([0.905, 0.968, 1.070])
    assert r.lo == pytest.approx(0.905) and r.hi == pytest.approx(1.070)
    assert r.point == pytest.approx((0.905 * 0.968 * 1.070) ** (1 / 3))


@pytest.mark.parametrize("rounds", [[0.905, 0.968, 1.070], [1.083, 0.928, 0.920]])
def test_the_quoted_claims_of_issue_14_are_no_difference(rounds: list[float]) -> None:
    assert rs.ttft_verdict(rs.ratio(rounds)) == rs.NO_DIFFERENCE


def test_verdicts_need_the_whole_interval_on_one_side() -> None:
    assert rs.ttft_verdict(rs.ratio([0.80, 0.85, 0.83])) == "faster"
    assert rs.ttft_verdict(rs.ratio([1.10, 1.05, 1.20])) == "slower"
    assert rs.throughput_verdict(rs.ratio([1.10, 1.05, 1.20])) == "higher throughput"
    assert rs.throughput_verdict(rs.ratio([0.99, 1.05, 1.20])) == rs.NO_DIFFERENCE


def test_geomean_treats_halving_and_doubling_alike() -> None:
    assert rs.geomean([0.5, 2.0]) == pytest.approx(1.0)


def test_paired_and_quoted_form() -> None:
    r = rs.paired([900.0, 1000.0, 1100.0], [1000.0, 1000.0, 1000.0])
    assert r.values == pytest.approx((0.9, 1.0, 1.1))
    assert r.quoted() == f"{r.point:.3f}x [0.900-1.100]"
    with pytest.raises(ValueError):
        rs.paired([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        rs.ratio([1.0, -1.0])
    assert math.isclose(rs.ratio([1.2] * 5).lo, 1.2)


@pytest.mark.parametrize("rounds,low,high", [(3, 0.70, 0.80), (5, 0.78, 0.91), (8, 0.82, 0.94)])
def test_coverage_at_the_round_counts_the_docs_quote(rounds: int, low: float,
                                                      high: float) -> None:
    # With 3 rounds the interval is [min, max]: it misses the true (median) ratio exactly when
    # all three rounds fall on one side, probability 2 / 2^3 = 1/4. The docs quote about 75%,
    # 85% and 88% for 3, 5 and 8 rounds.
    rng = np.random.default_rng(7)
    hits = 0
    for k in range(600):
        values = np.exp(rng.normal(0.0, 0.05, size=rounds))
        lo, hi = rs.bootstrap_interval(values, resamples=1000, seed=k)
        hits += lo <= 1.0 <= hi
    assert low <= hits / 600 <= high


def test_fewer_than_three_rounds_give_no_verdict() -> None:
    assert rs.ttft_verdict(rs.ratio([1.0003])) == rs.TOO_FEW
    assert rs.throughput_verdict(rs.ratio([0.5, 0.6])) == rs.TOO_FEW


def test_mean_interval_takes_differences_of_any_sign() -> None:
    assert rs.mean_interval([-0.2, 0.0, 0.1]) == pytest.approx((-0.2, 0.1))
    rng = np.random.default_rng(7)
    covered = 0
    for _ in range(200):
        lo, hi = rs.mean_interval(rng.normal(0.05, 0.1, size=20), resamples=2000)
        covered += lo <= 0.05 <= hi
    assert covered >= 170  # about 95% of 200, with room for the bootstrap's under-coverage
    with pytest.raises(ValueError):
        rs.mean_interval([])
    with pytest.raises(ValueError):
        rs.mean_interval([0.1, float("nan")])
