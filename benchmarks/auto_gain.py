"""Simulated: what the auto target's own forecast expects to gain over CPP base, per queue.

The one-engine A/B (`bench_engine.py --one-engine --same-arrivals`) has never resolved auto
against base with 16k or variable-length prompts at concurrency 2: the rounds spread by more
than the two policies differ. This script asks the forecast how much there is to find. With the
CPU engine's latency model (`meta.coefficients` of an engine_bench JSON, per stage at PP=2) it
takes the queues that A/B makes (lone prompts, two arriving together, prompts with requests
decoding beside them) and, at 0, 5 and 30 ms of host time per dispatch, reports:

- auto's choice (budget 8192, as `cpp-auto-8192`) and its forecast mean time to first token;
- the same forecast for base's own target and budget (`cpp-base-2048`: the cost of a
  2048-token chunk at no history, budget 2048, its default smallest chunk);
- how flat the forecast is: the smallest and largest target, on a fine grid, whose forecast is
  within 1% of the grid's best.

The forecast is `AutoTarget.forecast`, the planner's steps through vLLM's batch queue (at most
`S` batches in flight); tests/unit/test_auto_target.py holds it within 1% of the planner. Every
figure is SIMULATED from the model, not measured.

    python benchmarks/auto_gain.py [--engine-bench benchmarks/results/engine_bench_X.json]
Writes benchmarks/results/auto_gain.json and auto_gain.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vllm_ascend_cpp.config import default_min_chunk  # noqa: E402
from vllm_ascend_cpp.core.auto_target import AutoTarget  # noqa: E402
from vllm_ascend_cpp.core.latency_model import LatencyModel  # noqa: E402
from vllm_ascend_cpp.core.predictor import ChunkSizePredictor  # noqa: E402

AUTO_BUDGET = 8192
BASE_BUDGET = 2048
HOSTS = (0.0, 5.0, 30.0)
FLAT = 0.01
STAGES = 2
DEFAULT_BENCH = ROOT / "benchmarks" / "results" / "engine_bench_auto_vs_base_speed.json"

# (name, queue of (history, remaining), decodes per pipeline phase as (history, count) lists).
# The variable-length prompts are the A/B's own draws (11,144, 16,176 and 22,389 tokens).
CASES: tuple[tuple[str, list[tuple[int, int]], list[list[tuple[int, int]]]], ...] = (
    ("lone 16k", [(0, 16384)], [[]]),
    ("lone 16k, one request decoding", [(0, 16384)], [[(16384, 1)], []]),
    ("two 16k arriving together", [(0, 16384)] * 2, [[]]),
    ("lone 11k", [(0, 11144)], [[]]),
    ("11k and 16k arriving together", [(0, 11144), (0, 16176)], [[]]),
    ("lone 22k, one request decoding", [(0, 22389)], [[(10461, 1)], []]),
    ("lone 4k", [(0, 4096)], [[]]),
    ("four 16k arriving together", [(0, 16384)] * 4, [[]]),
    ("16k, three requests decoding", [(0, 16384)], [[(16384, 2)], [(16384, 1)]]),
)


def model_from(path: Path) -> LatencyModel:
    meta = json.loads(path.read_text())["meta"]
    return LatencyModel.from_dict(meta["coefficients"])


def decode_load(auto: AutoTarget, phases: Sequence[Sequence[tuple[int, int]]]
                ) -> tuple[tuple[float, int], ...]:
    """The forecast's decode cycle: per phase, (cost without c, tokens) of its decodes."""
    return tuple((sum(auto.decode_cost(h, 1) * n for h, n in ph), sum(n for _, n in ph))
                 for ph in phases)


def flat_range(auto: AutoTarget, queue: list[tuple[int, int]], budget: int,
               dec: tuple[tuple[float, int], ...], points: int = 96) -> tuple[float, float, float]:
    """``(lowest, highest, best forecast)`` over targets whose forecast is within FLAT of the
    best, on a geometric grid from a 128-token chunk's cost to a budget-sized chunk's at the
    end of the longest prompt."""
    m = auto.predictor.model
    low = max(m.chunk_cost_ms(0, 128), 1e-3)
    high = max(m.chunk_cost_ms(L + R - min(budget, R), min(budget, R)) for L, R in queue) * 1.5
    ratio = (high / low) ** (1.0 / (points - 1))
    scored = [(auto.forecast(queue, budget, low * ratio ** k, decodes=dec)[0], low * ratio ** k)
              for k in range(points)]
    best = min(v for v, _ in scored)
    near = [t for v, t in scored if v <= best * (1 + FLAT)]
    return min(near), max(near), best


def predictors(model: LatencyModel) -> tuple[ChunkSizePredictor, ChunkSizePredictor]:
    """``(auto, base)`` predictors configured as the bench's cpp-auto-8192 and cpp-base-2048."""
    return (ChunkSizePredictor(model, base_chunk=AUTO_BUDGET,
                               min_chunk=default_min_chunk(AUTO_BUDGET, "auto")),
            ChunkSizePredictor(model, base_chunk=BASE_BUDGET,
                               min_chunk=default_min_chunk(BASE_BUDGET, "base")))


def run(model: LatencyModel, hosts: Sequence[float] = HOSTS,
        cases: Sequence = CASES, stages: int = STAGES) -> list[dict]:
    auto_p, base_p = predictors(model)
    rows = []
    for host in hosts:
        auto = AutoTarget(auto_p, stages, host_ms=host)
        base = AutoTarget(base_p, stages, host_ms=host)
        for name, queue, phases in cases:
            dec = decode_load(auto, phases)
            choice = auto.choose(queue, AUTO_BUDGET, dec)
            auto_ms = auto.forecast(queue, AUTO_BUDGET, choice.target_ms, decodes=dec)[0]
            base_ms = base.forecast(queue, BASE_BUDGET, base_p.target_ms, decodes=dec)[0]
            lo, hi, best = flat_range(auto, queue, AUTO_BUDGET, dec)
            rows.append({"case": name, "host_ms": host, "auto_target_ms": choice.target_ms,
                         "base_target_ms": base_p.target_ms, "auto_forecast_ms": auto_ms,
                         "base_forecast_ms": base_ms, "ratio": auto_ms / base_ms,
                         "flat_low_ms": lo, "flat_high_ms": hi, "grid_best_ms": best})
    return rows


def render(rows: list[dict], source: str, model: LatencyModel) -> str:
    out = ["# What auto's forecast expects to gain over CPP base (SIMULATED)", "",
           "Command: `python benchmarks/auto_gain.py` (model: `meta.coefficients` of "
           f"`{source}`: {model.to_dict()}). Two stages; auto with budget {AUTO_BUDGET}, base "
           f"with budget {BASE_BUDGET} and its own target. Forecast = mean time to first token "
           "over the queue, from now (ms). Flat range: the targets whose forecast is within "
           f"{FLAT:.0%} of the best on a fine grid.", "",
           "| case | host ms per dispatch | auto target | base target | auto forecast | "
           "base forecast | auto / base | targets within 1% of the best |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['case']} | {r['host_ms']:.0f} | {r['auto_target_ms']:.0f} ms | "
                   f"{r['base_target_ms']:.0f} ms | {r['auto_forecast_ms']:.0f} | "
                   f"{r['base_forecast_ms']:.0f} | {r['ratio']:.3f} | "
                   f"{r['flat_low_ms']:.0f} to {r['flat_high_ms']:.0f} ms |")
    worst = max(rows, key=lambda r: r["ratio"])
    best = min(rows, key=lambda r: r["ratio"])
    out += ["", f"Auto / base ranges from {best['ratio']:.3f} ({best['case']}, host "
            f"{best['host_ms']:.0f} ms) to {worst['ratio']:.3f} ({worst['case']}, host "
            f"{worst['host_ms']:.0f} ms)."]
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine-bench", type=Path, default=DEFAULT_BENCH,
                    help="an engine_bench JSON whose meta.coefficients is the model")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "auto_gain")
    args = ap.parse_args(argv)
    model = model_from(args.engine_bench)
    rows = run(model)
    try:
        source = str(args.engine_bench.resolve().relative_to(ROOT))
    except ValueError:
        source = str(args.engine_bench)
    md = render(rows, source, model)
    args.out.with_suffix(".json").write_text(json.dumps(
        {"source": source, "model": model.to_dict(), "rows": rows}, indent=1))
    args.out.with_suffix(".md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
