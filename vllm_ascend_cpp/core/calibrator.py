"""Online recalibration of the latency model from timed serving steps.

Every timed step is a row ``[1, sum L, sum x, sum(2Lx + x^2), sum x^2] -> ms`` in a sliding
window.
Every ``refit_every`` new rows the window is refitted (:func:`fit.fit_rows`), and the fit must
pass gates before it may replace the model in use:

* at least ``min_rows`` rows and ``min_distinct`` distinct step shapes;
* condition number of the column-scaled design at most ``max_condition``, over the columns
  the fit estimates (``d`` is held at 0 when the window cannot tell it from ``a``); otherwise
  the data cannot tell the coefficients apart, e.g. a window of decodes only, where
  ``sum(2Lx + x^2) = 2 sum L + sum x`` exactly);
* a successful constrained fit (``a, b, gamma, d >= 0``) with median relative residual at most
  ``max_rel_residual``;
* it predicts the window better than the model in use (median relative error).

A refit that fails its gates counts as failed only while the model in use also mispredicts
the window (error above ``max_rel_residual``): a good model needs no replacement, so a boring
window must not end calibration. After ``max_failed_fits`` consecutive failed fits the
calibrator gives up (one ``"gave_up"`` event; the caller falls back to fixed chunks). It keeps
collecting rows and tries again once per window-full of new rows; a passing fit then emits
``"reenabled"``. Every call does a bounded amount of work; nothing blocks or loops on data.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .fit import fit_rows, fitted_columns
from .latency_model import COEFFICIENT_NAMES, LatencyModel

__all__ = ["CalibrationEvent", "OnlineCalibrator"]


@dataclass(frozen=True)
class CalibrationEvent:
    """Outcome of one refit attempt.

    ``kind`` is ``"accepted"`` (``model`` replaces the one in use), ``"rejected"`` (keep the
    model in use; ``reason`` says why), ``"gave_up"`` (stop using a model; emitted once) or
    ``"reenabled"`` (``model`` is usable again after giving up).
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


class OnlineCalibrator:
    """Sliding-window refits with quality gates; see the module docstring."""

    def __init__(self, *, window: int = 256, min_rows: int = 16, min_distinct: int = 6,
                 refit_every: int = 8, max_condition: float = 1e4,
                 max_rel_residual: float = 0.15, max_failed_fits: int = 8) -> None:
        if window < 1 or min_rows < 1 or min_distinct < 1 or refit_every < 1:
            raise ValueError("window, min_rows, min_distinct and refit_every must be >= 1")
        if max_failed_fits < 1:
            raise ValueError(f"max_failed_fits must be >= 1, got {max_failed_fits}")
        if not max_condition > 0 or not max_rel_residual > 0:
            raise ValueError("max_condition and max_rel_residual must be > 0")
        self.window = int(window)
        self.min_rows = min(int(min_rows), self.window)
        self.min_distinct = int(min_distinct)
        self.refit_every = int(refit_every)
        self.max_condition = float(max_condition)
        self.max_rel_residual = float(max_rel_residual)
        self.max_failed_fits = int(max_failed_fits)
        self._rows: deque[np.ndarray] = deque(maxlen=self.window)
        self._ms: deque[float] = deque(maxlen=self.window)
        self._new_rows = 0
        self.failed_fits = 0
        self.accepted_fits = 0
        self.rejected_rows = 0
        self.attempts = 0
        self.gave_up = False

    @property
    def n_rows(self) -> int:
        return len(self._ms)

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
        """The current window as ``(rows, ms)`` arrays (copies)."""
        if not self._ms:
            return np.zeros((0, len(COEFFICIENT_NAMES))), np.zeros(0)
        return np.vstack(self._rows), np.fromiter(self._ms, dtype=np.float64)

    def prediction_error(self, model: LatencyModel) -> float:
        """Median ``|predicted - measured| / measured`` over the window; NaN if empty."""
        X, y = self.window_arrays()
        return _median_rel_error(X, y, model)

    def _due(self) -> bool:
        if self.n_rows < self.min_rows:
            return False
        every = self.window if self.gave_up else self.refit_every
        return self._new_rows >= every

    def maybe_refit(self, current: LatencyModel | None) -> CalibrationEvent | None:
        """Refit when enough new rows arrived; None when no attempt was made."""
        if not self._due():
            return None
        self._new_rows = 0
        self.attempts += 1
        X, y = self.window_arrays()
        candidate, rel, problem = self._gated_fit(X, y)
        current_err = _median_rel_error(X, y, current) if current is not None else math.inf

        if candidate is not None:
            self.failed_fits = 0
            new_err = _median_rel_error(X, y, candidate)
            if self.gave_up:
                self.gave_up = False
                self.accepted_fits += 1
                return self._emit("reenabled", f"a refit passed every gate "
                                  f"(median error {new_err:.1%})", candidate, rel)
            if current is None or new_err < current_err:
                self.accepted_fits += 1
                was = "" if current is None else f" vs {current_err:.1%} for the model in use"
                return self._emit("accepted", f"median error {new_err:.1%}{was}", candidate, rel)
            return self._emit("rejected", f"the model in use predicts the window better "
                              f"({current_err:.1%} vs {new_err:.1%})", None, rel)

        if not self.gave_up and current_err <= self.max_rel_residual:
            # The model in use still fits what we see: nothing to replace, nothing failed.
            self.failed_fits = 0
            return self._emit("rejected", f"{problem}; the model in use still predicts within "
                              f"{current_err:.1%}", None, rel)
        self.failed_fits += 1
        if not self.gave_up and self.failed_fits >= self.max_failed_fits:
            self.gave_up = True
            return self._emit("gave_up", f"{self.failed_fits} refits in a row failed, last: "
                              f"{problem}", None, rel)
        return self._emit("rejected", problem, None, rel)

    def _emit(self, kind: str, reason: str, model: LatencyModel | None,
              rel: float) -> CalibrationEvent:
        return CalibrationEvent(kind=kind, reason=reason, model=model, rel_residual=rel,
                                failed_fits=self.failed_fits)

    def _gated_fit(self, X: np.ndarray, y: np.ndarray) -> tuple[LatencyModel | None, float,
                                                                str]:
        distinct = int(np.unique(X, axis=0).shape[0])
        if distinct < self.min_distinct:
            return None, math.nan, (f"only {distinct} distinct step shapes in the window, "
                                    f"need {self.min_distinct}")
        cond = scaled_condition(X[:, fitted_columns(X)])
        if cond > self.max_condition:
            return None, math.nan, (f"the window cannot separate the coefficients "
                                    f"(condition number {cond:.3g} > {self.max_condition:.3g})")
        fit = fit_rows(X, y, min_samples=self.min_rows)
        if not fit.ok or fit.model is None:
            return None, fit.rel_residual, f"fit rejected: {fit.reason}"
        if not fit.rel_residual <= self.max_rel_residual:
            return None, fit.rel_residual, (f"median relative residual {fit.rel_residual:.1%} "
                                            f"exceeds {self.max_rel_residual:.0%}")
        if not fit.model.is_physical:
            return None, fit.rel_residual, "fit has a negative coefficient"
        return fit.model, fit.rel_residual, ""
