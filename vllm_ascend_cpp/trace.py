"""`trace_file`: one JSON line per scheduled step, for tests, benchmarks and plots.

Each line: step number, wall time, CPP state, the scheduled requests with `history` and
`chunk`, the decode count with the decodes' summed cached tokens (`decode_history`) and new
tokens (`decode_tokens`; the count, unless a decode runs speculative tokens), the step cost
the plan aimed at (`target_ms`, the per-step constant included; null without a plan), the
planned budget and prefill cap, the predicted step time, when the step was timed,
`measured_ms` (the slowest stage's forward, the planning basis) and `stage_ms` (every
pipeline stage's forward, stage 0 first; null where only the last stage's time is known),
and (with online calibration) the refit attempts and consecutive failed fits so far; `event`
(with `state_after`) on the step whose timing triggered a refit; `preempted` lists the
requests vLLM preempted for the step, when there were any. `plan_matched` says whether vLLM
scheduled exactly the planned requests and tokens (null on steps CPP did not plan); on a
mismatch `mismatch` gives the reason as far as the step shows it, `predicted_ms` is the
model's prediction for what actually ran, and `plan_predicted_ms` the plan's own. Lines are
written in step order; a timed step's line waits until its stage times are in (a few steps).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, TextIO


class TraceWriter:
    def __init__(self, path: str) -> None:
        path = os.path.expanduser(path)
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        # Line-buffered: a reader (a test, `vllm-cpp report`) sees whole steps as they land.
        self._fh: TextIO | None = open(path, "a", buffering=1, encoding="utf-8")
        self.path = path

    def write_step(self, rec: Any, measured_ms: float | None, manager: Any) -> None:
        self.write_line(self.line_for(rec, measured_ms, manager))

    def write_line(self, line: dict) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps(line) + "\n")

    def line_for(self, rec: Any, measured_ms: float | None, manager: Any) -> dict:
        plan = rec.plan
        prefills = [
            {"id": rid, "history": h, "chunk": n} for rid, h, n, pre in rec.items if pre
        ]
        decodes = [(h, n) for _, h, n, pre in rec.items if not pre]
        line = {
            "step": rec.step,
            "time": round(time.time(), 6),
            "state": rec.state,
            "requests": prefills,
            "decodes": len(decodes),
            # The decodes' cached tokens and new tokens, summed: with them a timed step is a
            # whole regression row (a decode is the x = 1 case of the latency model), so a
            # trace can be refitted from every timed step as the engine's own fit is.
            "decode_history": sum(h for h, _ in decodes),
            "decode_tokens": sum(n for _, n in decodes),
            "num_tokens": sum(n for _, _, n, _ in rec.items),
            # The step cost the plan aimed at (c included), for measured/target comparisons.
            "target_ms": _finite(plan.target_ms) if plan is not None else None,
            "planned_budget": plan.token_budget if plan is not None else None,
            "prefill_cap": plan.prefill_cap if plan is not None else None,
            "predicted_ms": _finite(plan.predicted_ms) if plan is not None else None,
            "measured_ms": _finite(measured_ms),
        }
        matched = getattr(rec, "matched", None)
        line["plan_matched"] = matched
        if matched is False:
            line["mismatch"] = rec.mismatch
            line["plan_predicted_ms"] = line["predicted_ms"]
        if getattr(rec, "preempted", ()):
            # Preempted requests are recomputed later, often from a prefix-cache hit.
            line["preempted"] = list(rec.preempted)
        cal = getattr(manager, "calibrator", None)
        if cal is not None:
            # Refit attempts and consecutive failures so far: bounded retries are visible.
            line["fit_attempts"] = cal.attempts
            line["failed_fits"] = cal.failed_fits
        if (plan is None or matched is False) and manager.model is not None:
            pairs = [(h, n) for _, h, n, _ in rec.items]
            line["predicted_ms"] = _finite(manager.predict_ms(pairs))
        return line

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _finite(x: float | None) -> float | None:
    if x is None or x != x or x in (float("inf"), float("-inf")):
        return None
    return round(float(x), 4)


def read_trace(path: str) -> list[dict]:
    with open(os.path.expanduser(path), encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
