"""How fast the engine runs now, against the model in use: one factor on every prediction.

A refit describes the window it came from, and at one timed step in 16 that window spans
thousands of steps. A host whose speed drifts (other tenants, thermal limits, a busy CPU
engine) then runs some percent off the model for long stretches, all in one direction: the
300-request soak predicted 9% low over its second half. The refit gates rightly keep such a
model (no fit of the whole window does better), so the drift is followed here: the median of
``measured / predicted`` over the last few timed steps scales every coefficient.

The factor leaves a ``base`` plan unchanged (the target is the model's own step cost, so it
scales with every step) and moves what is compared with wall time: the auto target's host time
per step, and the predictions in the trace and the error figures. It is bounded, so a burst of
spikes cannot turn a model upside down; the refits stay in charge of the shape.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable

__all__ = ["SpeedFactor"]


class SpeedFactor:
    """Median of recent ``measured / predicted`` ratios, applied once it moves past a dead band.

    ``window`` recent ratios, none used before ``min_steps`` are in; the value changes only when
    the median differs from it by more than ``deadband`` (relative), so the predictor is not
    rebuilt for noise; it stays within ``bounds``.
    """

    def __init__(self, *, window: int = 16, min_steps: int = 4, deadband: float = 0.03,
                 bounds: tuple[float, float] = (0.5, 2.0)) -> None:
        if window < 1 or not 1 <= min_steps <= window:
            raise ValueError(f"need window >= 1 and 1 <= min_steps <= window, got "
                             f"{window} and {min_steps}")
        lo, hi = bounds
        if not 0 < lo <= 1 <= hi or not deadband >= 0:
            raise ValueError(f"need 0 < low <= 1 <= high and deadband >= 0, got {bounds} "
                             f"and {deadband}")
        self.min_steps = int(min_steps)
        self.deadband = float(deadband)
        self.bounds = (float(lo), float(hi))
        self._logs: deque[float] = deque(maxlen=int(window))
        self.value = 1.0

    @property
    def n(self) -> int:
        return len(self._logs)

    def reset(self, ratios: Iterable[float] = ()) -> None:
        """Start over (a new model in use), seeded with ``measured / predicted`` ratios of that
        model on the latest timed steps, oldest first; the value is what they say."""
        self._logs.clear()
        self.value = 1.0
        for r in ratios:
            self._push(r)
        self._settle(force=True)

    def observe(self, measured_ms: float, predicted_ms: float) -> bool:
        """Add one timed step (the unscaled model's prediction); True when the value changed."""
        try:
            ratio = float(measured_ms) / float(predicted_ms)
        except (TypeError, ValueError, ZeroDivisionError):
            return False
        if not self._push(ratio):
            return False
        return self._settle(force=False)

    def _push(self, ratio: float) -> bool:
        try:
            r = float(ratio)
        except (TypeError, ValueError):
            return False
        if not (math.isfinite(r) and r > 0):
            return False
        self._logs.append(math.log(r))
        return True

    def _settle(self, *, force: bool) -> bool:
        if len(self._logs) < self.min_steps:
            return False
        lo, hi = self.bounds
        new = min(hi, max(lo, math.exp(statistics.median(self._logs))))
        if not force and abs(new / self.value - 1.0) <= self.deadband:
            return False
        changed = new != self.value
        self.value = new
        return changed
