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
