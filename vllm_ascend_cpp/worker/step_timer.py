"""Time the forward of the steps the scheduler marked, on every worker.

Only marked steps are timed, so unmarked steps run exactly as without CPP: no device
synchronize, no extra work beyond one attribute read. The clock starts after this stage has
received the previous stage's activations, so it measures this stage's forward and not its
wait in the pipeline. Each timed step costs one device synchronize before and one after the
forward, on every worker.

Every worker keeps its times in a small ring buffer, keyed by the step number the scheduler
put on the step; the engine fetches them every few timed steps by name
(:func:`drain_stage_times` behind ``cpp_stage_times``). The last stage also puts its time on
the step's ModelRunnerOutput, which reaches the engine at once.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from vllm_ascend_cpp import compat, faults

_INSTALLED = "_cpp_step_timer"
# Far more than the engine leaves between two fetches; older times are dropped, never grown.
_RING = 1024
_times: deque[tuple[int, float]] = deque(maxlen=_RING)
_lock = threading.Lock()


def record_stage_time(step: int, ms: float) -> None:
    with _lock:
        _times.append((int(step), float(ms)))


def drain_stage_times() -> list[list[float]]:
    """The times recorded since the last call, oldest first, as ``[[step, ms], ...]``."""
    with _lock:
        out = [[s, round(ms, 4)] for s, ms in _times]
        _times.clear()
    return out


def install_step_timer(runner: Any) -> bool:
    """Wrap `runner.execute_model` / `runner.sample_tokens` on this instance (idempotent)."""
    if getattr(runner, _INSTALLED, False):
        return False
    execute_model = runner.execute_model
    sample_tokens = getattr(runner, "sample_tokens", None)
    _, sync = compat.device_synchronize_fn()
    fault = faults.step_ms_filter()
    pending: list[float] = []

    def timed_execute_model(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        mark = getattr(scheduler_output, compat.TIME_STEP_ATTR, False)
        if not mark:
            return execute_model(scheduler_output, *args, **kwargs)
        intermediate = args[0] if args else kwargs.get("intermediate_tensors")
        compat.wait_for_pipeline_input(intermediate)
        sync()
        start = time.perf_counter()
        out = execute_model(scheduler_output, *args, **kwargs)
        sync()
        ms = (time.perf_counter() - start) * 1000.0
        if fault is not None:
            ms = fault(ms)
        if not isinstance(mark, bool):
            record_stage_time(int(mark), ms)
        if out is not None and hasattr(out, "req_ids"):
            return compat.attach_step_ms(out, ms)  # no separate sampling call follows
        pending.clear()
        pending.append(ms)
        return out

    timed_execute_model.__wrapped__ = execute_model  # type: ignore[attr-defined]
    runner.execute_model = timed_execute_model

    if sample_tokens is not None:

        def timed_sample_tokens(*args: Any, **kwargs: Any) -> Any:
            out = sample_tokens(*args, **kwargs)
            if pending:
                out = compat.attach_step_ms(out, pending.pop())
            return out

        timed_sample_tokens.__wrapped__ = sample_tokens  # type: ignore[attr-defined]
        runner.sample_tokens = timed_sample_tokens
    setattr(runner, _INSTALLED, True)
    return True
