"""Scheduler overhead per step: the core planner plus the scheduler hook's candidate building.

Times ``CppRuntime.plan`` (what the scheduler subclass calls before every ``schedule()``:
candidates from vLLM's queues through ``compat``, then ``ProfilingChunkManager.plan_step``)
with lightweight request objects shaped like vLLM's ``Request``, at 1, 64 and 256 running
requests (one long prefill in progress, the rest decoding, plus one waiting prefill), for the
base and the auto target. The prefill advances by the planned chunk every step and restarts
when done, so the auto target's re-choices (a new head, a new arrival) are part of the mix;
their cost is also shown on its own ("auto, new head").

    python benchmarks/planner_overhead.py
Writes benchmarks/results/planner_overhead.json and planner_overhead.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vllm_ascend_cpp.core.latency_model import LatencyModel  # noqa: E402
from vllm_ascend_cpp.sim.engine import EngineSpec, Policy, build_runtime  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
MODEL = LatencyModel(a=1.93e-7, b=0.0064, c=17.6, gamma=5.1e-4)  # the seed-grid model
BUDGET = 16384
PROMPT = 131072


@dataclass(slots=True)
class Req:
    """The attributes of vLLM's Request that the hook reads."""

    request_id: str
    num_prompt_tokens: int
    num_computed_tokens: int
    num_tokens: int
    num_output_placeholders: int = 0

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_tokens


class Sched:
    def __init__(self, running: list[Req], waiting: list[Req]) -> None:
        self.running = running
        self.waiting = deque(waiting)
        self.max_num_running_reqs = 1024


def make_sched(n_running: int) -> tuple[Sched, Req]:
    prefill = Req("prefill", PROMPT, 0, PROMPT)
    decodes = []
    for i in range(n_running - 1):
        ctx = 4096 + 97 * i
        decodes.append(Req(f"d{i}", ctx, ctx + 5, ctx + 6))  # one token to decode
    waiting = [Req("waiting", PROMPT, 0, PROMPT)]
    return Sched([*decodes, prefill], waiting), prefill


def measure(kind: str, n_running: int, steps: int) -> dict:
    rt = build_runtime(EngineSpec(stages=4, model=MODEL), Policy(kind, BUDGET))
    sched, prefill = make_sched(n_running)
    times = []
    new_head = []
    for _ in range(steps):
        t0 = time.perf_counter()
        plan = rt.plan(sched)
        dt = time.perf_counter() - t0
        fresh = prefill.num_computed_tokens == 0
        (new_head if fresh else times).append(dt)
        chunk = next((i.tokens for i in plan.items if i.req_id == "prefill"), 0) if plan else 0
        prefill.num_computed_tokens += max(chunk, 1)
        if prefill.num_computed_tokens >= PROMPT:
            # A new prompt of a slightly different length: a new head for the auto target.
            prefill.request_id = f"prefill{len(new_head)}"
            prefill.num_prompt_tokens = prefill.num_tokens = PROMPT - 64 * len(new_head)
            prefill.num_computed_tokens = 0
    cand_times = []
    for _ in range(min(steps, 500)):
        t0 = time.perf_counter()
        rt.candidates(sched)
        cand_times.append(time.perf_counter() - t0)
    us = [t * 1e6 for t in times]
    us_all = [t * 1e6 for t in times + new_head]
    return {
        "policy": kind, "running": n_running, "steps": steps,
        "mean_us": statistics.fmean(us_all),
        "median_us": statistics.median(us),
        "p99_us": sorted(us)[int(0.99 * (len(us) - 1))],
        "new_head_us": statistics.median([t * 1e6 for t in new_head]) if new_head else None,
        "new_heads": len(new_head),
        "candidates_us": statistics.median([t * 1e6 for t in cand_times]),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--out", default=str(RESULTS / "planner_overhead"))
    args = ap.parse_args()
    rows = []
    for kind in ("cpp-base", "cpp-auto"):
        for n in (1, 64, 256):
            measure(kind, n, 50)  # warm up imports and caches of the interpreter
            row = measure(kind, n, args.steps)
            rows.append(row)
            print(f"{kind:<9} running={n:<4} mean {row['mean_us']:7.1f} us  median "
                  f"{row['median_us']:7.1f} us  p99 {row['p99_us']:7.1f} us  new head "
                  f"{row['new_head_us'] or float('nan'):8.1f} us  (candidates alone "
                  f"{row['candidates_us']:.1f} us)", flush=True)
    command = "python benchmarks/planner_overhead.py" + "".join(f" {a}" for a in sys.argv[1:])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"command": command, "python": platform.python_version(),
            "machine": platform.machine(), "processor": platform.processor() or "?",
            "budget": BUDGET, "prompt": PROMPT, "model": MODEL.to_dict()}
    out.with_suffix(".json").write_text(json.dumps({**meta, "rows": rows}, indent=1),
                                        encoding="utf-8")
    L = ["# Scheduler overhead per step (core planner + scheduler hook)", "",
         f"Made by `{command}` on {meta['machine']} (Python {meta['python']}); this machine "
         "runs other jobs too, so treat the figures as upper bounds.", "",
         "Each step is one call of `CppRuntime.plan`: candidate building from the scheduler's "
         "queues (through `compat`) plus `ProfilingChunkManager.plan_step`. Running requests: "
         "one 128K prefill in progress and the rest decoding, plus one waiting prefill; "
         "budget 16K. The prefill advances by its planned chunk every step and a new prompt "
         "starts when it is done, so 'new head' is the auto target's re-choice (a search, "
         "cached by the queue's shape in coarse buckets) and 'median' the steady state.", "",
         "| target | running | mean (us) | median (us) | p99 (us) | new head (us) | "
         "candidates alone (us) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        head = f"{r['new_head_us']:.0f}" if r["new_head_us"] is not None else "n/a"
        L.append(f"| {r['policy'].removeprefix('cpp-')} | {r['running']} | {r['mean_us']:.1f} | "
                 f"{r['median_us']:.1f} | {r['p99_us']:.1f} | {head} | "
                 f"{r['candidates_us']:.1f} |")
    out.with_suffix(".md").write_text("\n".join(L) + "\n", encoding="utf-8")
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
