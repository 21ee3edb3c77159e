"""Simulated: finishing prompts in the quieter pipeline phase (planner rule 5), on and off.

Under pipeline parallelism a decode is scheduled again only when its last token is back, S
steps later, so every running decode keeps the phase of the step that finished its prompt.
With the rule off the phase a prompt finishes in is whatever its chunk count makes it; piled
decodes leave every other step without any and the stages idle. This runs the CPU engine's
latency model (`meta.coefficients` of the engine benchmark, 2 stages, 3 ms host time per
step) with closed-loop clients at concurrency 2 and 4, 16K prompts (fixed, and drawn from
[0.5, 1.5] x 16K with three seeds), 128 output tokens, 3 requests per client, under:

- `fixed:1024` (vLLM's budget, the reference),
- CPP base (2048) and auto (8192), each with the rule off, with only the later finish
  (`hold`), and with the earlier finish too (`hold+merge`, what ships).

Figures per case: mean TTFT over fixed-1024's, and throughput (tokens over the makespan) over
fixed-1024's. Every figure is SIMULATED (no timing noise, no new-shape costs), not measured.

    python benchmarks/sim_phase_balance.py
Writes benchmarks/results/sim_phase_balance.json and .md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import vllm_ascend_cpp.core.step_planner as planner_module  # noqa: E402
from vllm_ascend_cpp.core.latency_model import LatencyModel  # noqa: E402
from vllm_ascend_cpp.sim import EngineSpec, Policy, Workload, simulate_policy  # noqa: E402

ENGINE_BENCH = ROOT / "benchmarks/results/engine_bench_auto_vs_base_units2.json"
POLICIES = ("cpp-base:2048", "cpp-auto:8192")
# name -> (rule on, merge limit)
VARIANTS = {"off": (False, 0.0), "hold": (True, 0.0),
            "hold+merge": (True, planner_module.PHASE_MERGE_LIMIT)}
HOST_MS = 3.0


def cases() -> list[tuple[bool, int, int]]:
    """(variable lengths, concurrency, seed)."""
    return [(False, c, 0) for c in (2, 4)] + [(True, c, s) for c in (2, 4) for s in range(3)]


def run(model: LatencyModel) -> dict:
    engine = EngineSpec(stages=2, model=model, sched_ms=HOST_MS)
    rows = []
    merge = planner_module.PHASE_MERGE_LIMIT
    try:
        for variable, conc, seed in cases():
            wl = Workload(concurrency=conc, num_requests=3 * conc, prompt_len=16384,
                          variable=variable, output_len=128, seed=seed)
            ref = simulate_policy(engine, Policy.parse("fixed:1024"), wl)
            for pol in POLICIES:
                for name, (on, limit) in VARIANTS.items():
                    planner_module.BALANCE_PHASES = on
                    planner_module.PHASE_MERGE_LIMIT = limit
                    r = simulate_policy(engine, Policy.parse(pol), wl)
                    rows.append({"variable": variable, "concurrency": conc, "seed": seed,
                                 "policy": pol, "variant": name, "steps": r.steps,
                                 "ttft_ratio": r.mean_ttft_ms / ref.mean_ttft_ms,
                                 "throughput_ratio": ref.makespan_ms / r.makespan_ms,
                                 "fixed_steps": ref.steps})
    finally:
        planner_module.BALANCE_PHASES = True
        planner_module.PHASE_MERGE_LIMIT = merge
    summary = {}
    for pol in POLICIES:
        for name in VARIANTS:
            sel = [r for r in rows if r["policy"] == pol and r["variant"] == name]
            t = np.array([r["ttft_ratio"] for r in sel])
            q = np.array([r["throughput_ratio"] for r in sel])
            summary[f"{pol} {name}"] = {
                "ttft_gmean": float(np.exp(np.log(t).mean())), "ttft_worst": float(t.max()),
                "throughput_gmean": float(np.exp(np.log(q).mean())),
                "throughput_worst": float(q.min()), "cases": len(sel)}
    return {"model": model.to_dict(), "host_ms": HOST_MS, "rows": rows, "summary": summary}


def markdown(res: dict, command: str) -> str:
    out = ["# Finishing prompts in the quieter pipeline phase (SIMULATED)", "",
           f"Command: `{command}`", "",
           "CPU engine's latency model, 2 stages, 3 ms host per step, closed loop, 16K prompts "
           "(fixed and three draws of [0.5, 1.5] x 16K), 128 output tokens, 3 requests per "
           "client. Ratios against fixed-1024 in the same case: TTFT (lower is better) and "
           "throughput (higher is better). `off`: no phase rule; `hold`: a prompt that would "
           "finish in the busier phase finishes a step later; `hold+merge` (shipped): also a "
           "step early when the rest is cheap.", "",
           "| policy | rule | TTFT / fixed, geo. mean (worst) | throughput / fixed, "
           "geo. mean (worst) |", "|---|---|---|---|"]
    for key, s in res["summary"].items():
        pol, name = key.split(" ")
        out.append(f"| {pol} | {name} | {s['ttft_gmean']:.3f} ({s['ttft_worst']:.3f}) | "
                   f"{s['throughput_gmean']:.3f} ({s['throughput_worst']:.3f}) |")
    out += ["", "Per case (TTFT ratio / throughput ratio, steps; fixed-1024's steps in the "
            "first column):", "",
            "| case | fixed steps | " + " | ".join(f"{p} {v}" for p in POLICIES
                                                  for v in VARIANTS) + " |",
            "|---|---|" + "---|" * (len(POLICIES) * len(VARIANTS))]
    for variable, conc, seed in cases():
        sel = [r for r in res["rows"] if (r["variable"], r["concurrency"], r["seed"])
               == (variable, conc, seed)]
        cells = [f"{r['ttft_ratio']:.3f} / {r['throughput_ratio']:.3f}, {r['steps']}"
                 for r in sel]
        name = f"c{conc} {'var seed ' + str(seed) if variable else '16K'}"
        out.append(f"| {name} | {sel[0]['fixed_steps']} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine-bench", type=Path, default=ENGINE_BENCH,
                    help="engine benchmark JSON whose meta.coefficients is the model")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/sim_phase_balance")
    args = ap.parse_args()
    coef = json.loads(args.engine_bench.read_text())["meta"]["coefficients"]
    model = LatencyModel(**{k: float(v) for k, v in coef.items() if math.isfinite(float(v))})
    res = run(model)
    command = "python benchmarks/sim_phase_balance.py"
    args.out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    args.out.with_suffix(".md").write_text(markdown(res, command))
    print(markdown(res, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
