"""Online recalibration of the latency model from timed serving steps.

Every timed step is a row ``[1, sum L, sum x, sum(2Lx + x^2), sum x^2] -> ms`` in a sliding
window: prefill chunks with decodes riding along, several prefills in one step, decode-only
steps, all alike. The startup sweep's samples are kept as **anchor rows** (single prefills at
``L = 0``): serving alone often produces steps of one cost (that is what the planner aims
for), from which ``c`` cannot be told apart from the work terms; the anchors pin ``c``, ``b``
and ``a + d``, and the online rows add ``gamma`` and the split between ``a`` and ``d``.

A refit is due after ``early_rows`` online rows (4 with anchors, ``min_rows`` without) and then
every ``refit_every`` new rows (every few rows while the window is short). Two candidates are
fitted (:func:`fit.fit_rows`): the window with the anchors, and the window alone when it
identifies every coefficient by itself (so hardware that drifted away from the sweep is
followed). The window-alone fit wins only when it predicts the online rows clearly better (a
fifth less median error): it knows nothing of step sizes serving has not made, the anchors
span the sweep's. A candidate must pass gates, all judged on the **online rows** (the anchors can
neither help a candidate pass nor make it fail):

* enough rows and distinct step shapes, and a column-scaled design whose condition number is
  at most ``max_condition`` over the columns the fit estimates (``d`` is held at 0 when the
  rows cannot tell it from ``a``);
* a successful constrained fit (``a, b, gamma, d >= 0``, latency that grows with the work);
* median relative error on the online rows within the tolerance, which starts wide
  (``early_rel_residual``) and tightens linearly to ``max_rel_residual`` as the window fills:
  a few rows cannot show much, a full window must agree with the model;
* nine steps in ten within 100% of the fit (random timings can be fitted within a wide median
  tolerance by a model that is merely the right size, but not this). No gate compares the fit
  with a constant: the planner makes steps of equal cost, so a constant predicts them well by
  design, and a busy host that slows every step must still be followed;
* it predicts the online rows better than the model in use.

Timings that are noisy but honest (a busy host, contention that comes and goes) still pass:
the tolerance bounds the median error, not each step. Random timings, or a window that mixes
two machines, do not. A failed refit counts against calibration only while the model in use
is grossly wrong too (median error above ``early_rel_residual``): a model that is as good as
the timings allow is kept, since no fit and no fixed chunk would do better. After
``max_failed_fits`` such refits in a row the calibrator gives up (one ``"gave_up"`` event) and
empties its window of online rows. It keeps collecting the rows the caller still times and,
once a quarter window of them is in, retries on those alone every ``refit_every`` new rows; a
passing fit emits ``"reenabled"``.
With no model in use at all (a rejected or missing startup fit), the first passing fit emits
``"rescued"``. Every call does a bounded amount of work; nothing blocks or loops on data.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .fit import fit_rows, fitted_columns
from .latency_model import COEFFICIENT_NAMES, LatencyModel

__all__ = ["CalibrationEvent", "OnlineCalibrator", "scaled_condition"]

# With anchors, c, b and a + d are known before serving starts: this many online rows are
# enough for a first refit (the anchors carry the rest).
_ANCHORED_EARLY_ROWS = 4
# At most this relative error on nine steps in ten: honest noise (contention spikes that
# double a step now and then) stays far below it; random numbers do not.
_MAX_P90_ERROR = 1.0
# Rows a fit must keep after dropping outliers: one more than the coefficients.
_MIN_FIT_ROWS = 6
# A fit of the window alone replaces the anchored fit only when its median error on the
# online rows is at most this fraction of the anchored fit's. Choosing on the smaller error
# alone, the CPU engine took a window-alone fit 58 times in one run (often 0.1 point better);
# fitted to 1-2K-token steps, one priced a 5,888-token step at 84 ms where the sweep had
# measured 220 ms, and target auto planned 6K-token steps that ran 250-650 ms.
_WINDOW_ALONE_GAIN = 0.8


@dataclass(frozen=True)
class CalibrationEvent:
    """Outcome of one refit attempt.

    ``kind`` is ``"accepted"`` (``model`` replaces the one in use), ``"rejected"`` (keep the
    model in use; ``reason`` says why), ``"gave_up"`` (stop using a model; emitted once),
    ``"reenabled"`` (``model`` is usable again after giving up) or ``"rescued"`` (``model`` is
    the first usable one, after a startup sweep that gave none).
    """

    kind: str
    reason: str
    model: LatencyModel | None
    rel_residual: float
    failed_fits: int

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "reason": self.reason,
            "model": self.model.to_dict() if self.model is not None else None,
            "rel_residual": self.rel_residual if math.isfinite(self.rel_residual) else None,
            "failed_fits": self.failed_fits,
        }


def _median_rel_error(X: np.ndarray, y: np.ndarray, model: LatencyModel) -> float:
    if y.size == 0:
        return math.nan
    pred = X @ model.as_vector()
    return float(np.median(np.abs(pred - y) / y))


def _p90_rel_error(X: np.ndarray, y: np.ndarray, model: LatencyModel) -> float:
    return float(np.quantile(np.abs(X @ model.as_vector() - y) / y, 0.9))


def scaled_condition(X: np.ndarray) -> float:
    """Condition number of ``X`` with all-zero columns dropped and the rest scaled to max 1."""
    keep = np.any(X != 0, axis=0)
    Xk = X[:, keep]
    if Xk.shape[1] == 0:
        return math.inf
    Xs = Xk / np.max(np.abs(Xk), axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        cond = float(np.linalg.cond(Xs))
    return cond if math.isfinite(cond) else math.inf


@dataclass(frozen=True)
class _Candidate:
    model: LatencyModel | None
    error: float  # median relative error on the online rows
    problem: str
    source: str  # "anchored" or "online"


class OnlineCalibrator:
    """Sliding-window refits with anchors and quality gates; see the module docstring."""

    def __init__(self, *, window: int = 256, min_rows: int = 12, min_distinct: int = 6,
                 refit_every: int = 8, max_condition: float = 1e4,
                 max_rel_residual: float = 0.20, early_rel_residual: float = 0.35,
                 max_failed_fits: int = 8) -> None:
        if window < 1 or min_rows < 1 or min_distinct < 1 or refit_every < 1:
            raise ValueError("window, min_rows, min_distinct and refit_every must be >= 1")
        if max_failed_fits < 1:
            raise ValueError(f"max_failed_fits must be >= 1, got {max_failed_fits}")
        if not max_condition > 0 or not max_rel_residual > 0:
            raise ValueError("max_condition and max_rel_residual must be > 0")
        if not early_rel_residual >= max_rel_residual:
            raise ValueError("early_rel_residual must be at least max_rel_residual")
        self.window = int(window)
        self.min_rows = min(int(min_rows), self.window)
        self.min_distinct = int(min_distinct)
        self.refit_every = int(refit_every)
        self.max_condition = float(max_condition)
        self.max_rel_residual = float(max_rel_residual)
        self.early_rel_residual = float(early_rel_residual)
        self.max_failed_fits = int(max_failed_fits)
        self._rows: deque[np.ndarray] = deque(maxlen=self.window)
        self._ms: deque[float] = deque(maxlen=self.window)
        self._anchor_X = np.zeros((0, len(COEFFICIENT_NAMES)))
        self._anchor_y = np.zeros(0)
        self._new_rows = 0
        self.failed_fits = 0
        self.accepted_fits = 0
        self.rejected_rows = 0
        self.attempts = 0
        self.gave_up = False
        # Which rows the model in use came from: "anchored", "online" or "" (none yet).
        self.basis = ""

    @property
    def n_rows(self) -> int:
        return len(self._ms)

    @property
    def n_anchors(self) -> int:
        return int(self._anchor_y.size)

    def set_anchors(self, sizes: Sequence[float], latencies_ms: Sequence[float]) -> int:
        """Keep the startup sweep's single prefills (``L = 0``) as anchor rows; returns how
        many were usable (unusable samples are dropped, as the startup fit drops them)."""
        x = np.asarray(list(sizes), dtype=np.float64).reshape(-1)
        y = np.asarray(list(latencies_ms), dtype=np.float64).reshape(-1)
        if x.shape != y.shape:
            raise ValueError(f"{x.size} sizes but {y.size} latencies")
        ok = np.isfinite(x) & (x > 0) & np.isfinite(y) & (y > 0)
        x, y = x[ok], y[ok]
        self._anchor_X = np.column_stack([np.ones_like(x), np.zeros_like(x), x, x * x, x * x])
        self._anchor_y = y
        return int(y.size)

    def add(self, items: Sequence[tuple[int, int]], measured_ms: float) -> bool:
        """Store one timed step; False (and counted) when it cannot be a real measurement."""
        try:
            ms = float(measured_ms)
        except (TypeError, ValueError):
            ms = math.nan
        if not items or not math.isfinite(ms) or ms <= 0:
            self.rejected_rows += 1
            return False
        row = LatencyModel.step_features(items)
        if not np.all(np.isfinite(row)) or np.any(row < 0):
            self.rejected_rows += 1
            return False
        self._rows.append(row)
        self._ms.append(ms)
        self._new_rows += 1
        return True

    def window_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The current window of online rows as ``(rows, ms)`` arrays (copies)."""
        if not self._ms:
            return np.zeros((0, len(COEFFICIENT_NAMES))), np.zeros(0)
        return np.vstack(self._rows), np.fromiter(self._ms, dtype=np.float64)

    def prediction_error(self, model: LatencyModel) -> float:
        """Median ``|predicted - measured| / measured`` over the window; NaN if empty."""
        X, y = self.window_arrays()
        return _median_rel_error(X, y, model)

    def tolerance(self, n_rows: int | None = None) -> float:
        """The median relative error a refit may have with ``n_rows`` online rows: wide for a
        short window, ``max_rel_residual`` for a full one."""
        n = self.n_rows if n_rows is None else int(n_rows)
        fill = min(max(n / self.window, 0.0), 1.0)
        return self.early_rel_residual - (self.early_rel_residual - self.max_rel_residual) * fill

    @property
    def retry_rows(self) -> int:
        """Online rows, timed since a give-up, before the first retry: a quarter window, so
        that a few lucky rows of timings that stay erratic cannot bring the model back."""
        return max(self.min_rows, self.window // 4)

    @property
    def early_rows(self) -> int:
        """Online rows before the first refit."""
        if self.n_anchors:
            return min(_ANCHORED_EARLY_ROWS, self.min_rows)
        return self.min_rows

    def _due(self) -> bool:
        if self.n_rows < self.early_rows:
            return False
        if self.gave_up and self.n_rows < self.retry_rows:
            return False
        # Refit often while the window is short (each row changes a lot), then settle.
        every = min(self.refit_every, max(2, self.n_rows // 4))
        return self._new_rows >= every or self.attempts == 0

    def maybe_refit(self, current: LatencyModel | None) -> CalibrationEvent | None:
        """Refit when enough new rows arrived; None when no attempt was made."""
        if not self._due():
            return None
        self._new_rows = 0
        self.attempts += 1
        X, y = self.window_arrays()
        tol = self.tolerance(y.size)
        best, problem = self._best_candidate(X, y, tol)
        current_err = _median_rel_error(X, y, current) if current is not None else math.inf

        if best is not None and best.model is not None:
            if self.gave_up or current is None:
                kind = "rescued" if current is None else "reenabled"
                self.gave_up = False
                return self._accept(kind, f"a refit passed every gate (median error "
                                    f"{best.error:.1%}, tolerance {tol:.0%})", best)
            if best.error < current_err:
                return self._accept("accepted", f"median error {best.error:.1%} vs "
                                    f"{current_err:.1%} for the model in use", best)
            self.failed_fits = 0
            return self._emit("rejected", f"the model in use predicts the window better "
                              f"({current_err:.1%} vs {best.error:.1%})", None, best.error)

        if not self.gave_up and current_err <= self.early_rel_residual:
            # The model in use is not grossly wrong: timings this noisy (a busy host) cannot
            # be predicted better by any fit, and fixed chunks would not be any less noisy.
            self.failed_fits = 0
            return self._emit("rejected", f"{problem}; the model in use still predicts within "
                              f"{current_err:.1%}", None, math.nan)
        self.failed_fits += 1
        if not self.gave_up and self.failed_fits >= self.max_failed_fits:
            self.gave_up = True
            # The window is what failed: kept, it would outvote the rows of a quieter time
            # for a whole window (thousands of steps at the fallback's timing rate). Retries
            # fit the rows timed since, from `retry_rows` on.
            self._rows.clear()
            self._ms.clear()
            self._new_rows = 0
            off = (f" while the model in use was {current_err:.0%} off"
                   if current is not None else "")
            return self._emit("gave_up", f"{self.failed_fits} refits in a row failed{off}, "
                              f"last: {problem}", None, math.nan)
        return self._emit("rejected", problem, None, math.nan)

    def _accept(self, kind: str, reason: str, best: _Candidate) -> CalibrationEvent:
        self.failed_fits = 0
        self.accepted_fits += 1
        self.basis = best.source
        return self._emit(kind, f"{reason}; {best.source} fit", best.model, best.error)

    def _emit(self, kind: str, reason: str, model: LatencyModel | None,
              rel: float) -> CalibrationEvent:
        return CalibrationEvent(kind=kind, reason=reason, model=model, rel_residual=rel,
                                failed_fits=self.failed_fits)

    def _best_candidate(self, X: np.ndarray, y: np.ndarray,
                        tol: float) -> tuple[_Candidate | None, str]:
        """The passing candidate with the smallest online error, or None and why not."""
        tried: list[_Candidate] = []
        if self.n_anchors:
            XA = np.vstack([X, self._anchor_X])
            yA = np.concatenate([y, self._anchor_y])
            tried.append(self._gated_fit(XA, yA, X, y, tol, "anchored",
                                         min_rows=self.early_rows, min_distinct=2))
        if y.size >= self.min_rows:
            tried.append(self._gated_fit(X, y, X, y, tol, "online", min_rows=self.min_rows,
                                         min_distinct=self.min_distinct))
        passing = [c for c in tried if c.model is not None]
        if passing:
            best = min(passing, key=lambda c: c.error)
            anchored = next((c for c in passing if c.source == "anchored"), None)
            if anchored is not None and best is not anchored \
                    and not best.error < _WINDOW_ALONE_GAIN * anchored.error:
                # Fitted to the window alone, a model agrees with the steps serving made and
                # extrapolates freely past them; the anchors span the sweep's sizes. Only a
                # clear gain (a host that drifted away from the sweep) is worth that.
                return anchored, ""
            return best, ""
        if not tried:
            return None, f"only {y.size} rows in the window, need {self.min_rows}"
        return None, "; ".join(c.problem for c in tried)

    def _gated_fit(self, XF: np.ndarray, yF: np.ndarray, X: np.ndarray, y: np.ndarray,
                   tol: float, source: str, *, min_rows: int,
                   min_distinct: int) -> _Candidate:
        def no(problem: str, error: float = math.nan) -> _Candidate:
            return _Candidate(None, error, f"{source}: {problem}", source)

        if y.size < min_rows:
            return no(f"only {y.size} rows, need {min_rows}")
        distinct = int(np.unique(X, axis=0).shape[0])
        if distinct < min_distinct:
            return no(f"only {distinct} distinct step shapes, need {min_distinct}")
        cond = scaled_condition(XF[:, fitted_columns(XF)])
        if cond > self.max_condition:
            return no(f"the rows cannot separate the coefficients (condition number "
                      f"{cond:.3g} > {self.max_condition:.3g})")
        # The robust fit may drop outliers; enough rows must stay for five coefficients.
        fit = fit_rows(XF, yF, min_samples=min(_MIN_FIT_ROWS, min_rows))
        if not fit.ok or fit.model is None:
            return no(f"fit rejected: {fit.reason}")
        if not fit.model.is_physical:
            return no("fit has a negative coefficient")
        error = _median_rel_error(X, y, fit.model)
        if not error <= tol:
            return no(f"median error {error:.1%} on the online rows exceeds {tol:.0%}", error)
        p90 = _p90_rel_error(X, y, fit.model)
        if not p90 <= _MAX_P90_ERROR:
            return no(f"one step in ten is more than {p90:.0%} off the fit: the timings are "
                      f"not a measurement of the work", error)
        return _Candidate(fit.model, error, "", source)
