"""Online recalibration: recovery from serving steps, gates, giving up and coming back."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vllm_ascend_cpp.core.calibrator import OnlineCalibrator, scaled_condition
from vllm_ascend_cpp.core.latency_model import LatencyModel

TRUE = LatencyModel(a=8e-8, b=0.015, c=20.0, gamma=2e-4)
STARTUP = LatencyModel(a=1e-7, b=0.02, c=30.0)  # what a sweep at L = 0 might have said


def serving_steps(rng, n, model=TRUE, noise=0.02):
    """One prefill chunk at a random prefix plus up to 31 decodes, timed with noise."""
    for _ in range(n):
        items = [(int(rng.integers(0, 131072)), int(rng.integers(256, 8192)))]
        items += [(int(rng.integers(1, 65536)), 1) for _ in range(int(rng.integers(0, 32)))]
        yield items, model.step_ms(items) * (1 + noise * rng.standard_normal())


def feed(cal, steps, current):
    events = []
    for items, ms in steps:
        assert cal.add(items, ms)
        event = cal.maybe_refit(current)
        if event is not None:
            events.append(event)
            if event.kind in ("accepted", "reenabled", "rescued"):
                current = event.model
    return current, events


@pytest.mark.parametrize("seed", range(3))
def test_recovers_gamma_and_a_from_varied_prefixes(seed):
    rng = np.random.default_rng(seed)
    cal = OnlineCalibrator()
    model, events = feed(cal, serving_steps(rng, 256), STARTUP)
    assert any(e.kind == "accepted" for e in events)
    assert model.gamma == pytest.approx(TRUE.gamma, rel=0.1)
    assert model.a == pytest.approx(TRUE.a, rel=0.1)
    assert model.b == pytest.approx(TRUE.b, rel=0.1)
    assert cal.prediction_error(model) < 0.03 < cal.prediction_error(STARTUP)
    assert cal.failed_fits == 0 and not cal.gave_up


def test_refits_start_at_min_rows_then_come_more_often_while_the_window_is_short():
    rng = np.random.default_rng(1)
    cal = OnlineCalibrator(min_rows=16, refit_every=8)
    attempts = []
    for i, (items, ms) in enumerate(serving_steps(rng, 80)):
        cal.add(items, ms)
        if cal.maybe_refit(STARTUP) is not None:
            attempts.append(i + 1)
    assert attempts[0] == 16
    gaps = np.diff(attempts)
    assert np.all(gaps <= 8) and np.all(gaps >= 2) and gaps[0] < 8 and gaps[-1] == 8
    assert list(gaps) == sorted(gaps)


def test_with_anchors_the_first_refit_comes_after_four_rows():
    rng = np.random.default_rng(1)
    cal = OnlineCalibrator(min_rows=16, refit_every=8)
    sizes = np.linspace(256, 8192, 32)
    cal.set_anchors(sizes, [STARTUP.request_ms(0, s) for s in sizes])
    first = None
    for i, (items, ms) in enumerate(serving_steps(rng, 16)):
        cal.add(items, ms)
        if cal.maybe_refit(STARTUP) is not None:
            first = i + 1
            break
    assert first == 4
    assert cal.tolerance(4) > cal.tolerance(128) > cal.tolerance(256) == cal.max_rel_residual


def test_add_rejects_unusable_measurements():
    cal = OnlineCalibrator()
    assert not cal.add([(0, 100)], math.nan)
    assert not cal.add([(0, 100)], math.inf)
    assert not cal.add([(0, 100)], 0.0)
    assert not cal.add([(0, 100)], -5.0)
    assert not cal.add([], 12.0)
    assert cal.rejected_rows == 5 and cal.n_rows == 0
    assert cal.add([(0, 100)], 12.0) and cal.n_rows == 1
    assert math.isnan(OnlineCalibrator().prediction_error(TRUE))


def test_window_slides():
    cal = OnlineCalibrator(window=32)
    rng = np.random.default_rng(0)
    for items, ms in serving_steps(rng, 100):
        cal.add(items, ms)
    assert cal.n_rows == 32


def test_noise_is_rejected_then_gives_up_once_then_reenables():
    rng = np.random.default_rng(5)
    cal = OnlineCalibrator(window=64, max_failed_fits=8)
    events = []
    for _ in range(64 * 8):  # timings unrelated to the work
        items = [(int(rng.integers(0, 131072)), int(rng.integers(256, 8192)))]
        cal.add(items, float(rng.uniform(10.0, 1000.0)))
        event = cal.maybe_refit(STARTUP)
        if event is not None:
            events.append(event)
    kinds = [e.kind for e in events]
    assert kinds.count("gave_up") == 1
    assert kinds.index("gave_up") == 7  # the eighth failed fit in a row
    assert all(k == "rejected" for k in kinds if k != "gave_up")
    assert all(e.model is None for e in events)
    assert cal.gave_up and cal.accepted_fits == 0

    # Real timings come back: once a window holds only them, a fit passes again. The next
    # attempts may still see a mixed window, so allow two window-fulls.
    current, more = feed(cal, serving_steps(rng, 128), STARTUP)
    more_kinds = [e.kind for e in more]
    assert more_kinds.count("reenabled") == 1 and "gave_up" not in more_kinds
    first = more_kinds.index("reenabled")
    assert all(k == "rejected" for k in more_kinds[:first])
    assert not cal.gave_up and cal.failed_fits == 0
    assert current.a == pytest.approx(TRUE.a, rel=0.2)


def test_without_a_model_in_use_the_first_passing_fit_is_a_rescue():
    rng = np.random.default_rng(6)
    cal = OnlineCalibrator()
    current, events = feed(cal, serving_steps(rng, 32), None)
    kinds = [e.kind for e in events]
    assert kinds[0] == "rescued" and kinds.count("rescued") == 1
    assert current.b == pytest.approx(TRUE.b, rel=0.2)


def test_a_good_model_in_use_is_kept_and_failed_gates_do_not_count():
    # Decodes only: the design is singular, so every refit fails its gates, but the model in
    # use predicts these steps, so nothing is wrong and calibration never gives up.
    rng = np.random.default_rng(2)
    cal = OnlineCalibrator(window=64, max_failed_fits=2)
    events = []
    for _ in range(300):
        items = [(int(rng.integers(1, 100000)), 1) for _ in range(int(rng.integers(1, 64)))]
        cal.add(items, TRUE.step_ms(items) * (1 + 0.01 * rng.standard_normal()))
        event = cal.maybe_refit(TRUE)
        if event is not None:
            events.append(event)
    assert events and all(e.kind == "rejected" for e in events)
    assert "condition number" in events[-1].reason or "rank" in events[-1].reason
    assert not cal.gave_up and cal.failed_fits == 0


def test_new_fit_replaces_the_current_model_only_when_better():
    rng = np.random.default_rng(3)
    steps = list(serving_steps(rng, 64, noise=0.0))
    cal = OnlineCalibrator(min_rows=64, refit_every=64)
    for items, ms in steps:
        cal.add(items, ms)
    event = cal.maybe_refit(TRUE)  # exact data: the fit cannot beat the truth
    assert event.kind == "rejected" and "better" in event.reason
    cal2 = OnlineCalibrator(min_rows=64, refit_every=64)
    for items, ms in steps:
        cal2.add(items, ms)
    event = cal2.maybe_refit(STARTUP)
    assert event.kind == "accepted" and event.model.gamma == pytest.approx(TRUE.gamma, rel=1e-3)


def test_too_few_distinct_shapes_is_a_gate():
    cal = OnlineCalibrator(min_rows=16, refit_every=8, min_distinct=6)
    for i in range(16):
        items = [(0, 1024 * (1 + i % 3))]
        cal.add(items, TRUE.step_ms(items))
    event = cal.maybe_refit(None)
    assert event.kind == "rejected" and "distinct" in event.reason


def test_scaled_condition():
    X = np.array([[1.0, 0.0, 10.0, 100.0], [1.0, 0.0, 20.0, 400.0], [1.0, 0.0, 30.0, 900.0]])
    assert scaled_condition(X) < 1e3
    collinear = np.array([[1.0, 5.0, 1.0, 11.0], [1.0, 7.0, 2.0, 16.0], [1.0, 9.0, 1.0, 19.0],
                          [1.0, 2.0, 3.0, 7.0]])
    collinear[:, 3] = 2 * collinear[:, 1] + collinear[:, 2]
    assert scaled_condition(collinear) > 1e6


def test_constructor_validates():
    with pytest.raises(ValueError):
        OnlineCalibrator(window=0)
    with pytest.raises(ValueError):
        OnlineCalibrator(max_failed_fits=0)
