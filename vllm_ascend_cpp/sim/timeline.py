"""A pipeline timeline (which step ran on which stage when) and the figures read from it.

Shared by the simulator and by ``vllm-cpp report --trace``: both end up with steps that each
occupy every stage once, in order, and ask the same questions of them (per-step latency CV in
the prefill phase, bubble fraction, the Gantt chart).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["StepSpan", "Timeline", "pipeline_spans", "merge_intervals", "cv"]


@dataclass
class StepSpan:
    """One step: its items and, per stage, when it started and ended (ms)."""

    step: int
    items: list[tuple[str, int, int, bool]]  # (req_id, history, tokens, is_prefill)
    stage_ms: float
    starts: list[float]
    ends: list[float]
    predicted_ms: float = math.nan

    @property
    def has_prefill(self) -> bool:
        return any(pre for *_, pre in self.items)

    @property
    def lead(self) -> str | None:
        """The request that owns most of the step's prefill tokens (None: decode only)."""
        best, best_n = None, 0
        for rid, _, n, pre in self.items:
            if pre and n > best_n:
                best, best_n = rid, n
        return best

    def to_dict(self) -> dict:
        return {"step": self.step, "stage_ms": round(self.stage_ms, 4),
                "start_ms": [round(s, 4) for s in self.starts],
                "end_ms": [round(e, 4) for e in self.ends],
                "items": [{"id": r, "history": h, "tokens": n, "prefill": p}
                          for r, h, n, p in self.items]}


@dataclass
class Timeline:
    stages: int
    steps: list[StepSpan] = field(default_factory=list)
    # Windows in which some request waited for its first token: bubbles inside them cost TTFT.
    prefill_windows: list[tuple[float, float]] = field(default_factory=list)

    @property
    def end_ms(self) -> float:
        return max((s.ends[-1] for s in self.steps), default=0.0)

    def prefill_step_cv(self) -> float:
        return cv([s.stage_ms for s in self.steps if s.has_prefill])

    def bubble_fraction(self) -> float:
        """Idle share of stage time while some prefill is pending (NaN when there is none).

        Inside each prefill window (from a request's arrival to its first token), every stage
        should be busy; whatever is not, pipeline fill and drain included, is a bubble.
        """
        windows = merge_intervals(self.prefill_windows)
        total = sum(b - a for a, b in windows)
        if total <= 0:
            return math.nan
        idle = 0.0
        for s in range(self.stages):
            busy = merge_intervals((st.starts[s], st.ends[s]) for st in self.steps)
            idle += total - _overlap(windows, busy)
        return max(0.0, idle / (self.stages * total))

    def to_dict(self, limit: int | None = None) -> dict:
        steps = self.steps if limit is None else self.steps[:limit]
        return {"stages": self.stages, "steps": [s.to_dict() for s in steps],
                "prefill_windows": [[round(a, 4), round(b, 4)]
                                    for a, b in merge_intervals(self.prefill_windows)]}


def pipeline_spans(stage_ms: Sequence[float], stages: int,
                   ready_ms: Sequence[float] | None = None,
                   max_in_flight: int | None = None) -> list[tuple[list[float], list[float]]]:
    """Per step, per stage ``(starts, ends)`` for steps that run back to back.

    A step occupies stage ``s`` once stage ``s-1`` has finished it and stage ``s`` has finished
    the previous step; it enters stage 0 no earlier than ``ready_ms`` (when given) and, with
    ``max_in_flight`` (vLLM's batch queue holds ``pp_size``), not before the step that many
    places earlier has left the last stage.
    """
    free = [0.0] * stages
    out: list[tuple[list[float], list[float]]] = []
    for k, t in enumerate(stage_ms):
        t = float(t) if math.isfinite(float(t)) and float(t) > 0 else 0.0
        begin = 0.0 if ready_ms is None else float(ready_ms[k])
        if max_in_flight is not None and k >= max_in_flight:
            begin = max(begin, out[k - max_in_flight][1][-1])
        starts: list[float] = []
        ends: list[float] = []
        prev_end = begin
        for s in range(stages):
            start = max(prev_end, free[s])
            end = start + t
            starts.append(start)
            ends.append(end)
            free[s] = end
            prev_end = end
        out.append((starts, ends))
    return out


def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    items = sorted((float(a), float(b)) for a, b in intervals if b > a)
    merged: list[tuple[float, float]] = []
    for a, b in items:
        if merged and a <= merged[-1][1]:
            if b > merged[-1][1]:
                merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return merged


def _overlap(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    """Total length of the intersection of two sorted, merged interval lists."""
    i = j = 0
    total = 0.0
    while i < len(xs) and j < len(ys):
        a = max(xs[i][0], ys[j][0])
        b = min(xs[i][1], ys[j][1])
        if b > a:
            total += b - a
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def cv(values: Sequence[float]) -> float:
    """Coefficient of variation (population std / mean); NaN for fewer than two values."""
    vals = [float(v) for v in values if math.isfinite(float(v))]
    if len(vals) < 2:
        return math.nan
    mean = sum(vals) / len(vals)
    if mean <= 0:
        return math.nan
    var = sum((v - mean) ** 2 for v in vals) / len(vals)
    return math.sqrt(var) / mean
