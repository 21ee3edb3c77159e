"""Memory kept by the plugin's own code over a run, measured with tracemalloc.

The soak's check (test_soak.py): run warm, then count the bytes still held at the end that
were allocated by a line in `vllm_ascend_cpp` after the start. A leak of L bytes per
scheduler step grows that by L x steps; the check allows half of a 1 KiB-per-step leak, so
such a leak fails it while bounded state (calibration windows, the pending-step map, trace
buffers) fits well inside. Imported by engine_job.py (run as a script: a sibling module) and
by the tests.
"""

from __future__ import annotations

import os
import tracemalloc
from collections.abc import Callable
from typing import Any

LEAK_PER_STEP = 1024  # bytes: the smallest per-step leak the check must catch
PACKAGE = "vllm_ascend_cpp"


def bound(steps: int) -> float:
    """Growth allowed over `steps` scheduler steps: half of a 1 KiB-per-step leak."""
    return steps * LEAK_PER_STEP / 2


def _ours() -> tracemalloc.Filter:
    import vllm_ascend_cpp

    root = os.path.dirname(os.path.abspath(vllm_ascend_cpp.__file__))
    return tracemalloc.Filter(True, os.path.join(root, "*"))


class PackageGrowth:
    """start() after warm-up, stop() at the end: `figures` holds the growth and its top lines.

    Started here, tracemalloc sees only allocations from then on (the warm-up costs nothing);
    the start snapshot still anchors the comparison in case it was already tracing.
    """

    def __init__(self, steps: Callable[[], int]) -> None:
        self._steps = steps
        self._started_here = False
        self._start: Any = None
        self._step0 = 0
        self.figures: dict[str, Any] = {}

    def start(self) -> None:
        if not tracemalloc.is_tracing():
            tracemalloc.start()
            self._started_here = True
        self._step0 = self._steps()
        self._start = tracemalloc.take_snapshot().filter_traces([_ours()])

    def stop(self) -> dict[str, Any]:
        end = tracemalloc.take_snapshot().filter_traces([_ours()])
        steps = self._steps() - self._step0
        if self._started_here:
            tracemalloc.stop()
        diff = end.compare_to(self._start, "lineno")
        growth = sum(d.size_diff for d in diff)
        top = [{"line": f"{d.traceback[0].filename.rsplit(PACKAGE, 1)[-1]}:"
                        f"{d.traceback[0].lineno}", "bytes": d.size_diff, "count": d.count_diff}
               for d in diff[:8] if d.size_diff]
        self.figures = {"steps": steps, "growth_bytes": growth, "bound_bytes": bound(steps),
                        "top": top}
        return self.figures
