"""``vllm-cpp simulate`` and ``vllm-cpp report``: the simulator and trace reader on the command
line (registered in ``vllm_ascend_cpp.cli``)."""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Any

from vllm_ascend_cpp.core.latency_model import LatencyModel
from vllm_ascend_cpp.model_args import (
    CliError,
    add_model_arguments,
    describe,
    model_from_coefficients,
    wants_profile,
)

from .engine import POLICY_KINDS, EngineSpec, Policy, SimResult, Workload, simulate_policy
from .profile import ProfileInfo, load_profile
from .trace_view import trace_summary, trace_timeline

# -- simulate -----------------------------------------------------------------------------

def add_simulate_parser(sub: Any) -> Any:
    p = sub.add_parser(
        "simulate",
        help="simulate vLLM's pipeline-parallel engine under fixed and CPP chunking",
        description="Discrete-event model of vLLM's pipeline-parallel engine (batch queue of "
                    "pp batches, vLLM's scheduling walk, the plugin's own planner) driven by a "
                    "latency model. Prints mean TTFT, throughput, prefill step CV and bubble "
                    "fraction per policy.")
    src = p.add_argument_group("latency model, per stage (coefficients in ms, or a profile)")
    add_model_arguments(src, "the engine's report JSON (trace_file + '.report.json') or a "
                             "cached profile")
    p.add_argument("--pp", type=int, default=None,
                   help="pipeline stages (default: the profile's, else 2)")
    p.add_argument("--prompt-len", type=int, required=True, help="prompt length in tokens")
    p.add_argument("--variable", action="store_true",
                   help="prompt lengths uniform in [0.5, 1.5] x --prompt-len")
    p.add_argument("--concurrency", type=int, default=1, help="closed-loop clients (default 1)")
    p.add_argument("--requests", type=int, default=None,
                   help="requests in total (default max(4, 4 x concurrency))")
    p.add_argument("--output-len", type=int, default=128, help="output tokens (default 128)")
    p.add_argument("--decode", choices=("engine", "remote"), default="engine",
                   help="decodes on this engine, or elsewhere after the first token (PD "
                        "disaggregation; see --remote-tpot-ms)")
    p.add_argument("--remote-tpot-ms", type=float, default=0.0,
                   help="remote decode ms per output token (with --decode remote)")
    p.add_argument("--remote-tpot-per-ktok-ms", type=float, default=0.0,
                   help="extra remote decode ms per output token per 1024 prompt tokens")
    p.add_argument("--budget", type=int, default=None,
                   help="max_num_batched_tokens (default: the profile's base chunk)")
    p.add_argument("--policy", action="append", metavar="KIND[:BUDGET]",
                   help=f"repeatable; KIND one of {', '.join(POLICY_KINDS)} (default: fixed, "
                        "cpp-base and cpp-auto at --budget)")
    p.add_argument("--min-chunk", type=int, default=None, help="CPP minimum chunk")
    p.add_argument("--smooth", type=float, default=None, help="CPP smooth factor in (0, 1]")
    p.add_argument("--block-size", type=int, default=None, help="KV block size (default 16)")
    p.add_argument("--sched-ms", type=float, default=0.0,
                   help="host ms per scheduler call, before dispatch (default 0)")
    p.add_argument("--noise", type=float, default=0.0,
                   help="relative std of step times (default 0)")
    p.add_argument("--seed", type=int, default=0, help="seed for prompt lengths and noise")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--plot", metavar="OUT.png", help="write a Gantt chart of every policy")
    p.add_argument("--plot-window-ms", type=float, default=None,
                   help="time span to draw (default: until concurrency+1 first tokens)")
    p.set_defaults(run=run_simulate)
    return p


def _model_from_args(args: argparse.Namespace) -> tuple[LatencyModel, ProfileInfo | None]:
    if not wants_profile(args):
        return model_from_coefficients(args), None
    try:
        info = load_profile(args.profile)
    except OSError as exc:
        raise CliError(f"cannot read profile {args.profile}: {exc.strerror or exc}") from None
    except (ValueError, TypeError) as exc:
        raise CliError(f"profile {args.profile} is not usable: {exc}") from None
    return info.model, info


def _policies(args: argparse.Namespace, budget: int, info: ProfileInfo | None) -> list[Policy]:
    texts = args.policy or list(POLICY_KINDS)
    out = []
    for text in texts:
        kind, _, b = text.partition(":")
        kind = kind.strip()
        if kind not in POLICY_KINDS:
            raise CliError(f"--policy {text!r}: KIND must be one of {', '.join(POLICY_KINDS)}")
        if b and not b.strip().isdigit():
            raise CliError(f"--policy {text!r}: BUDGET must be a positive integer")
        pb = int(b) if b else budget
        if pb < 1:
            raise CliError(f"--policy {text!r}: BUDGET must be a positive integer")
        if kind == "fixed":
            out.append(Policy("fixed", pb))
            continue
        base = min_chunk = None
        smooth = 1.0
        if info is not None:
            pol = info.policy(kind, pb)
            base, min_chunk, smooth = pol.base_chunk, pol.min_chunk, pol.smooth_factor
        if args.min_chunk is not None:
            min_chunk = args.min_chunk
        if args.smooth is not None:
            smooth = args.smooth
        out.append(Policy(kind, pb, base_chunk=base, min_chunk=min_chunk, smooth_factor=smooth))
    return out


def _check_args(args: argparse.Namespace) -> None:
    for name in ("prompt_len", "concurrency", "output_len"):
        value = getattr(args, name)
        if value is None or value < 1:
            raise CliError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    if args.requests is not None and args.requests < 1:
        raise CliError(f"--requests must be a positive integer, got {args.requests}")
    if args.smooth is not None and not 0.0 < args.smooth <= 1.0:
        raise CliError(f"--smooth must be in (0, 1], got {args.smooth}")
    if args.min_chunk is not None and args.min_chunk < 1:
        raise CliError(f"--min-chunk must be a positive integer, got {args.min_chunk}")
    for name in ("sched_ms", "noise", "remote_tpot_ms", "remote_tpot_per_ktok_ms"):
        value = getattr(args, name)
        if not math.isfinite(value) or value < 0:
            raise CliError(f"--{name.replace('_', '-')} must be a number >= 0, got {value}")


def _fmt_ms(v: float) -> str:
    return "n/a" if not math.isfinite(v) else (f"{v / 1000:.3f} s" if v >= 10000 else
                                               f"{v:.1f} ms")


def run_simulate(args: argparse.Namespace) -> int:
    model, info = _model_from_args(args)
    _check_args(args)
    stages = args.pp if args.pp is not None else (info.pp_size if info and info.pp_size else 2)
    if stages < 2:
        raise CliError(f"--pp must be at least 2 (CPP needs pipeline parallelism), got {stages}")
    budget = args.budget if args.budget is not None else (info.base_chunk if info else None)
    if budget is None or budget < 1:
        raise CliError("--budget is required (the profile does not name a base chunk)")
    block = args.block_size or (info.block_size if info else 16)
    if block < 1:
        raise CliError(f"--block-size must be a positive integer, got {block}")
    policies = _policies(args, budget, info)
    workload = Workload(concurrency=args.concurrency, num_requests=args.requests,
                        prompt_len=args.prompt_len, variable=args.variable,
                        output_len=args.output_len, decode=args.decode,
                        remote_tpot_ms=args.remote_tpot_ms,
                        remote_tpot_per_ktok_ms=args.remote_tpot_per_ktok_ms, seed=args.seed)
    # The profile's model is the slowest stage; the report says how much faster the others ran.
    scale = info.stage_scale if info is not None and info.stage_scale is not None \
        and len(info.stage_scale) == stages else None
    engine = EngineSpec(stages=stages, model=model, block_size=block, sched_ms=args.sched_ms,
                        noise=args.noise, seed=args.seed, stage_scale=scale)
    results = [simulate_policy(engine, p, workload, record_timeline=bool(args.plot))
               for p in policies]
    plot_path = None
    if args.plot:
        plot_path = _plot_results(results, args.plot, args.plot_window_ms, args.concurrency,
                                  stages, args.prompt_len)
    first = results[0].mean_ttft_ms
    if args.json:
        print(json.dumps({"model": model.to_dict(), "stages": stages,
                          "workload": {"concurrency": args.concurrency,
                                       "prompt_len": args.prompt_len,
                                       "variable": args.variable,
                                       "output_len": args.output_len,
                                       "decode": args.decode,
                                       "requests": workload.total_requests},
                          "results": [r.to_dict() for r in results], "plot": plot_path},
                         indent=2))
        return 0
    print(f"model per stage: {describe(model)} ms; pp={stages}; prompts "
          f"{'~U[0.5,1.5]x' if args.variable else ''}{args.prompt_len} tokens, concurrency "
          f"{args.concurrency}, {workload.total_requests} requests, output {args.output_len} "
          f"({args.decode} decode)")
    header = (f"{'policy':<18} {'mean TTFT':>12} {'median':>12} {'ratio':>7} "
              f"{'tok/s':>10} {'prefill CV':>10} {'bubbles':>8} {'steps':>6}")
    print(header)
    print("-" * len(header))
    for r in results:
        ratio = r.mean_ttft_ms / first if first > 0 else math.nan
        cv = f"{r.prefill_step_cv:.3f}" if math.isfinite(r.prefill_step_cv) else "n/a"
        bub = (f"{100 * r.bubble_fraction:.1f}%" if math.isfinite(r.bubble_fraction)
               else "n/a")
        print(f"{r.policy:<18} {_fmt_ms(r.mean_ttft_ms):>12} {_fmt_ms(r.median_ttft_ms):>12} "
              f"{ratio:>7.3f} {r.throughput_tok_s:>10.1f} {cv:>10} {bub:>8} {r.steps:>6}")
    if plot_path:
        print(f"Gantt chart written to {plot_path}")
    return 0


def _plot_results(results: list[SimResult], path: str, window: float | None,
                  concurrency: int, stages: int, prompt_len: int) -> str:
    from .plots import PlotError, describe, gantt

    if window is None:
        # Enough to see the pipeline fill, run and drain for the first few requests.
        ends = []
        for r in results:
            if r.timeline is None:
                continue
            firsts = sorted(b for _, b in r.timeline.prefill_windows)
            k = min(len(firsts), concurrency + 1) - 1
            if k >= 0:
                ends.append(firsts[k])
        window = 1.03 * max(ends) if ends else None
    panels = [(r.policy, r.timeline) for r in results if r.timeline is not None]
    subtitles = [describe(r.mean_ttft_ms, r.prefill_step_cv, r.bubble_fraction)
                 for r in results if r.timeline is not None]
    try:
        return gantt(panels, path, window_ms=window, subtitles=subtitles,
                     title=f"pp={stages}, prompts of {prompt_len} tokens, concurrency "
                           f"{concurrency}: simulated pipeline")
    except PlotError as exc:
        raise CliError(str(exc)) from None


# -- report -------------------------------------------------------------------------------

def add_report_parser(sub: Any) -> Any:
    p = sub.add_parser(
        "report",
        help="summarise a trace_file (and draw its pipeline with --plot)",
        description="Read one or more trace files written by the plugin (cpp_config."
                    "trace_file): steps, prefill chunks per request, median prediction "
                    "error, prefill step CV and bubble fraction; --plot draws the pipeline "
                    "of each trace as a Gantt chart, side by side.")
    p.add_argument("--trace", action="append", required=True, metavar="FILE",
                   help="trace file (repeat to compare, e.g. fixed and dynamic)")
    p.add_argument("--label", action="append", default=None,
                   help="panel label per --trace (default: the file name)")
    p.add_argument("--pp", type=int, default=None,
                   help="pipeline stages (default: pp_size from FILE.report.json, else 2)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--plot", metavar="OUT.png", help="write a Gantt chart")
    p.add_argument("--plot-window-ms", type=float, default=None,
                   help="time span to draw (default: all)")
    p.set_defaults(run=run_report)
    return p


def _read_trace(path: str) -> list[dict]:
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as fh:
            lines = []
            for n, text in enumerate(fh, 1):
                if not text.strip():
                    continue
                try:
                    lines.append(json.loads(text))
                except json.JSONDecodeError:
                    # The engine may still be writing: a torn last line is not an error.
                    if fh.readline():
                        raise CliError(f"trace {path} line {n} is not JSON") from None
    except OSError as exc:
        raise CliError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    return lines


def _stages_for(path: str, given: int | None) -> int:
    if given is not None:
        if given < 1:
            raise CliError(f"--pp must be a positive integer, got {given}")
        return given
    try:
        info = load_profile(os.path.expanduser(path) + ".report.json")
    except (OSError, ValueError, TypeError):
        return 2
    return info.pp_size or 2


def run_report(args: argparse.Namespace) -> int:
    labels = args.label or []
    if labels and len(labels) != len(args.trace):
        raise CliError("give one --label per --trace")
    summaries = []
    panels = []
    for k, path in enumerate(args.trace):
        lines = _read_trace(path)
        stages = _stages_for(path, args.pp)
        label = labels[k] if labels else os.path.basename(path)
        summaries.append({"trace": path, "label": label, **trace_summary(lines, stages)})
        if args.plot:
            panels.append((label, trace_timeline(lines, stages)))
    plot_path = None
    if args.plot:
        from .plots import PlotError, describe, gantt

        subtitles = [describe(math.nan, s["prefill_step_cv"] or math.nan,
                              s["bubble_fraction"] if s["bubble_fraction"] is not None
                              else math.nan) for s in summaries]
        try:
            plot_path = gantt(panels, args.plot, window_ms=args.plot_window_ms,
                              subtitles=subtitles,
                              title="pipeline reconstructed from the trace (measured step "
                                    "times where timed, predicted elsewhere)")
        except PlotError as exc:
            raise CliError(str(exc)) from None
    if args.json:
        print(json.dumps({"traces": summaries, "plot": plot_path}, indent=2))
        return 0
    for s in summaries:
        _print_summary(s)
    if plot_path:
        print(f"Gantt chart written to {plot_path}")
    return 0


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


def _print_summary(s: dict) -> None:
    print(f"trace {s['trace']} (pp={s['stages']}): {s['steps']} steps, "
          f"{s['prefill_steps']} with prefill, {s['timed_steps']} timed; states "
          + ", ".join(f"{k}={v}" for k, v in s["states"].items()))
    print(f"  median prediction error {_pct(s['median_prediction_error'])}; prefill step CV "
          f"{_num(s['prefill_step_cv_measured'])} (measured steps), "
          f"{_num(s['prefill_step_cv'])} (all); bubbles {_pct(s['bubble_fraction'])}")
    reqs = s["requests"]
    if not reqs:
        return
    header = f"  {'request':<24} {'chunks':>6} {'tokens':>8}  chunk sizes"
    print(header)
    for rid, r in reqs.items():
        sizes = r["chunks"]
        shown = " ".join(str(c) for c in sizes[:12]) + (" ..." if len(sizes) > 12 else "")
        print(f"  {rid[:24]:<24} {len(sizes):>6} {r['tokens']:>8}  {shown}")
