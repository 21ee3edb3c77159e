"""The speed factor (core/speed.py) and what it changes in the manager."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vllm_ascend_cpp.core.latency_model import LatencyModel
from vllm_ascend_cpp.core.manager import SPEED_WINDOW, CppState, ProfilingChunkManager
from vllm_ascend_cpp.core.settings import CoreSettings
from vllm_ascend_cpp.core.speed import SpeedFactor
from vllm_ascend_cpp.core.step_planner import Candidate

TRUE = LatencyModel(a=2.65e-6, b=0.021, c=0.65, gamma=3.6e-4, d=2.5e-6)


def test_value_is_the_geometric_median_of_the_latest_window():
    rng = np.random.default_rng(0)
    sf = SpeedFactor(window=9, min_steps=3, deadband=0.0)
    ratios = np.exp(rng.normal(0.1, 0.2, size=40))
    for i, r in enumerate(ratios):
        sf.observe(100.0 * r, 100.0)
        if i + 1 >= 3:
            # Brute force: the middle of the sorted latest ratios (odd counts only).
            latest = sorted(ratios[max(0, i - 8):i + 1])
            if len(latest) % 2:
                assert sf.value == pytest.approx(latest[len(latest) // 2])


def test_nothing_moves_before_min_steps_or_inside_the_dead_band():
    sf = SpeedFactor(window=16, min_steps=4, deadband=0.05)
    for _ in range(3):
        assert not sf.observe(130.0, 100.0)
    assert sf.value == 1.0
    assert sf.observe(130.0, 100.0) and sf.value == pytest.approx(1.3)
    # 1.3 -> 1.33 is inside 5%: kept.
    for _ in range(16):
        sf.observe(133.0, 100.0)
    assert sf.value == pytest.approx(1.3)
    for _ in range(16):
        sf.observe(140.0, 100.0)
    assert sf.value == pytest.approx(1.4)


def test_bounds_and_bad_input():
    sf = SpeedFactor(window=4, min_steps=1, bounds=(0.5, 2.0))
    for bad in (math.nan, -1.0, 0.0, math.inf, None):
        assert not sf.observe(bad, 10.0)
    assert not sf.observe(10.0, 0.0) and sf.n == 0
    sf.observe(100.0, 10.0)
    assert sf.value == 2.0
    sf.reset([0.01] * 4)
    assert sf.value == 0.5
    sf.reset([1.2, 1.2])
    assert sf.value == pytest.approx(1.2)
    sf.reset()
    assert sf.value == 1.0 and sf.n == 0
    with pytest.raises(ValueError):
        SpeedFactor(window=4, min_steps=5)
    with pytest.raises(ValueError):
        SpeedFactor(bounds=(1.2, 2.0))


def profiled(target_mode: str = "base") -> ProfilingChunkManager:
    m = ProfilingChunkManager(CoreSettings(base_chunk=2048, pp_size=2, target_mode=target_mode))
    m.begin_profiling()
    sizes = m.sample_sizes()
    m.finish_profiling(sizes, [TRUE.request_ms(0, s) for s in sizes])
    assert m.state is CppState.CALIBRATING
    return m


QUEUE = [Candidate("d0", 900, 1, False), Candidate("p0", 6000, 9000, True),
         Candidate("p1", 0, 5000, True), Candidate("p2", 0, 700, True)]


def plan_of(m: ProfilingChunkManager):
    return m.plan_step(QUEUE, max_budget=4096)


def test_a_host_running_slower_is_followed_and_base_plans_do_not_change():
    m = profiled()
    before = plan_of(m)
    model = m.model
    items = [(6000, 1200)]
    # Every timed step now takes 25% longer than the model in use says (no refit due: the
    # calibrator is fed rows that only its next refit would read).
    for _ in range(SPEED_WINDOW):
        m.record_step(items, 1.25 * model.step_ms(items))
        if m.model is not model:
            model = m.model  # a refit came in: the comparison is against the model in use
    assert m.speed.value == pytest.approx(1.25, rel=0.03)
    assert m.predict_ms(items) == pytest.approx(1.25 * m.model.step_ms(items), rel=1e-9)
    assert m.summary()["speed"] == m.speed.value
    after = plan_of(m)
    # The target is the model's own cost of a base chunk: a common factor changes no chunk.
    assert [(i.req_id, i.tokens) for i in after.items] == \
        [(i.req_id, i.tokens) for i in before.items]
    assert after.token_budget == before.token_budget
    assert after.predicted_ms == pytest.approx(m.speed.value / 1.0 * m.model.step_ms(
        [(i.history, i.tokens) for i in after.items]), rel=1e-9)


def test_a_new_model_starts_at_the_speed_of_the_latest_rows():
    m = profiled()
    cal = m.calibrator
    # Rows from a host 30% slower than the sweep: when a refit is accepted, its speed is
    # read from the latest rows against the new model, not restarted at 1.
    rng = np.random.default_rng(3)
    accepted = None
    for _ in range(400):
        L, x = int(rng.integers(0, 20000)), int(rng.integers(64, 2048))
        ev = m.record_step([(L, x), (int(rng.integers(0, 4000)), 1)],
                           1.3 * TRUE.step_ms([(L, x), (0, 1)]) * float(rng.uniform(0.97, 1.03)))
        if ev is not None and ev.kind == "accepted":
            accepted = ev
            X, y = cal.window_arrays()
            ratios = y[-SPEED_WINDOW:] / (X[-SPEED_WINDOW:] @ m.model.as_vector())
            assert m.speed.value == pytest.approx(float(np.median(ratios)), rel=0.02)
    assert accepted is not None


def test_online_calibration_off_keeps_the_model_as_profiled():
    m = ProfilingChunkManager(CoreSettings(base_chunk=2048, pp_size=2, online_calibration=False))
    m.begin_profiling()
    sizes = m.sample_sizes()
    m.finish_profiling(sizes, [TRUE.request_ms(0, s) for s in sizes])
    for _ in range(40):
        m.record_step([(0, 1024)], 2.0 * TRUE.request_ms(0, 1024))
    assert m.speed.value == 1.0 and m.predictor.model == m.model
