"""Simulated: how much a deeper pipeline leaves for CPP to win, with the CPU engine's model.

The 2-core test bed runs pipeline parallel 2 only. With two stages, a well-tuned fixed chunk
is already close to the ideal pipeline bound, so the test bed cannot show what CPP does for
deeper pipelines. This script takes the latency model the engine benchmark fitted to what the
real engine served (`meta.coefficients` of an engine_bench JSON, per stage at PP=2), spreads
the same model over S = 2, 4, 8 stages (the work terms a, b, gamma, d scale by 2/S; the
per-step overhead c stays per stage), and for one prompt at a time compares, in the pipeline
simulator (`vllm_ascend_cpp/sim`, which runs the plugin's own planner):

- fixed budgets from 256 to 8192 (the best of them is "tuned fixed"),
- CPP base at prompt/8 and CPP auto at 8192,
- the ideal pipeline bound: the best single-prompt plan of any chunk sizes up to 8192
  (`sim_seed_grid.ideal_bound`: sum of step times + (S - 1) x the longest).

Every figure is SIMULATED (no host time, equal stages), not measured.

    python benchmarks/sim_depth.py [--engine-bench benchmarks/results/engine_bench.json]
Writes benchmarks/results/sim_depth.json and sim_depth.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.sim_seed_grid import ideal_bound  # noqa: E402
from vllm_ascend_cpp.core.latency_model import LatencyModel  # noqa: E402
from vllm_ascend_cpp.sim import EngineSpec, Policy, Workload, simulate_policy  # noqa: E402

FIXED = (256, 512, 1024, 2048, 4096, 8192)
AUTO_BUDGET = 8192
DEPTHS = (2, 4, 8)


def stage_model(c: dict, stages: int) -> LatencyModel:
    k = 2.0 / stages
    return LatencyModel(a=c["a"] * k, b=c["b"] * k, c=c["c"], gamma=c.get("gamma", 0.0) * k,
                        d=c.get("d", 0.0) * k)


def depth_row(coeffs: dict, stages: int, prompt: int) -> dict:
    model = stage_model(coeffs, stages)
    engine = EngineSpec(stages=stages, model=model)
    wl = Workload(concurrency=1, num_requests=2, prompt_len=prompt, output_len=1)
    ttft = {}
    for b in FIXED:
        ttft[f"fixed-{b}"] = simulate_policy(engine, Policy("fixed", b), wl).mean_ttft_ms
    ttft[f"cpp-base-{prompt // 8}"] = simulate_policy(
        engine, Policy("cpp-base", prompt // 8), wl).mean_ttft_ms
    ttft[f"cpp-auto-{AUTO_BUDGET}"] = simulate_policy(
        engine, Policy("cpp-auto", AUTO_BUDGET), wl).mean_ttft_ms
    tuned = min((n for n in ttft if n.startswith("fixed-")), key=ttft.__getitem__)
    bound = ideal_bound(model, prompt, AUTO_BUDGET, stages=stages)
    return {
        "stages": stages, "prompt_len": prompt, "ttft_ms": ttft, "tuned_fixed": tuned,
        "ideal_bound_ms": bound["ttft_ms"], "ideal_plan": bound["plan"],
        "headroom": 1 - bound["ttft_ms"] / ttft[tuned],
        "auto_vs_tuned": ttft[f"cpp-auto-{AUTO_BUDGET}"] / ttft[tuned],
        "base_vs_same_fixed": (ttft[f"cpp-base-{prompt // 8}"] / ttft[f"fixed-{prompt // 8}"]
                               if f"fixed-{prompt // 8}" in ttft else None),
        "auto_vs_bound": ttft[f"cpp-auto-{AUTO_BUDGET}"] / bound["ttft_ms"],
    }


def markdown(rows: list[dict], meta: dict) -> str:
    lines = ["# Simulated: pipeline depth and the room CPP has (not a measurement)", "",
             f"Command: `{meta['command']}`. Model: the engine benchmark's served fit "
             f"(`{meta['source']}`, per stage at PP=2: "
             + ", ".join(f"{k}={v:.4g}" for k, v in meta["coefficients"].items())
             + "), work terms scaled by 2/S for S stages, c per stage unchanged. One prompt at "
             "a time, no host time, equal stages. **Every figure is simulated.**", "",
             "| stages | prompt | tuned fixed | tuned fixed TTFT ms | ideal bound ms | "
             "headroom (1 - bound / tuned) | CPP auto / tuned fixed | CPP auto / bound | "
             "CPP base / fixed, same budget |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base = "-" if r["base_vs_same_fixed"] is None else f"{r['base_vs_same_fixed']:.3f}"
        lines.append(
            f"| {r['stages']} | {r['prompt_len']} | {r['tuned_fixed']} | "
            f"{r['ttft_ms'][r['tuned_fixed']]:.0f} | {r['ideal_bound_ms']:.0f} | "
            f"{r['headroom']:.1%} | {r['auto_vs_tuned']:.3f} | {r['auto_vs_bound']:.3f} | "
            f"{base} |")
    lines += ["", "Headroom is the most any chunking policy could gain over the tuned fixed "
              "budget for one prompt at a time in this model; the deeper the pipeline, the "
              "larger the fill term (S - 1) x max(t) that equal-cost chunks shrink.", ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine-bench", default=str(ROOT / "benchmarks" / "results" /
                                                  "engine_bench.json"))
    ap.add_argument("--prompt-len", type=int, nargs="+", default=[16384, 65536])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sim_depth"))
    args = ap.parse_args()
    coeffs = json.loads(Path(args.engine_bench).read_text())["meta"]["coefficients"]
    rows = [depth_row(coeffs, s, p) for p in args.prompt_len for s in DEPTHS]
    meta = {"command": "python benchmarks/sim_depth.py " + " ".join(sys.argv[1:]),
            "source": Path(args.engine_bench).name, "coefficients": coeffs}
    Path(args.out + ".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    text = markdown(rows, meta)
    Path(args.out + ".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
