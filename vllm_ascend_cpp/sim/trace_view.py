"""A real run's ``trace_file`` read back as a pipeline timeline and a summary.

The trace has one line per scheduled step with its prefill chunks, decode count, predicted
milliseconds and, for timed steps, the measured forward time of the last stage. Each step is
given the measured time when there is one (else the predicted time) on every stage and placed
by the pipeline rule: stage ``s`` takes it after stage ``s-1`` has finished it and after
finishing the step before; at most ``pp_size`` steps are in flight (vLLM's batch queue), and no
step starts earlier than its wall-clock completion minus its pipeline traversal, so idle gaps
in the real run stay gaps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .timeline import StepSpan, Timeline, cv, pipeline_spans

__all__ = ["trace_timeline", "trace_summary"]


def _num(v: object) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return math.nan


def _step_ms(line: dict) -> float:
    measured = _num(line.get("measured_ms"))
    if math.isfinite(measured) and measured > 0:
        return measured
    predicted = _num(line.get("predicted_ms"))
    return predicted if math.isfinite(predicted) and predicted > 0 else 0.0


def trace_timeline(lines: Sequence[dict], stages: int) -> Timeline:
    """Reconstruct the per-stage timeline of a trace (see the module docstring)."""
    if stages < 1:
        raise ValueError(f"stages must be >= 1, got {stages}")
    steps = [ln for ln in lines if isinstance(ln, dict)]
    stage_ms = [_step_ms(ln) for ln in steps]
    times = [_num(ln.get("time")) for ln in steps]
    ready = None
    if steps and all(math.isfinite(t) for t in times):
        t0 = min(times) * 1000.0 - stages * (stage_ms[0] if stage_ms else 0.0)
        ready = [max(0.0, t * 1000.0 - t0 - stages * ms) for t, ms in zip(times, stage_ms)]
    spans = pipeline_spans(stage_ms, stages, ready, max_in_flight=stages)
    tl = Timeline(stages)
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for k, (ln, ms, (starts, ends)) in enumerate(zip(steps, stage_ms, spans)):
        items: list[tuple[str, int, int, bool]] = []
        for r in ln.get("requests") or []:
            if not isinstance(r, dict):
                continue
            rid = str(r.get("id"))
            items.append((rid, int(r.get("history") or 0), int(r.get("chunk") or 0), True))
            first.setdefault(rid, starts[0])
            last[rid] = ends[-1]
        decodes = int(ln.get("decodes") or 0)
        if decodes:
            items.append(("decodes", 0, decodes, False))
        step_no = ln.get("step")
        tl.steps.append(StepSpan(int(step_no) if isinstance(step_no, int) else k + 1, items,
                                 ms, starts, ends, _num(ln.get("predicted_ms"))))
    # Arrival times are not in the trace: a request's window runs from its first chunk to
    # the end of its last one.
    tl.prefill_windows = [(first[r], last[r]) for r in first]
    return tl


def trace_summary(lines: Sequence[dict], stages: int) -> dict:
    """Steps, prefill chunks per request, prediction error, prefill CV and bubbles."""
    tl = trace_timeline(lines, stages)
    steps = [ln for ln in lines if isinstance(ln, dict)]
    errors = []
    measured_prefill = []
    for ln in steps:
        meas = _num(ln.get("measured_ms"))
        pred = _num(ln.get("predicted_ms"))
        if math.isfinite(meas) and meas > 0:
            if math.isfinite(pred):
                errors.append(abs(pred - meas) / meas)
            if ln.get("requests"):
                measured_prefill.append(meas)
    chunks: dict[str, list[tuple[int, int]]] = {}
    for ln in steps:
        for r in ln.get("requests") or []:
            if isinstance(r, dict):
                chunks.setdefault(str(r.get("id")), []).append(
                    (int(r.get("history") or 0), int(r.get("chunk") or 0)))
    states: dict[str, int] = {}
    for ln in steps:
        states[str(ln.get("state"))] = states.get(str(ln.get("state")), 0) + 1

    def clean(v: float) -> float | None:
        return round(v, 4) if math.isfinite(v) else None

    return {
        "stages": stages,
        "steps": len(steps),
        "prefill_steps": sum(1 for ln in steps if ln.get("requests")),
        "timed_steps": sum(1 for ln in steps if math.isfinite(_num(ln.get("measured_ms")))),
        "states": states,
        "requests": {rid: {"chunks": [c for _, c in cs], "first_history": cs[0][0],
                           "tokens": sum(c for _, c in cs)} for rid, cs in chunks.items()},
        "median_prediction_error": clean(float(np.median(errors))) if errors else None,
        "prefill_step_cv_measured": clean(cv(measured_prefill)),
        "prefill_step_cv": clean(tl.prefill_step_cv()),
        "bubble_fraction": clean(tl.bubble_fraction()),
        "span_ms": clean(tl.end_ms),
    }
