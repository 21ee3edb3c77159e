"""Chunk sizing: how many prompt tokens a prefill should run next so its step costs the target.

With the latency model ``t(L, x) = c + gamma*L + b*x + a*(2Lx + x^2) + d*x^2`` a chunk of
``x`` tokens after ``L`` cached ones costs ``T`` (``c`` excluded, it is paid by every step
alike) when

    (a + d)*x^2 + (2aL + b)*x = T - gamma*L.

The target ``T`` defaults to what the base chunk costs at ``L = 0`` (``b*base + (a + d)*base^2``),
so every chunk of a long prompt costs what its first one did. See
:meth:`ChunkSizePredictor.next_chunk` for the clamps applied to the raw root and the order they
run in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .latency_model import LatencyModel

__all__ = ["ChunkDecision", "PlannedChunk", "ChunkSizePredictor", "OVER_TARGET",
           "TAIL_FOLD_TOLERANCE"]

# A short tail is folded into the current chunk when the merged chunk costs at most this much
# more than the time budget: one slightly long step beats an extra step that pays ``c`` again.
TAIL_FOLD_TOLERANCE = 1.10
# Lets a root that is an integer up to rounding (e.g. (b*base)/b) floor to that integer.
_FLOOR_SLACK = 1e-9
_FLOOR_UP = 1.0 + _FLOOR_SLACK
# The clamp :meth:`ChunkSizePredictor.size` reports when no size meets the time (``T - gamma*L``
# is not positive): the chunk is then the smallest one, as it is for a root just above zero.
OVER_TARGET = "over_target"


@dataclass(frozen=True)
class ChunkDecision:
    """The size of one prefill chunk.

    ``fallback`` is True when the fixed chunk ``min(base_chunk, remaining, budget)`` was used
    instead of the model (no usable model); ``reason`` then says why. When no size meets the
    time (``T - gamma*L <= 0``) the chunk is the smallest one, ``clamp`` is ``"over_target"``
    and ``reason`` says so.

    ``clamp`` names the rule that decided the size when it was not the solved size itself:
    ``"over_target"``, ``"min_chunk"``, ``"budget"``, ``"remaining"``, ``"alignment"``
    (rounded up to one aligned unit, or to the whole budget when that is smaller),
    ``"tail_fold"``, ``"tail_split"``, or ``""``; the step planner adds
    ``"decodes_fill_target"``, ``"phase_hold"`` and ``"phase_merge"``.
    """

    chunk: int
    fallback: bool
    reason: str = ""
    clamp: str = ""


@dataclass(frozen=True)
class PlannedChunk:
    """One chunk of a planned prompt; ``predicted_ms`` includes ``c`` (NaN without a model)."""

    history: int
    chunk: int
    predicted_ms: float

    def to_dict(self) -> dict:
        ms = self.predicted_ms if math.isfinite(self.predicted_ms) else None
        return {"history": self.history, "chunk": self.chunk, "predicted_ms": ms}


def _check_int(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            as_int = int(value)
        except (TypeError, ValueError, OverflowError):
            raise TypeError(f"{name} must be an integer, got {value!r}") from None
        if as_int != value:
            raise TypeError(f"{name} must be an integer, got {value!r}")
        value = as_int
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


class ChunkSizePredictor:
    """Sizes prefill chunks from a latency model; immutable (use :meth:`with_model`).

    Without a model, or with one that cannot be used, every decision is the fixed chunk.
    """

    def __init__(
        self,
        model: LatencyModel | None,
        *,
        base_chunk: int,
        smooth_factor: float = 1.0,
        min_chunk: int = 4096,
        block_size: int = 16,
        target_ms: float | None = None,
    ) -> None:
        self.base_chunk = _check_int("base_chunk", base_chunk, 1)
        smooth = float(smooth_factor)
        if not 0.0 < smooth <= 1.0:
            raise ValueError(f"smooth_factor must be in (0, 1], got {smooth_factor!r}")
        self.smooth_factor = smooth
        # A floor above the base chunk would make every chunk larger than the one the target
        # was derived from.
        self.min_chunk = min(_check_int("min_chunk", min_chunk, 0), self.base_chunk)
        self.block_size = _check_int("block_size", block_size, 1)
        # KV blocks fill whole and kernels prefer multiples of 64 tokens.
        self.alignment = max(self.block_size, 64)
        # The chunk a lead prefill still gets when decodes already fill the step's target:
        # min_chunk aligned down, at least one alignment unit.
        self.starved_chunk = max(self.min_chunk - self.min_chunk % self.alignment, self.alignment)
        self.model = model
        # Plain floats for :meth:`root` and :meth:`size`, which run in the hot loops.
        self._base = float(self.base_chunk)
        self._min = float(self.min_chunk)
        if model is not None:
            self._a, self._b, self._g, self._q = model.a, model.b, model.gamma, model.a + model.d
        self._explicit_target = None if target_ms is None else float(target_ms)
        if self._explicit_target is not None:
            self.target_ms: float | None = self._explicit_target
        elif model is not None:
            self.target_ms = model.chunk_cost_ms(0, self.base_chunk)
        else:
            self.target_ms = None
        self.not_ready_reason = self._why_not_ready()
        self.ready = self.not_ready_reason == ""

    def _why_not_ready(self) -> str:
        m = self.model
        if m is None:
            return "no latency model yet"
        if not m.is_physical:
            return (f"the latency model has a negative work coefficient "
                    f"(a={m.a:.3g}, b={m.b:.3g}, gamma={m.gamma:.3g}, d={m.d:.3g})")
        t = self.target_ms
        if t is None or not math.isfinite(t) or t <= 0:
            return f"the target latency is not a positive number ({t!r} ms)"
        return ""

    def __repr__(self) -> str:
        return (f"ChunkSizePredictor(model={self.model!r}, base_chunk={self.base_chunk}, "
                f"smooth_factor={self.smooth_factor}, min_chunk={self.min_chunk}, "
                f"block_size={self.block_size}, target_ms={self.target_ms!r})")

    def with_model(self, model: LatencyModel | None,
                   target_ms: float | None = None) -> ChunkSizePredictor:
        """Same settings, new model; ``target_ms=None`` derives the target from ``model``."""
        return ChunkSizePredictor(model, base_chunk=self.base_chunk,
                                  smooth_factor=self.smooth_factor, min_chunk=self.min_chunk,
                                  block_size=self.block_size, target_ms=target_ms)

    # -- the raw root ---------------------------------------------------------------------

    def solve(self, history: int, time_ms: float | None = None) -> float | None:
        """Positive root ``x`` of ``(a + d)*x^2 + (2aL + b)*x = time_ms - gamma*L``.

        ``time_ms`` defaults to the target. Returns ``None`` without a usable model or when
        ``time_ms - gamma*L <= 0``; ``inf`` when no size reaches the time (``a = b = 0``).
        """
        m = self.model
        if m is None or not m.is_physical:
            return None
        t = self.target_ms if time_ms is None else float(time_ms)
        if t is None:
            return None
        x = self.root(float(history), t)
        return None if x < 0 else x

    def root(self, history: float, time_ms: float) -> float:
        """:meth:`solve` for hot loops: plain floats in and out, -1.0 for "no root".

        Needs a physical model (callers check :attr:`ready` or use :meth:`solve`).
        """
        rest = time_ms - self._g * history
        if not rest > 0:
            return -1.0
        if rest == math.inf:
            return math.inf
        lin = 2.0 * self._a * history + self._b
        quad = self._q
        if quad == 0.0:
            return rest / lin if lin > 0 else math.inf
        # 2R / (B + sqrt(B^2 + 4qR)) is the root without the cancellation that
        # (-B + sqrt(...)) / 2q suffers when 4qR << B^2 (long prefixes, small a).
        denom = lin + math.sqrt(lin * lin + 4.0 * quad * rest)
        if not denom > 0:
            return math.inf
        x = 2.0 * rest / denom
        return x if x == x else -1.0

    # -- one decision ---------------------------------------------------------------------

    def _fixed(self, cap: int, reason: str) -> ChunkDecision:
        return ChunkDecision(min(self.base_chunk, cap), fallback=True, reason=reason)

    def _full(self, history: int, time_ms: float, budget_cap: int) -> tuple[int, str, float]:
        """``(full, clamp, smoothed)``: steps 1-4 of :meth:`next_chunk`. ``full`` does not
        depend on what remains of the prompt."""
        x = self.root(history, time_ms)
        over = x < 0
        if over:
            # No size meets the time: take the size a root of zero would get (the floor), so
            # chunks keep shrinking past this point instead of jumping back to the base size.
            x = 0.0
        if x != math.inf:
            x = self._base + self.smooth_factor * (x - self._base)
        smoothed = x
        clamp = OVER_TARGET if over else ""
        if x < self.min_chunk:
            x = self._min
            clamp = clamp or "min_chunk"
        if x > budget_cap:
            x = budget_cap
            clamp = "budget"
        whole = min(int(x * _FLOOR_UP), budget_cap)
        aligned = whole - whole % self.alignment
        if aligned == 0:
            # Rounding down would stall the request: one aligned unit, or the whole budget
            # when even that does not fit.
            return (min(self.alignment, budget_cap), OVER_TARGET if over else "alignment",
                    smoothed)
        return aligned, clamp, smoothed

    def size(self, history: int, remaining: int, budget_cap: int,
             time_ms: float) -> tuple[int, str]:
        """The sizing rule of :meth:`next_chunk`, lean for hot loops: ``(chunk, clamp)``.

        Plain ints and floats, no checks and no allocation beyond the tuple: needs
        :attr:`ready`, ``history >= 0`` and ``remaining, budget_cap >= 1``. ``clamp`` is
        :data:`OVER_TARGET` when no size meets ``time_ms`` (the chunk is then the floor).
        :meth:`next_chunk` and ``target: auto``'s forecast both size through here.
        """
        full, clamp, smoothed = self._full(history, time_ms, budget_cap)
        if remaining <= full:
            # "remaining" only when the prompt's end, not a floor, decided the size.
            if remaining < full and remaining <= smoothed:
                clamp = "remaining"
            return remaining, clamp
        if remaining - full >= self.min_chunk:
            return full, clamp
        # Folding must keep this chunk no larger than the previous chunk of the prompt. That
        # one was full(L') at L' = L - full(L'); because full does not grow with history it is
        # at least full(L - full(L)), and when L < full(L) there was no such chunk at all.
        back = history - full
        if (remaining <= budget_cap
                and self.model.chunk_cost_ms(history, remaining) <= TAIL_FOLD_TOLERANCE * time_ms
                and (back < 0 or remaining <= self._full(back, time_ms, budget_cap)[0])):
            return remaining, "tail_fold"
        half = -(-remaining // 2)
        half = -(-half // self.alignment) * self.alignment
        if half < full:
            return half, "tail_split"
        return full, clamp

    def next_chunk(self, history: int, remaining: int, budget: int | None = None,
                   time_ms: float | None = None) -> ChunkDecision:
        """Size of the next chunk of a prefill with ``history`` cached and ``remaining`` to go.

        Order of operations (``T`` = ``time_ms``, default the target; ``A`` = ``alignment``):

        1. ``x`` = :meth:`solve` at ``T``. No usable model: return the fixed chunk
           ``min(base_chunk, remaining, budget)`` with ``fallback=True``. No root
           (``T - gamma*L <= 0``, every size goes over): ``x = 0``, so the floors below decide
           (``clamp="over_target"``). A step past that point cannot meet ``T``; the smallest
           chunk keeps it closest, as a root just above zero would.
        2. Smoothing: ``x = base + s*(x - base)``.
        3. Minimum: ``x = max(x, min_chunk)`` (``min_chunk`` is already clamped to the base).
        4. Budget: ``x = min(x, budget)``; then align down to a multiple of ``A``. If that
           gives 0, use ``A`` (or the whole budget when ``budget < A``) so the request always
           progresses. Call the result ``full``.
        5. Remaining: if ``remaining <= full`` the chunk is ``remaining`` (the last one).
        6. Tail rule, when ``0 < remaining - full < min_chunk``: fold the tail into this chunk
           (chunk = ``remaining``) if ``remaining <= budget``, the merged chunk costs at most
           ``1.10 * T``, and it is no larger than ``full`` at history ``L - full`` (a lower
           bound on the chunk before this one, so chunks never grow); otherwise split what is
           left in two, this chunk being the half rounded up to ``A`` so the last is no larger
           (if that half is not below ``full``, the chunk stays ``full``).

        Invariants: ``1 <= chunk <= min(remaining, budget)`` whenever both are >= 1 (0
        otherwise); every chunk that leaves something behind is a multiple of ``A`` unless
        ``budget < A`` (then it is ``budget``) or it is the fixed fallback chunk; for a fixed
        ``T`` and budget, successive chunks of one prompt never grow, past
        ``T - gamma*L <= 0`` included.

        The rule itself is :meth:`size`; this method checks its input and says why.
        """
        history = int(history)
        remaining = int(remaining)
        if history < 0:
            raise ValueError(f"history must be >= 0, got {history}")
        if remaining < 0:
            raise ValueError(f"remaining must be >= 0, got {remaining}")
        # Without a budget only the prompt itself bounds the chunk.
        budget_cap = remaining if budget is None else max(int(budget), 0)
        cap = min(remaining, budget_cap)
        if cap <= 0:
            what = "remaining" if remaining <= 0 else "budget"
            return ChunkDecision(0, fallback=False, clamp=what)
        if not self.ready:
            return self._fixed(cap, self.not_ready_reason)
        t = self.target_ms if time_ms is None else float(time_ms)
        chunk, clamp = self.size(history, remaining, budget_cap, t)
        if clamp != OVER_TARGET:
            return ChunkDecision(chunk, fallback=False, clamp=clamp)
        gamma_l = self.model.gamma * float(history)
        return ChunkDecision(chunk, fallback=False, clamp=clamp,
                             reason=f"no chunk size meets {t:.4g} ms at history {history} "
                                    f"(gamma*L alone is {gamma_l:.4g} ms): the smallest chunk")

    # -- a whole prompt -------------------------------------------------------------------

    def plan(self, prompt_len: int, *, budget: int, history: int = 0) -> list[PlannedChunk]:
        """Chunks for a prompt of ``prompt_len`` tokens run alone with ``budget`` tokens/step."""
        prompt_len = _check_int("prompt_len", prompt_len, 0)
        budget = _check_int("budget", budget, 1)
        history = _check_int("history", history, 0)
        out: list[PlannedChunk] = []
        remaining = prompt_len
        while remaining > 0:
            chunk = self.next_chunk(history, remaining, budget).chunk
            ms = self.model.request_ms(history, chunk) if self.model is not None else math.nan
            out.append(PlannedChunk(history=history, chunk=chunk, predicted_ms=ms))
            history += chunk
            remaining -= chunk
        return out
