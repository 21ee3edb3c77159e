"""Test-only fault injection. OFF unless the env var VLLM_CPP_TEST_FAULT is set.

Documented as a testing hook (docs/troubleshooting.md); operators never set it. Values:

- `sweep_raise`: every worker raises inside the startup sweep.
- `sweep_nan`, `sweep_inf`, `sweep_zero`, `sweep_negative`: every sweep latency becomes that.
- `sweep_flat`: every sweep latency is the same number.
- `sweep_noisy`: each sweep latency is multiplied by a random factor in [0.5, 1.5].
- `sweep_falling`: latencies fall as the chunk grows (a fit would need a negative slope).
- `calib_noise`: measured step times become random, so no online fit passes its gates.
"""

from __future__ import annotations

import os
import random

ENV = "VLLM_CPP_TEST_FAULT"
KNOWN = (
    "sweep_raise", "sweep_nan", "sweep_inf", "sweep_zero", "sweep_negative",
    "sweep_flat", "sweep_noisy", "sweep_falling", "calib_noise",
)


def active() -> str | None:
    value = os.environ.get(ENV, "").strip()
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
        rng = random.Random(0)
        return [x * rng.uniform(0.5, 1.5) for x in latencies_ms]
    if fault == "sweep_falling":
        top = max(sizes)
        return [1.0 + 50.0 * (top - n) / top for n in sizes]
    return latencies_ms


def measured_step_ms(ms: float) -> float:
    if active() == "calib_noise":
        return random.uniform(0.1, 10.0) * ms
    return ms
