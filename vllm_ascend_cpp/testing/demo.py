"""`vllm-cpp demo`: a real vLLM engine on this machine with CPP on, end to end.

Builds a tiny Llama from a config with dummy weights, starts vLLM on the CPU with pipeline
parallel size 2 and `cpp_config` enabled, prints the startup profiling report, runs one long
prompt and prints its chunk table (history, chunk, predicted ms, measured ms), then runs the
same prompt on an engine with fixed chunks and compares time to first token.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any


def add_demo_parser(sub: Any) -> Any:
    p = sub.add_parser("demo", help="run a real vLLM CPU engine (PP=2) with CPP on")
    p.add_argument("--prompt-len", type=int, default=12288)
    p.add_argument("--budget", type=int, default=2048, help="max_num_batched_tokens")
    p.add_argument("--workdir", default=None, help="where the model, trace and cache go")
    p.add_argument("--skip-fixed", action="store_true", help="do not run the fixed engine")
    p.set_defaults(run=run)
    return p


def _prefill_rows(trace: list[dict]) -> list[dict]:
    rows = []
    for line in trace:
        for r in line["requests"]:
            rows.append(
                {
                    "step": line["step"],
                    "history": r["history"],
                    "chunk": r["chunk"],
                    "predicted_ms": line.get("predicted_ms"),
                    "measured_ms": line.get("measured_ms"),
                }
            )
    return rows


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:.1f}"


def run(args: argparse.Namespace) -> int:
    from vllm_ascend_cpp.core import LatencyModel, format_report, pipeline_ttft_ms
    from vllm_ascend_cpp.testing import engine as harness
    from vllm_ascend_cpp.trace import read_trace

    if args.prompt_len < 1 or args.budget < 64:
        print("vllm-cpp: error: --prompt-len must be >= 1 and --budget >= 64", file=sys.stderr)
        return 2
    work = args.workdir or tempfile.mkdtemp(prefix="cpp-demo-")
    os.makedirs(work, exist_ok=True)
    trace_path = os.path.join(work, "trace.jsonl")
    if os.path.exists(trace_path):
        os.remove(trace_path)
    max_len = max(16384, args.prompt_len + 64)
    cpp = {
        "enabled": True,
        "trace_file": trace_path,
        "profile_cache_dir": os.path.join(work, "profiles"),
    }
    spec = harness.EngineSpec(
        model_dir=os.path.join(work, "model"),
        max_num_batched_tokens=args.budget,
        max_model_len=max_len,
        cpp_config=cpp,
        tokenizer=True,
    )
    prompt = harness.token_prompt(args.prompt_len, seed=1)

    print(f"[demo] starting vLLM (CPU, PP=2, budget {args.budget}) with CPP on ...", flush=True)
    llm = harness.build_llm(spec)
    report = json.load(open(trace_path + ".report.json", encoding="utf-8"))
    print(format_report(report), flush=True)
    harness.generate(llm, [harness.token_prompt(256, seed=99)], max_tokens=1)  # warm path
    start_step = len(read_trace(trace_path))
    start = time.perf_counter()
    harness.generate(llm, [prompt], max_tokens=1)
    ttft_dynamic = (time.perf_counter() - start) * 1000
    rows = _prefill_rows(read_trace(trace_path)[start_step:])
    harness.shutdown(llm)
    del llm

    print(f"\n[demo] chunk table, one {args.prompt_len}-token prompt, CPP on:")
    print(f"{'step':>5} {'history':>8} {'chunk':>6} {'predicted ms':>13} {'measured ms':>12}")
    for r in rows:
        print(
            f"{r['step']:>5} {r['history']:>8} {r['chunk']:>6} "
            f"{_fmt(r['predicted_ms']):>13} {_fmt(r['measured_ms']):>12}"
        )
    print(f"[demo] CPP on: {len(rows)} chunks, TTFT {ttft_dynamic:.0f} ms (wall clock)")

    coeffs = report.get("coefficients")
    model = LatencyModel.from_dict(coeffs) if coeffs else None
    if model is not None:
        fixed, h = [], 0
        while h < args.prompt_len:
            n = min(args.budget, args.prompt_len - h)
            fixed.append((h, n, model.request_ms(h, n)))
            h += n
        print(f"\n[demo] fixed chunks of {args.budget} (predicted by the fitted model):")
        print(f"{'history':>8} {'chunk':>6} {'predicted ms':>13}")
        for h, n, ms in fixed:
            print(f"{h:>8} {n:>6} {ms:>13.1f}")
        dyn_pred = [r["predicted_ms"] for r in rows if r["predicted_ms"] is not None]
        print(
            f"[demo] predicted TTFT at PP=2: fixed "
            f"{pipeline_ttft_ms([x[2] for x in fixed], 2):.0f} ms, dynamic "
            f"{pipeline_ttft_ms(dyn_pred, 2):.0f} ms"
        )

    if not args.skip_fixed:
        print("\n[demo] starting the same engine with fixed chunks (CPP off) ...", flush=True)
        spec.cpp_config = None
        llm = harness.build_llm(spec)
        harness.generate(llm, [harness.token_prompt(256, seed=99)], max_tokens=1)
        start = time.perf_counter()
        harness.generate(llm, [prompt], max_tokens=1)
        ttft_fixed = (time.perf_counter() - start) * 1000
        harness.shutdown(llm)
        print(
            f"[demo] TTFT of the {args.prompt_len}-token prompt: fixed {ttft_fixed:.0f} ms, "
            f"CPP {ttft_dynamic:.0f} ms (ratio {ttft_dynamic / ttft_fixed:.2f})"
        )
    print(f"[demo] step trace: {trace_path}   startup report: {trace_path}.report.json")
    return 0
