"""The soak benchmark's calibration figures, from made-up traces with known errors."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import soak  # noqa: E402


def _line(step: int, prefill: bool, predicted: float, measured: float | None) -> dict:
    return {"step": step, "state": "ready", "requests": [{"id": "r", "history": 0,
                                                          "chunk": 512}] if prefill else [],
            "predicted_ms": predicted, "measured_ms": measured}


def test_second_half_errors_are_split_into_prefill_and_decode_only_steps() -> None:
    # First half: large errors that must not count. Second half: prefill steps 10% off,
    # decode-only steps 50% off, one untimed step of each.
    first = [_line(i, i % 2 == 0, 200.0, 100.0) for i in range(8)]
    second = [_line(8 + i, i % 2 == 0, 110.0 if i % 2 == 0 else 3.0,
                    100.0 if i % 2 == 0 else 2.0) for i in range(6)]
    second += [_line(14, True, 50.0, None), _line(15, False, 2.0, None)]
    cal = soak.calibration_figures(first + second)
    kinds = cal["by_kind_second_half"]
    assert kinds["with_prefill"]["steps"] == 3 and kinds["decode_only"]["steps"] == 3
    assert abs(kinds["with_prefill"]["pred_error_p90"] - 0.10) < 1e-9
    assert abs(kinds["decode_only"]["pred_error_median"] - 0.50) < 1e-9
    assert cal["timed_steps_second_half"] == 6
    row = soak._by_kind_row(cal)
    assert row == ["| the same, steps with prefill work; decode-only steps | "
                   "10.0% / 10.0% over 3; 50.0% / 50.0% over 3 |"]
    # A run saved before the split renders without the row.
    assert soak._by_kind_row({k: v for k, v in cal.items() if k != "by_kind_second_half"}) == []
