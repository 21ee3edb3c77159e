"""Test-only fault injection. OFF unless the env var VLLM_CPP_TEST_FAULT is set.

The variable is read once per process (`active`); an unknown name is a startup error
(`config.validate_for_engine` asks first), never a silent no-op.

Documented as a testing hook (docs/troubleshooting.md); operators never set it. Values:

- `sweep_raise`: every worker raises inside the startup sweep.
- `sweep_nan`, `sweep_inf`, `sweep_zero`, `sweep_negative`: every sweep latency becomes that.
- `sweep_flat`: every sweep latency is the same number.
- `sweep_noisy`: every sweep latency is 50% off, alternately too high and too low (a random
  factor would sometimes leave most samples on one side, which a robust fit calls outliers).
- `sweep_falling`: latencies fall as the chunk grows (a fit would need a negative slope).
- `sweep_concave`: latencies rise ever more slowly with the chunk, so an unconstrained
  quadratic fit has a negative `a` (the constrained fit pins `a` at 0).
- `calib_noise`: measured step times become random, so no online fit passes its gates.
- `hot_plan`, `hot_record`, `hot_calibration`, `hot_trace`, `hot_summary`, `hot_stages`: the
  scheduler hook's per-step work raises at that point (planning; recording what vLLM
  scheduled; feeding a timed step to calibration; writing the trace line; the periodic
  summary; pairing timed steps with their per-stage times). With
  `VLLM_CPP_TEST_FAULT_LIMIT=N` (read when the fault fires) it raises only its first N times
  in the process.
- `step_leak_1k`: every scheduler step keeps 1 KiB forever (proves that the soak's memory
  check, tests/integration/test_soak.py, catches a leak of that size).
"""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Callable

ENV = "VLLM_CPP_TEST_FAULT"
KNOWN = (
    "sweep_raise", "sweep_nan", "sweep_inf", "sweep_zero", "sweep_negative",
    "sweep_flat", "sweep_noisy", "sweep_falling", "sweep_concave", "calib_noise",
    "hot_plan", "hot_record", "hot_calibration", "hot_trace", "hot_summary",
    "hot_stages", "step_leak_1k",
)
LIMIT_ENV = "VLLM_CPP_TEST_FAULT_LIMIT"
_hot_raised: dict[str, int] = {}


class InjectedFault(RuntimeError):
    """Raised by the hot-path faults."""


LEAK_BYTES = 1024
# What `step_leak_1k` keeps: module-level, so nothing ever frees it.
_leaked: list[bytes] = []


@functools.cache
def active() -> str | None:
    """The injected fault, or None; ValueError naming the known ones for any other value."""
    value = os.environ.get(ENV, "").strip()
    if value and value not in KNOWN:
        raise ValueError(
            f"[CPP] {ENV}={value!r} is not a known fault; known: {', '.join(KNOWN)}"
        )
    return value or None


def sweep_latencies(sizes: list[int], latencies_ms: list[float]) -> list[float]:
    fault = active()
    if fault == "sweep_raise":
        raise RuntimeError(f"injected fault {ENV}=sweep_raise")
    if fault == "sweep_nan":
        return [float("nan")] * len(latencies_ms)
    if fault == "sweep_inf":
        return [float("inf")] * len(latencies_ms)
    if fault == "sweep_zero":
        return [0.0] * len(latencies_ms)
    if fault == "sweep_negative":
        return [-abs(x) for x in latencies_ms]
    if fault == "sweep_flat":
        return [5.0] * len(latencies_ms)
    if fault == "sweep_noisy":
        return [x * (1.5 if i % 2 == 0 else 0.5) for i, x in enumerate(latencies_ms)]
    if fault == "sweep_falling":
        top = max(sizes)
        return [1.0 + 50.0 * (top - n) / top for n in sizes]
    if fault == "sweep_concave":
        top = max(sizes)
        return [5.0 + 60.0 * (n / top) - 30.0 * (n / top) ** 2 for n in sizes]
    return latencies_ms


def step_ms_filter() -> Callable[[float], float] | None:
    """What a timed step's milliseconds go through, or None: decided once, at timer install."""
    if active() == "calib_noise":
        return lambda ms: random.uniform(0.1, 10.0) * ms
    return None


def hot_path(point: str) -> None:
    """Raise at a per-step point of the scheduler hook when `hot_<point>` is injected."""
    fault = active()
    if fault is None or fault != f"hot_{point}":
        return
    limit = os.environ.get(LIMIT_ENV, "").strip()
    done = _hot_raised.get(fault, 0)
    if limit and done >= int(limit):
        return
    _hot_raised[fault] = done + 1
    raise InjectedFault(f"injected fault {ENV}={fault}")
def _leak_one_step() -> None:
    _leaked.append(bytes(LEAK_BYTES))


def step_hook() -> Callable[[], None] | None:
    """What the runtime calls once per scheduler step, or None: decided once, at start-up."""
    return _leak_one_step if active() == "step_leak_1k" else None
