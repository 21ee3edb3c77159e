"""Constrained, outlier-robust least squares for the step latency model.

Both data sources end up here: the startup sweep (single prefills at ``L = 0``, so only ``c``,
``b`` and ``a`` are identifiable) and the online window (rows
``[1, sum L, sum x, sum(2Lx + x^2), sum x^2]``). The fit

* drops samples whose latency is NaN, infinite, zero or negative, or more than a million
  times off the median latency (no real step is; such values would overflow the row weights
  and leave LAPACK running without end), counted, never used;
* scales every column to unit maximum so the solver sees comparable magnitudes (``x^2`` is
  ~1e8 times ``1`` at realistic chunk sizes);
* weights rows by ``1/latency``: timing noise is roughly proportional to the step time, and
  otherwise the few largest steps would decide the fit alone;
* bounds ``a, b, gamma, d >= 0`` (and ``c >= 0``) with bounded-variable least squares;
* fixes ``d`` at 0 when the rows cannot tell it from ``a`` (no step with a cached prefix, or
  prefixes too short to matter): ``a`` then carries the whole ``x^2`` cost, which is all
  such rows can show; where it is ``gamma`` that makes ``d`` inseparable (one chunk size at
  many prefixes), the fit with ``d`` and without ``gamma`` is tried too and the closer one
  kept;
* starts from Huber-weighted iterations (convex, so outliers cannot trap it), then drops rows
  whose relative residual is beyond 3.5 robust standard deviations (MAD) and refits on the rest.

It refuses to return a model it cannot stand behind, with one sentence saying why.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy.optimize import lsq_linear
from scipy.stats import spearmanr

from .latency_model import LatencyModel

__all__ = ["FitResult", "fit_startup", "fit_rows", "fitted_columns", "MIN_SAMPLES"]

MIN_SAMPLES = 8
# Rows further than this many robust standard deviations from the fit are outliers.
_OUTLIER_SIGMAS = 3.5
# Huber's tuning constant (95% efficiency under Gaussian noise).
_HUBER_K = 1.345
# Relative noise floor: perfectly clean data would otherwise have a zero MAD and every
# rounding error would look like an outlier.
_MIN_REL_SCALE = 1e-3
# Spearman rho at or below this means latency falls as the work grows.
_FALLING_RHO = -0.3
# The fitted rise across the samples must clear both the noise (in standard errors) and this
# fraction of the median latency, or the data is called flat.
_FLAT_SIGMAS = 3.0
_FLAT_FRACTION = 0.01
_HUBER_ITERATIONS = 30
_TRIM_ITERATIONS = 5
# A startup sweep whose median sample is further than this from the fitted curve is noise,
# not a measurement (real sweeps here: 2-25% even on a shared, busy CPU; a sweep whose every
# sample is 50% off: 37-67%). Online fits have their own, stricter gate (calibrator).
_MAX_STARTUP_REL_RESIDUAL = 0.30
# A latency further than this factor from the median usable latency is not a step time (real
# steps span about 1e3 between a decode and the longest chunk).
_MAX_LATENCY_SPREAD = 1e6
# When less than this fraction of the (scaled) ``x^2`` column is left after projecting out
# the other columns, the rows do not tell d apart from a and c: d is held at 0.
_D_MIN_SEPARATION = 0.05
_N_COLUMNS = 5
_D_COLUMN = 4


@dataclass(frozen=True)
class FitResult:
    """Outcome of one fit: the model when ``ok``, otherwise a one-sentence ``reason``."""

    ok: bool
    model: LatencyModel | None
    reason: str
    r2: float
    rel_residual: float
    n_samples: int
    n_used: int
    n_rejected: int
    n_outliers: int

    def to_dict(self) -> dict:
        out = asdict(self)
        out["model"] = self.model.to_dict() if self.model is not None else None
        # JSON has no NaN; None keeps saved profiles and reports portable.
        for key in ("r2", "rel_residual"):
            if not math.isfinite(out[key]):
                out[key] = None
        return out


def fit_startup(
    sizes: Sequence[float], latencies_ms: Sequence[float], *, min_samples: int = MIN_SAMPLES
) -> FitResult:
    """Fit ``c + b*x + a*x^2`` to single-request prefills at ``L = 0`` (``gamma``, ``d`` stay 0).
    """
    x = _as_1d(sizes, "sizes")
    y = _as_1d(latencies_ms, "latencies_ms")
    if x.shape != y.shape:
        raise ValueError(f"{x.size} sizes but {y.size} latencies")
    with np.errstate(over="ignore", invalid="ignore"):
        features = np.column_stack([np.ones_like(x), np.zeros_like(x), x, x * x,
                                    np.zeros_like(x)])
    return _fit(features, y, min_samples=min_samples, startup=True)


def fit_rows(
    features: np.ndarray, latencies_ms: Sequence[float], *, min_samples: int = MIN_SAMPLES
) -> FitResult:
    """Fit ``[c, gamma, b, a, d]`` to rows ``[1, sum L, sum x, sum(2Lx + x^2), sum x^2]`` -> ms.

    A column that is zero in every usable row (e.g. no step had a cached prefix) cannot be
    estimated; its coefficient is fixed at 0 rather than failing the whole fit. Rows of four
    columns (no ``sum x^2``) fit a model with ``d = 0``.
    """
    X = np.asarray(features, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] not in (4, _N_COLUMNS):
        raise ValueError(f"features must have shape (n, 5) or (n, 4), got {X.shape}")
    if X.shape[1] == 4:
        X = np.column_stack([X, np.zeros(X.shape[0])])
    y = _as_1d(latencies_ms, "latencies_ms")
    if X.shape[0] != y.size:
        raise ValueError(f"{X.shape[0]} feature rows but {y.size} latencies")
    return _fit(X, y, min_samples=min_samples, startup=False)


def fitted_columns(X: np.ndarray, exclude: tuple[int, ...] = ()) -> np.ndarray:
    """Which coefficients a fit of these rows estimates (the rest are held at 0)."""
    X = np.asarray(X, dtype=np.float64)
    # Columns with no signal at all are fixed at zero instead of making the system singular.
    free = np.any(X != 0, axis=0)
    free[0] = True
    for col in exclude:
        free[col] = False
    if X.shape[1] > _D_COLUMN and free[_D_COLUMN]:
        others = free.copy()
        others[_D_COLUMN] = False
        Xo = X[:, others]
        Xo = Xo / np.max(np.abs(Xo), axis=0)
        col = X[:, _D_COLUMN] / np.max(np.abs(X[:, _D_COLUMN]))
        with np.errstate(all="ignore"):
            coef, *_ = np.linalg.lstsq(Xo, col, rcond=None)
            left = float(np.linalg.norm(col - Xo @ coef) / np.linalg.norm(col))
        if not left >= _D_MIN_SEPARATION:
            free[_D_COLUMN] = False
    return free


def _as_1d(values: Sequence[float], name: str) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a sequence of numbers") from exc
    return arr


def _failure(reason: str, n_samples: int, n_used: int, n_rejected: int, n_outliers: int = 0,
             r2: float = math.nan, rel_residual: float = math.nan) -> FitResult:
    return FitResult(ok=False, model=None, reason=reason, r2=r2, rel_residual=rel_residual,
                     n_samples=n_samples, n_used=n_used, n_rejected=n_rejected,
                     n_outliers=n_outliers)


def _fit(X: np.ndarray, y: np.ndarray, *, min_samples: int, startup: bool) -> FitResult:
    n_samples = int(y.size)
    what = "samples" if startup else "rows"
    # A row is unusable when its latency cannot be a real step time or its features are
    # not finite non-negative work counts.
    usable = np.isfinite(y) & (y > 0) & np.all(np.isfinite(X), axis=1) & np.all(X >= 0, axis=1)
    if startup:
        # A sweep sample is a forward of at least one token.
        usable &= X[:, 2] >= 1
    if np.any(usable):
        mid = float(np.median(y[usable]))
        usable &= (y >= mid / _MAX_LATENCY_SPREAD) & (y <= mid * _MAX_LATENCY_SPREAD)
    n_rejected = int(n_samples - np.count_nonzero(usable))
    X = X[usable]
    y = y[usable]
    n = int(y.size)
    min_samples = max(int(min_samples), 1)
    if n < min_samples:
        return _failure(f"only {n} usable {what}, need at least {min_samples}",
                        n_samples, n, n_rejected)

    masks = [fitted_columns(X)]
    if not startup:
        alt = _d_instead_of_gamma(X, masks[0])
        if alt is not None:
            masks.append(alt)
    fits = [_fit_masked(X, y, free, min_samples=min_samples, startup=startup,
                        n_samples=n_samples, n_rejected=n_rejected) for free in masks]
    good = [f for f in fits if f.ok]
    if not good:
        return fits[0]
    return min(good, key=lambda f: f.rel_residual)


def _d_instead_of_gamma(X: np.ndarray, free: np.ndarray) -> np.ndarray | None:
    """The columns with ``d`` fitted and ``gamma`` held at 0, when ``d`` was held at 0 only
    because ``gamma`` made it inseparable (one chunk size at many prefixes: ``gamma*L`` and
    ``2aLx`` are then the same column, and the prefix slope may belong to either)."""
    if free[_D_COLUMN] or not free[1]:
        return None
    alt = fitted_columns(X, exclude=(1,))
    return alt if alt[_D_COLUMN] else None


def _fit_masked(X: np.ndarray, y: np.ndarray, free: np.ndarray, *, min_samples: int,
                startup: bool, n_samples: int, n_rejected: int) -> FitResult:
    what = "samples" if startup else "rows"
    n = int(y.size)
    n_free = int(np.count_nonzero(free))
    if startup:
        distinct = int(np.unique(X[:, 2]).size)
        if distinct < 3:
            return _failure(f"only {distinct} distinct sizes, need at least 3 to fit a, b and c",
                            n_samples, n, n_rejected)
    scale = np.where(free, np.max(np.abs(X), axis=0), 1.0)
    Xs = X[:, free] / scale[free]
    if not startup:
        rank = int(np.linalg.matrix_rank(Xs))
        if rank < n_free:
            return _failure(
                f"the step shapes do not pin down the model (design rank {rank} < {n_free})",
                n_samples, n, n_rejected)

    if np.ptp(y) == 0:
        return _failure("latency is identical in every sample: it does not grow with size",
                        n_samples, n, n_rejected)
    # How much work each row carries, in one number: used only to detect falling data.
    work = Xs[:, 1:].sum(axis=1)
    if np.ptp(work) > 0:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rho = float(spearmanr(work, y).statistic)
        if math.isfinite(rho) and rho <= _FALLING_RHO:
            noun = "size" if startup else "work per step"
            return _failure(f"latency falls as {noun} grows (Spearman rho = {rho:.2f}); "
                            "the timings are not usable", n_samples, n, n_rejected)

    # Latencies in units of their median keep every square in the solver far from overflow.
    y_unit = float(np.median(y))
    y = y / y_unit
    # c and every work coefficient are bounded below by zero: a negative per-step overhead
    # or a negative cost per token has no physical meaning.
    lower = np.zeros(n_free)
    try:
        with np.errstate(all="ignore"):
            beta_s, inliers = _robust_solve(Xs, y, lower)
    except (np.linalg.LinAlgError, ValueError) as exc:
        return _failure(f"the least-squares solve failed ({exc})", n_samples, n, n_rejected)
    if not np.all(np.isfinite(beta_s)):
        return _failure("the least-squares solve did not converge to finite coefficients",
                        n_samples, n, n_rejected)
    n_used = int(np.count_nonzero(inliers))
    n_outliers = n - n_used
    if n_used < min_samples:
        return _failure(f"only {n_used} {what} left after dropping {n_outliers} outliers, "
                        f"need at least {min_samples}", n_samples, n_used, n_rejected, n_outliers)

    coef = np.zeros(_N_COLUMNS)
    coef[free] = beta_s / scale[free] * y_unit
    Xi = Xs[inliers]
    yi = y[inliers]
    with np.errstate(all="ignore"):
        yhat = Xi @ beta_s
        rel_residual = float(np.median(np.abs(yi - yhat) / yi))
        ss_tot = float(np.sum((yi - yi.mean()) ** 2))
        r2 = 1.0 - float(np.sum((yi - yhat) ** 2)) / ss_tot if ss_tot > 0 else math.nan

    if not np.any(coef[1:]):
        names = "a = b = 0" if startup else "a = b = gamma = 0"
        return _failure(f"latency does not grow with size (the fit found {names})",
                        n_samples, n_used, n_rejected, n_outliers, r2, rel_residual)

    try:
        with np.errstate(all="ignore"):
            rise, rise_se = _rise_and_error(Xi, yi, beta_s)
    except (np.linalg.LinAlgError, ValueError):
        rise, rise_se = 0.0, math.inf
    threshold = max(_FLAT_SIGMAS * rise_se, _FLAT_FRACTION * float(np.median(yi)))
    if not rise > threshold:
        noun = "size" if startup else "the work per step"
        return _failure(f"latency barely grows with {noun}: the fitted rise across the {what} is "
                        f"{rise * y_unit:.3g} ms, within the noise ({threshold * y_unit:.3g} ms)",
                        n_samples, n_used, n_rejected, n_outliers, r2, rel_residual)
    if not np.all(np.isfinite(coef)):
        return _failure("the fitted coefficients are not finite", n_samples, n_used,
                        n_rejected, n_outliers, r2, rel_residual)

    if startup and not rel_residual <= _MAX_STARTUP_REL_RESIDUAL:
        return _failure(f"the timings are too noisy: the median sample is {rel_residual:.0%} off "
                        f"the fitted curve (at most {_MAX_STARTUP_REL_RESIDUAL:.0%} allowed)",
                        n_samples, n_used, n_rejected, n_outliers, r2, rel_residual)

    model = LatencyModel.from_vector(coef)
    return FitResult(ok=True, model=model, reason="", r2=r2, rel_residual=rel_residual,
                     n_samples=n_samples, n_used=n_used, n_rejected=n_rejected,
                     n_outliers=n_outliers)


def _weighted_bvls(Xs: np.ndarray, y: np.ndarray, row_weight: np.ndarray,
                   lower: np.ndarray) -> np.ndarray:
    A = Xs * row_weight[:, None]
    rhs = y * row_weight
    # LAPACK given an infinity or NaN can print an error and then never return.
    if not (np.all(np.isfinite(A)) and np.all(np.isfinite(rhs))):
        raise ValueError("the weighted system is not finite")
    result = lsq_linear(A, rhs, bounds=(lower, np.full(lower.shape, np.inf)), method="bvls")
    return np.asarray(result.x, dtype=np.float64)


def _relative_residuals(Xs: np.ndarray, y: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray,
                                                                                     np.ndarray]:
    yhat = Xs @ beta
    # A fit that predicts ~0 for a row would turn any residual there into infinity.
    denom = np.maximum(yhat, 1e-6 * float(np.max(y)))
    return (y - yhat) / denom, denom


def _robust_scale(r: np.ndarray) -> float:
    mad = float(np.median(np.abs(r - np.median(r))))
    return max(1.4826 * mad, _MIN_REL_SCALE)


def _robust_solve(Xs: np.ndarray, y: np.ndarray, lower: np.ndarray) -> tuple[np.ndarray,
                                                                             np.ndarray]:
    """Huber IRLS then MAD trimming; returns scaled coefficients and the inlier mask."""
    beta = _weighted_bvls(Xs, y, 1.0 / y, lower)
    for _ in range(_HUBER_ITERATIONS):
        r, denom = _relative_residuals(Xs, y, beta)
        s = _robust_scale(r)
        u = np.abs(r) / (_HUBER_K * s)
        huber = np.where(u <= 1.0, 1.0, 1.0 / np.maximum(u, 1e-300))
        new = _weighted_bvls(Xs, y, np.sqrt(huber) / denom, lower)
        done = np.allclose(new, beta, rtol=1e-7, atol=1e-12)
        beta = new
        if done:
            break

    inliers = np.ones(y.size, dtype=bool)
    for step in range(_TRIM_ITERATIONS):
        r, denom = _relative_residuals(Xs, y, beta)
        s = _robust_scale(r[inliers])
        keep = np.abs(r) <= _OUTLIER_SIGMAS * s
        # Too few rows left to determine the coefficients: keep the Huber estimate.
        if np.count_nonzero(keep) < Xs.shape[1]:
            break
        if step > 0 and np.array_equal(keep, inliers):
            break
        inliers = keep
        beta = _weighted_bvls(Xs[inliers], y[inliers], 1.0 / denom[inliers], lower)
    return beta, inliers


def _rise_and_error(Xs: np.ndarray, y: np.ndarray, beta: np.ndarray) -> tuple[float, float]:
    """Fitted latency rise from the lightest to the heaviest row, and its standard error."""
    variable = Xs[:, 1:] @ beta[1:]
    g = Xs[int(np.argmax(variable))] - Xs[int(np.argmin(variable))]
    rise = float(g @ beta)
    yhat = Xs @ beta
    denom = np.maximum(yhat, 1e-6 * float(np.max(y)))
    rel = (y - yhat) / denom
    dof = max(y.size - Xs.shape[1], 1)
    sigma = math.sqrt(float(np.sum(rel**2)) / dof)
    A = Xs / denom[:, None]
    cov = sigma**2 * np.linalg.pinv(A.T @ A)
    var = float(g @ cov @ g)
    return rise, math.sqrt(max(var, 0.0))

