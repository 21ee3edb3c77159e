"""The latency model: costs, regression features, and (de)serialisation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vllm_ascend_cpp.core.latency_model import LatencyModel

M = LatencyModel(a=1e-7, b=0.02, c=30.0, gamma=1e-4)


def test_chunk_cost_is_the_model_without_c():
    L, x = 1000, 512
    expected = 1e-4 * L + 0.02 * x + 1e-7 * (2 * L * x + x * x)
    assert M.chunk_cost_ms(L, x) == pytest.approx(expected)
    assert M.request_ms(L, x) == pytest.approx(30.0 + expected)


def test_single_request_matches_the_seed_difference_form():
    # t(L, x) - c - gamma*L == f(L + x) - f(L) with f(l) = a l^2 + b l + c.
    def f(n):
        return M.a * n * n + M.b * n + M.c

    L, x = 40000, 3000
    assert M.chunk_cost_ms(L, x) - M.gamma * L == pytest.approx(f(L + x) - f(L))


def test_step_ms_adds_c_once_even_when_empty():
    items = [(0, 4096), (10000, 1), (20000, 1)]
    assert M.step_ms(items) == pytest.approx(30.0 + sum(M.chunk_cost_ms(h, x) for h, x in items))
    assert M.step_ms([]) == 30.0


def test_features_dot_vector_is_step_ms():
    items = [(0, 4096), (10000, 1), (123, 77)]
    f = LatencyModel.step_features(items)
    assert f.shape == (5,)
    assert f.tolist() == [1.0, 10123.0, 4174.0, 4096**2 + 2 * 10000 + 1 + 2 * 123 * 77 + 77**2,
                          4096**2 + 1 + 77**2]
    assert float(f @ M.as_vector()) == pytest.approx(M.step_ms(items))
    full = LatencyModel(a=2e-6, b=0.01, c=3.0, gamma=1e-4, d=2e-6)
    assert float(f @ full.as_vector()) == pytest.approx(full.step_ms(items))
    assert LatencyModel.step_features([]).tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_d_is_the_unmasked_half_of_the_own_block():
    # d = a: a kernel that computes the whole x-by-x block costs 2a*x*(L + x).
    m = LatencyModel(a=1e-6, b=0.0, c=0.0, d=1e-6)
    assert m.chunk_cost_ms(3000, 500) == pytest.approx(2e-6 * 500 * (3000 + 500))
    assert not LatencyModel(a=1e-6, b=0.0, c=0.0, d=-1e-9).is_physical
    assert LatencyModel.from_vector([1.0, 0.0, 2.0, 3e-6]).d == 0.0
    assert LatencyModel.from_dict({"a": 1, "b": 2, "c": 3, "d": 4}).d == 4.0


def test_vector_and_dict_round_trips():
    assert LatencyModel.from_vector(M.as_vector()) == M
    assert LatencyModel.from_dict(M.to_dict()) == M
    assert LatencyModel.from_dict({"a": 1, "b": 2, "c": 3}).gamma == 0.0
    assert isinstance(LatencyModel(a=np.float64(1.0), b=1, c=0).a, float)


@pytest.mark.parametrize("bad", [{"a": 1.0, "b": 1.0}, {"a": "x", "b": 1, "c": 1},
                                 {"a": math.nan, "b": 1, "c": 1}, [1, 2, 3]])
def test_bad_dicts_raise_value_error(bad):
    with pytest.raises(ValueError):
        LatencyModel.from_dict(bad)


def test_non_finite_coefficients_raise():
    with pytest.raises(ValueError):
        LatencyModel(a=math.inf, b=0.0, c=0.0)
    with pytest.raises(ValueError):
        LatencyModel.from_vector([1.0, 2.0, 3.0])


def test_is_physical():
    assert M.is_physical
    assert not LatencyModel(a=-1e-9, b=0.1, c=1.0).is_physical
    assert LatencyModel(a=0.0, b=0.1, c=-1.0).is_physical  # c does not size chunks


def _pipeline_results(steps_ms: list[float], stages: int, host_ms: float = 0.0) -> list[float]:
    """When each step's result comes back from ``stages`` stages fed by a batch queue of at
    most ``stages`` batches (vLLM's step_with_batch_queue), each dispatched ``host_ms`` after
    the engine could schedule it; the stages are the simulator's (``_through_stages``)."""
    from vllm_ascend_cpp.sim.engine import _through_stages

    free = [0.0] * stages
    ends: list[float] = []
    clock = 0.0
    for k, t in enumerate(steps_ms):
        if k >= stages:
            clock = max(clock, ends[k - stages])
        clock += host_ms
        ends.append(_through_stages(free, clock, t, [1.0] * stages)[1][-1])
    return ends


@pytest.mark.parametrize("stages,shape", [(2, "rising"), (2, "falling"), (2, "equal"),
                                          (2, "saw"), (3, "rising"), (3, "falling"),
                                          (4, "rising"), (4, "equal")])
def test_host_gap_takes_out_what_the_pipeline_itself_explains(stages, shape):
    """No host work at all: the gap reported is zero, also when the machine runs 30% slower than
    the predictions (the rise is taken at measured speed). Exact on two stages whatever the
    costs do; on more, for runs of rising, falling or equal steps (an uneven saw there errs
    both ways by up to the rise, 0 on the median over a cycle)."""
    from vllm_ascend_cpp.core.latency_model import host_gap_ms

    predicted = {"rising": [100.0 + 35.0 * k for k in range(24)],
                 "falling": [900.0 - 20.0 * k for k in range(24)],
                 "equal": [250.0] * 24,
                 "saw": [100.0 + 40.0 * (k % 4) for k in range(24)]}[shape]
    measured = [1.3 * p for p in predicted]
    ends = _pipeline_results(measured, stages)
    raw, gaps = [], []
    for k in range(stages, len(ends)):
        interval = ends[k] - ends[k - 1]
        raw.append(interval - measured[k])
        gaps.append(host_gap_ms(interval, measured[k], stages, predicted[k], predicted[k - 1]))
    assert max(abs(g) for g in gaps) < 1e-6
    if shape == "rising":
        # Without the correction every step showed (stages-1) times its rise as host time.
        assert min(raw) == pytest.approx((stages - 1) * 1.3 * 35.0)


def test_host_gap_without_predictions_is_the_plain_difference():
    from vllm_ascend_cpp.core.latency_model import host_gap_ms

    assert host_gap_ms(50.0, 40.0, 2) == 10.0
    assert host_gap_ms(50.0, 40.0, 2, math.nan, 30.0) == 10.0
    assert host_gap_ms(50.0, 40.0, 2, 30.0, 0.0) == 10.0
    # One stage: nothing waits on a stage before it, so a rise explains nothing.
    assert host_gap_ms(50.0, 40.0, 1, 40.0, 20.0) == 10.0
    # Host work that the pipeline does not hide stays: equal steps, 6 ms per dispatch.
    ends = _pipeline_results([200.0] * 20, 2, host_ms=6.0)
    gaps = [host_gap_ms(ends[k] - ends[k - 1], 200.0, 2, 200.0, 200.0) for k in range(4, 20)]
    assert sum(gaps) / len(gaps) == pytest.approx(3.0)
