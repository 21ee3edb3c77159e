"""Soak: hundreds of requests of random length at random times, on the real engine, CPP on.

PP=2 on the vLLM CPU engine, online calibration on, prefix caching on (vLLM's default;
`--no-prefix-caching` for the lab path), vLLM's serving engine (AsyncLLM) driven by
tests/integration/engine_job.py. Prompt lengths are uniform in [min_len, max_len], output
lengths uniform in [1, max_tokens], arrivals a Poisson process of the given rate (the whole
arrival span is capped at max_arrival_s by compressing it). Checked and reported:

- completion: every request finishes with all its tokens; a request that does not is LOST;
- waiting: each request's wait (submission to first token) against a bound derived below;
- memory: resident memory of the engine core and both workers after a warm-up batch and at
  the end of the run, sampled every few seconds in between (psutil).

The wait bound (vLLM schedules first come, first served: running requests, then waiting ones
in arrival order; CPP only sizes the steps). Let A_i be the requests submitted before i and
not yet finished when i arrives, P_j a prompt length, M_j an output length, and u the
smallest chunk the leading prefill of a step ever gets (u = max(a, min_chunk - min_chunk % a),
a = max(block_size, 64); fixed fallback chunks are larger). Until i's first token, every step
either runs a chunk of the earliest unfinished prefill, which belongs to A_i or is i itself
(later arrivals queue behind i), or runs decodes only, each step then giving some request of
A_i a token. A prompt of P tokens takes at most ceil(P/u) + 1 such chunks (the tail rule may
halve the last piece), so i waits at most

    N_i = sum_{j in A_i + {i}} (ceil(P_j / u) + 1) + sum_{j in A_i} M_j + 2 * PP   steps,

the last term covering the steps already in the pipeline when i arrives and its own first
token's trip through the stages. The bound in milliseconds is N_i times the longest interval
between two consecutive step completions while the engine was busy (contention included;
idle gaps between arrivals excluded). The step
bound is structural (no timing) and is what tests/integration/test_soak.py asserts.

Memory on this CPU engine: the workers' RSS climbs by a few hundred MiB over the first
minutes of serving, with CPP on and with fixed chunks alike, and with jemalloc or a fixed
glibc mmap threshold too. It is oneDNN's primitive cache, one entry per distinct matmul shape
(up to ONEDNN_PRIMITIVE_CACHE_CAPACITY = 1024 entries, least recently used out): every new step
token count is a new shape, and CPP's varied chunk sizes make more of them. With the capacity
set to 8 the same soak stays flat. `--compare` puts such runs side by side.

    python benchmarks/soak.py                      # 300 requests, about 15-20 minutes here
    python benchmarks/soak.py --requests 60 --rate 1.0 --out /tmp/soak-small
Writes benchmarks/results/soak.json and soak.md.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "integration" / "engine_job.py"
RESULTS = ROOT / "benchmarks" / "results"

BUDGET = 2048
MAX_MODEL_LEN = 16384
PP = 2
MAX_NUM_SEQS = 16


def workload(n: int, *, min_len: int, max_len: int, max_tokens: int, rate: float,
             max_arrival_s: float, seed: int) -> dict:
    """One engine_job batch: random lengths, random output lengths, Poisson arrivals."""
    rng = random.Random(seed)
    lengths = [rng.randint(min_len, max_len) for _ in range(n)]
    outs = [rng.randint(1, max_tokens) for _ in range(n)]
    t, arrivals = 0.0, []
    for _ in range(n):
        arrivals.append(t)
        t += rng.expovariate(rate)
    span = arrivals[-1] if arrivals else 0.0
    if span > max_arrival_s > 0:
        arrivals = [a * max_arrival_s / span for a in arrivals]
    return {"lengths": lengths, "max_tokens": outs, "arrivals": [round(a, 3) for a in arrivals],
            "seed": seed}


def job_spec(workdir: Path, batch: dict, *, warmup: dict | None = None,
             rss_every_s: float = 5.0, num_samples: int = 64, sample_repeats: int = 3,
             target: str = "base", env: dict | None = None,
             prefix_caching: bool = True) -> dict:
    cpp = {
        "enabled": True,
        "trace_file": str(workdir / "trace.jsonl"),
        "profile_cache_dir": str(workdir / "profiles"),
        "num_samples": num_samples,
        "sample_repeats": sample_repeats,
        "online_calibration": True,
        "log_interval_s": 30,
        "target": target,
    }
    engine = {"model_dir": str(workdir / "tiny-llama"), "max_num_batched_tokens": BUDGET,
              "max_model_len": MAX_MODEL_LEN, "max_num_seqs": MAX_NUM_SEQS,
              "pipeline_parallel_size": PP, "cpp_config": cpp,
              "enable_prefix_caching": prefix_caching}
    batches = ([warmup] if warmup else []) + [batch]
    # 1 GiB of KV per stage holds 500k tokens here, far more than 16 running 12k prompts.
    return {"driver": "async", "engine": engine, "batches": batches,
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})}, "rss_every_s": rss_every_s}


def run_job(workdir: Path, spec: dict, timeout: float) -> tuple[dict, str]:
    workdir.mkdir(parents=True, exist_ok=True)
    trace = Path(spec["engine"]["cpp_config"]["trace_file"])
    if trace.exists():
        trace.unlink()
    spec_path, result_path, log_path = (workdir / "spec.json", workdir / "result.json",
                                        workdir / "engine.log")
    spec_path.write_text(json.dumps(spec))
    with open(log_path, "w") as log:
        proc = subprocess.run([sys.executable, str(JOB), str(spec_path), str(result_path)],
                              stdout=log, stderr=subprocess.STDOUT, timeout=timeout,
                              cwd=str(ROOT), env={**os.environ, "PYTHONUNBUFFERED": "1"})
    text = log_path.read_text(errors="replace")
    if proc.returncode != 0 or not result_path.exists():
        raise RuntimeError(f"engine job failed ({proc.returncode}):\n{text[-3000:]}")
    return json.loads(result_path.read_text()), text


def read_trace(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def min_lead_chunk(report: dict) -> int:
    """u of the bound: the smallest chunk CPP gives the leading prefill of a step."""
    align = int(report.get("alignment") or 64)
    min_chunk = int(report.get("min_chunk") or BUDGET // 4)
    return max(align, min_chunk - min_chunk % align)


def analyse(batch: dict, outputs: list[dict], trace: list[dict], report: dict,
            rss: list[dict], rss_samples: list[dict], pp: int = PP) -> dict:
    """Every figure of the soak, from the job's outputs, trace, report and memory samples."""
    n = len(batch["lengths"])
    want = batch["max_tokens"]
    completed = [o for o, m in zip(outputs, want)
                 if o.get("finish_reason") == "length" and len(o["token_ids"]) == m
                 and o.get("first_token") is not None]
    lost = n - len(completed)
    u = min_lead_chunk(report)
    step_times = sorted(line["time"] for line in trace)
    # Only intervals while some request was in the engine: an idle gap between Poisson
    # arrivals is no step's cost.
    spans = sorted((o["submit"], o["finish"]) for o in outputs)
    intervals = [b - a for a, b in zip(step_times, step_times[1:])
                 if any(s <= a and f >= b for s, f in spans)]
    longest_step_s = max(intervals) if intervals else math.nan

    waits, rows = [], []
    for i, o in enumerate(outputs):
        if o.get("first_token") is None:
            continue
        s_i, f_i = o["submit"], o["first_token"]
        ahead = [j for j, q in enumerate(outputs)
                 if j != i and q["submit"] < s_i and q["finish"] > s_i]
        bound_steps = sum(math.ceil(batch["lengths"][j] / u) + 1 for j in ahead + [i])
        bound_steps += sum(want[j] for j in ahead) + 2 * pp
        # Steps that completed while i waited.
        steps = bisect.bisect_right(step_times, f_i) - bisect.bisect_right(step_times, s_i)
        wait = f_i - s_i
        waits.append(wait)
        rows.append({"i": i, "prompt": batch["lengths"][i], "ahead": len(ahead),
                     "wait_s": wait, "steps": steps, "bound_steps": bound_steps,
                     "bound_s": bound_steps * longest_step_s})
    worst_steps = max(rows, key=lambda r: r["steps"] / r["bound_steps"]) if rows else None
    worst_wait = max(rows, key=lambda r: r["wait_s"]) if rows else None

    states: dict[str, int] = {}
    for line in trace:
        states[line["state"]] = states.get(line["state"], 0) + 1
    last = trace[-1] if trace else {}
    start_rss = rss[1] if len(rss) > 2 else rss[0]  # after the warm-up batch, when there is one
    end_rss = rss[-1]
    t0 = min((o["submit"] for o in outputs), default=0.0)
    samples = [s["total_mib"] for s in rss_samples if s["time"] >= t0]
    half = len(samples) // 2
    chunks = [r["chunk"] for line in trace for r in line["requests"]]
    return {
        "requests": n,
        "completed": len(completed),
        "lost": lost,
        "prompt_tokens": sum(batch["lengths"]),
        "output_tokens": sum(want),
        "arrival_span_s": max(batch["arrivals"]) if batch.get("arrivals") else 0.0,
        "wall_s": (max(o["finish"] for o in outputs) - min(o["submit"] for o in outputs))
        if outputs else 0.0,
        "steps": len(trace),
        "distinct_step_sizes": len({line["num_tokens"] for line in trace}),
        "states": states,
        "fit_attempts": last.get("fit_attempts"),
        "failed_fits_at_end": last.get("failed_fits"),
        "min_lead_chunk_u": u,
        "chunk_sizes": {"min": min(chunks), "median": statistics.median(chunks),
                        "max": max(chunks)} if chunks else {},
        "wait_s": {"median": statistics.median(waits), "p90": _quantile(waits, 0.9),
                   "max": max(waits)} if waits else {},
        "longest_step_interval_s": longest_step_s,
        "wait_bound": {
            "formula": "N_i = sum_{j in A_i+{i}} (ceil(P_j/u)+1) + sum_{j in A_i} M_j + 2*PP "
                       "steps; ms bound = N_i x longest busy step interval",
            "violations_steps": sum(r["steps"] > r["bound_steps"] for r in rows),
            "violations_time": sum(r["wait_s"] > r["bound_s"] for r in rows),
            "max_steps_over_bound": (worst_steps["steps"] / worst_steps["bound_steps"])
            if worst_steps else None,
            "worst_by_steps": worst_steps,
            "max_wait_request": worst_wait,
        },
        "rss_mib": {
            "start": start_rss["total_mib"], "end": end_rss["total_mib"],
            "start_engine_core": start_rss["engine_core_mib"],
            "end_engine_core": end_rss["engine_core_mib"],
            "start_workers": start_rss["workers_mib"], "end_workers": end_rss["workers_mib"],
            "samples_min": min(samples) if samples else None,
            "samples_max": max(samples) if samples else None,
            "first_half_max": max(samples[:half]) if half else None,
            "second_half_max": max(samples[half:]) if half else None,
            "growth_mib": end_rss["total_mib"] - start_rss["total_mib"],
        },
        "calibration": calibration_figures(trace),
        "rows": rows,
    }


def calibration_figures(trace: list[dict]) -> dict:
    """How the adaptive loop did: the share of steps with prefill work that ran in fixed
    fallback, give-ups, rescues, and |predicted - measured| / measured on the timed steps of
    the second half of the run (the first half includes the refits from the startup model)."""
    prefill = [line for line in trace if line.get("requests")]
    fallback = sum(1 for line in prefill if line["state"] == "fixed-fallback")
    events = [line["event"]["kind"] for line in trace if line.get("event")]
    second = trace[len(trace) // 2:]
    errors = _timed_errors(second)
    # Split by kind: a decode-only step of a few ms scatters by a larger share than a prefill
    # step of tens, so the two tails say different things about the model.
    by_kind = {kind: _timed_errors([line for line in second if bool(line.get("requests")) == pre])
               for kind, pre in (("with_prefill", True), ("decode_only", False))}
    # The later half of the timed steps: as many rows whatever share of them the second half
    # of the run holds (one step in 16 once the model is good, so a short run on a fast host
    # times few steps late; CI's soak test reads this).
    timed = _timed_errors(trace)
    later = timed[len(timed) // 2:]
    staged = [line for line in trace if line.get("stage_ms")]
    return {
        "prefill_steps": len(prefill),
        "prefill_steps_fixed_fallback": fallback,
        "fallback_share": fallback / len(prefill) if prefill else None,
        "give_ups": events.count("gave_up"),
        "rescues": events.count("rescued") + events.count("reenabled"),
        "accepted_fits": events.count("accepted"),
        "timed_steps_second_half": len(errors),
        "pred_error_median": statistics.median(errors) if errors else None,
        "pred_error_p90": _quantile(errors, 0.9) if errors else None,
        "by_kind_second_half": {kind: _error_summary(errs) for kind, errs in by_kind.items()},
        "timed_steps_with_stage_times": len(staged),
        "later_timed_half": _error_summary(later),
        "stages_slowest_share": _slowest_share(staged),
    }


def _error_summary(errors: list[float]) -> dict:
    return {"steps": len(errors),
            "pred_error_median": statistics.median(errors) if errors else None,
            "pred_error_p90": _quantile(errors, 0.9) if errors else None}


def _timed_errors(lines: list[dict]) -> list[float]:
    """|predicted - measured| / measured on the timed steps planned with a model."""
    return [abs(line["predicted_ms"] - line["measured_ms"]) / line["measured_ms"]
            for line in lines
            if line.get("measured_ms") and line.get("predicted_ms") is not None
            and line["state"] in ("calibrating", "ready")]


def _slowest_share(lines: list[dict]) -> dict[str, float]:
    """How often each pipeline stage was the slowest on a timed step."""
    counts: dict[str, int] = {}
    for line in lines:
        stages = line["stage_ms"]
        k = max(range(len(stages)), key=lambda i: stages[i] or 0.0)
        counts[f"stage{k}"] = counts.get(f"stage{k}", 0) + 1
    total = sum(counts.values())
    return {k: round(v / total, 3) for k, v in sorted(counts.items())} if total else {}


def _share(cal: dict) -> str:
    share = cal["fallback_share"]
    pct = f"{share:.1%}" if share is not None else "n/a"
    return (f"{cal['prefill_steps_fixed_fallback']} of {cal['prefill_steps']} ({pct}), "
            f"{cal['give_ups']}, {cal['rescues']}")


def _err(cal: dict) -> str:
    if cal["pred_error_median"] is None:
        return "n/a"
    return (f"{cal['pred_error_median']:.1%} / {cal['pred_error_p90']:.1%} over "
            f"{cal['timed_steps_second_half']} steps")


def _by_kind_row(cal: dict) -> list[str]:
    kinds = cal.get("by_kind_second_half")  # absent from runs saved before the split
    if not kinds:
        return []
    cells = []
    for kind in ("with_prefill", "decode_only"):
        k = kinds[kind]
        cells.append("n/a" if k["pred_error_median"] is None else
                     f"{k['pred_error_median']:.1%} / {k['pred_error_p90']:.1%} over {k['steps']}")
    return [f"| the same, steps with prefill work; decode-only steps | {cells[0]}; {cells[1]} |"]


def _quantile(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, int(q * len(ys)))]


def markdown(fig: dict, settings: dict) -> str:
    wb, rss = fig["wait_bound"], fig["rss_mib"]
    lines = [
        "# Soak: random lengths, Poisson arrivals, PP=2, CPP on with online calibration",
        "",
        f"Settings: {json.dumps(settings)}",
        "",
        "| figure | value |",
        "|---|---|",
        f"| requests | {fig['requests']} |",
        f"| completed | {fig['completed']} |",
        f"| lost | {fig['lost']} |",
        f"| prompt / output tokens | {fig['prompt_tokens']} / {fig['output_tokens']} |",
        f"| arrival span / wall | {fig['arrival_span_s']:.0f} s / {fig['wall_s']:.0f} s |",
        f"| engine steps (by CPP state) | {fig['steps']} ({fig['states']}) |",
        f"| online refit attempts | {fig['fit_attempts']} |",
        f"| calibration: prefill steps in fixed fallback, give-ups, rescues | "
        f"{_share(fig['calibration'])} |",
        f"| timed steps, 2nd half: median / p90 abs(pred - meas) / meas | "
        f"{_err(fig['calibration'])} |",
        *_by_kind_row(fig['calibration']),
        f"| slowest stage on timed steps | "
        f"{fig['calibration']['stages_slowest_share'] or 'n/a (last stage only)'} |",
        f"| chunk sizes min / median / max | {fig['chunk_sizes']} |",
        f"| wait (submit to first token) median / p90 / max | "
        f"{fig['wait_s'].get('median', 0):.2f} / {fig['wait_s'].get('p90', 0):.2f} / "
        f"{fig['wait_s'].get('max', 0):.2f} s |",
        f"| wait bound | {wb['formula']}, u = {fig['min_lead_chunk_u']} |",
        f"| requests over the step bound / time bound | {wb['violations_steps']} / "
        f"{wb['violations_time']} |",
        f"| largest steps waited / bound | {wb['max_steps_over_bound']:.3f} |",
        f"| longest step interval | {fig['longest_step_interval_s']:.3f} s |",
        f"| RSS engine core + workers, start -> end | {rss['start']:.0f} -> {rss['end']:.0f} MiB "
        f"({rss['growth_mib']:+.0f} MiB; samples {rss['samples_min']} .. {rss['samples_max']}) |",
        f"| RSS max, first half -> second half of the run | {rss['first_half_max']} -> "
        f"{rss['second_half_max']} MiB |",
        f"| distinct step sizes (tokens) | {fig['distinct_step_sizes']} |",
        "",
    ]
    w = wb["max_wait_request"]
    if w:
        lines.append(f"Longest wait: request {w['i']} ({w['prompt']} prompt tokens, {w['ahead']} "
                     f"requests ahead) waited {w['wait_s']:.2f} s over {w['steps']} steps; its "
                     f"bound was {w['bound_steps']} steps / {w['bound_s']:.1f} s.")
    return "\n".join(lines) + "\n"


def memory_table(fig: dict, settings: dict, others: list[dict]) -> str:
    rows = [("this run", settings, fig["rss_mib"], fig.get("distinct_step_sizes"))]
    rows += [(o["label"], o["settings"], o["rss_mib"], o["distinct_step_sizes"]) for o in others]
    lines = ["", "## Where the workers' memory goes", "",
             "The engine core stays flat. The workers grow with fixed chunks too, and with other "
             "allocators; with oneDNN's per-shape primitive cache capped "
             "(ONEDNN_PRIMITIVE_CACHE_CAPACITY) they reach a plateau early and stay there: the "
             "growth is that bounded cache filling (up to 1024 shapes by default), not a leak.",
             "",
             "| run | requests | target | engine env | RSS start -> end (MiB) | growth | "
             "max 1st -> 2nd half | distinct step sizes |", "|---|---|---|---|---|---|---|---|"]
    for label, st, rss, shapes in rows:
        env = ", ".join(st.get("env") or []) or "default"
        lines.append(f"| {label} | {st.get('requests')} | {st.get('target', 'base')} | {env} | "
                     f"{rss['start']:.0f} -> {rss['end']:.0f} | {rss['growth_mib']:+.0f} | "
                     f"{rss.get('first_half_max')} -> {rss.get('second_half_max')} | {shapes} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--min-len", type=int, default=100)
    ap.add_argument("--max-len", type=int, default=12000)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--rate", type=float, default=0.5, help="Poisson arrivals per second")
    ap.add_argument("--max-arrival-s", type=float, default=900.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "soak")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--target", default="base", choices=["base", "auto", "fixed"],
                    help="cpp_config.target; 'fixed' keeps vLLM's fixed chunks (A/B baseline)")
    ap.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_false",
                    help="turn vLLM's prefix caching off (on by default, as in vLLM)")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="extra environment for the engine (e.g. malloc tuning)")
    ap.add_argument("--compare", action="append", default=[], metavar="LABEL=JSON",
                    help="add another run's memory figures (its soak.json) to the report")
    ap.add_argument("--reanalyse", action="store_true",
                    help="recompute the figures from --workdir's finished run, no engine")
    args = ap.parse_args()

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="cpp-soak-"))
    batch = workload(args.requests, min_len=args.min_len, max_len=args.max_len,
                     max_tokens=args.max_tokens, rate=args.rate,
                     max_arrival_s=args.max_arrival_s, seed=args.seed)
    warmup = {"lengths": [3000, 700, 9000, 150], "max_tokens": 4, "seed": 99}
    env = dict(kv.split("=", 1) for kv in args.env)
    spec = job_spec(workdir, batch, warmup=warmup, target=args.target, env=env,
                    prefix_caching=args.prefix_caching)
    started = time.time()
    if args.reanalyse:
        spec = json.loads((workdir / "spec.json").read_text())
        batch = spec["batches"][-1]
        result = json.loads((workdir / "result.json").read_text())
        log = (workdir / "engine.log").read_text(errors="replace")
    else:
        result, log = run_job(workdir, spec, timeout=4 * 3600)
    trace = read_trace(Path(spec["engine"]["cpp_config"]["trace_file"]))
    report = json.loads(Path(spec["engine"]["cpp_config"]["trace_file"] + ".report.json")
                        .read_text())
    outputs = result["batches"][-1]["outputs"]
    # Only the soak batch's steps count for the bound and figures.
    t0 = min(o["submit"] for o in outputs)
    fig = analyse(batch, outputs, [x for x in trace if x["time"] >= t0], report,
                  result["rss"], result.get("rss_samples", []))
    fig["startup_s"] = result.get("startup_s")
    fig["total_s"] = None if args.reanalyse else time.time() - started
    fig["cpp_warnings"] = [x for x in log.splitlines() if "WARNING" in x and "[CPP]" in x]
    settings = {k: v for k, v in vars(args).items()
                if k not in ("out", "workdir", "reanalyse", "compare")}
    settings.update(budget=BUDGET, max_model_len=MAX_MODEL_LEN, pp=PP, max_num_seqs=MAX_NUM_SEQS)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    full = {"settings": settings, "figures": fig}
    text = markdown(fig, settings)
    others = []
    for item in args.compare:
        label, path = item.split("=", 1)
        other = json.loads(Path(path).read_text())
        others.append({"label": label, "settings": other["settings"],
                       "rss_mib": other["figures"]["rss_mib"],
                       "distinct_step_sizes": other["figures"].get("distinct_step_sizes")})
    if others:
        full["memory_comparison"] = others
        text += memory_table(fig, settings, others)
    Path(str(args.out) + ".json").write_text(json.dumps(full, indent=2, default=str))
    Path(str(args.out) + ".md").write_text(text)
    print(text)
    print(f"workdir: {workdir}")
    return 0 if fig["lost"] == 0 and fig["wait_bound"]["violations_steps"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
