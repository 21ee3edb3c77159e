"""Scheduler overhead per step: the core planner plus the scheduler hook's candidate building.

Times ``CppRuntime.plan`` (what the scheduler subclass calls before every ``schedule()``:
candidates from vLLM's queues through ``compat``, then ``ProfilingChunkManager.plan_step``)
with lightweight request objects shaped like vLLM's ``Request``, at 1, 64 and 256 running
requests (one long prefill in progress, the rest decoding, plus one waiting prefill), for the
base and the auto target. The prefill advances by the planned chunk every step and restarts
when done, so the auto target's re-choices (a new head, a new arrival) are part of the mix;
their cost is also shown on its own ("auto, new head").

With vLLM installed it also times the prefix-cache lookup (issue 12): ``CppRuntime.plan`` on a
scheduler whose waiting requests (1, 64, 256) share cached prefixes in vLLM's real
KVCacheManager, once with the lookup and once without. Each step the head of the queue is
scheduled (its entry dropped) and a new request arrives at the back; the request that moves
within the step's reach is looked up (one new lookup) and the kept answers of the others within
reach are re-checked, and the plan's waiting requests are checked for prefixes cached within
the step (as in the engine); the first step, when every request within reach is
looked up, is shown on its own. max_num_seqs is vLLM's GPU default (256), so all 256 waiting
requests are admissible, as in vLLM.

    python benchmarks/planner_overhead.py
Writes benchmarks/results/planner_overhead.json and planner_overhead.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vllm_ascend_cpp.core.auto_target import AutoTarget  # noqa: E402
from vllm_ascend_cpp.core.latency_model import LatencyModel  # noqa: E402
from vllm_ascend_cpp.core.predictor import ChunkSizePredictor  # noqa: E402
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
    """The attributes of vLLM's Scheduler that the hook reads."""

    def __init__(self, running: list[Req], waiting: list[Req]) -> None:
        self.running = running
        self.waiting = deque(waiting)
        self.max_num_running_reqs = 1024
        self.finished_req_ids: set[str] = set()  # finished since the last schedule()
        self.connector = None  # no KV connector


def make_sched(n_running: int) -> tuple[Sched, Req]:
    prefill = Req("prefill", PROMPT, 0, PROMPT)
    decodes = []
    for i in range(n_running - 1):
        ctx = 4096 + 97 * i
        decodes.append(Req(f"d{i}", ctx, ctx + 5, ctx + 6))  # one token to decode
    waiting = [Req("waiting", PROMPT, 0, PROMPT)]
    return Sched([*decodes, prefill], waiting), prefill


BATCH = 25


def measure(kind: str, n_running: int, steps: int) -> dict:
    """Per-step microseconds: steady steps timed in batches of 25 (the machine is shared, so
    the best batch is the cleanest figure and the median batch the typical one); the first
    step of every new prompt (the auto target's search) timed on its own."""
    rt = build_runtime(EngineSpec(stages=4, model=MODEL), Policy(kind, BUDGET))
    sched, prefill = make_sched(n_running)
    batches: list[float] = []
    new_head: list[float] = []
    heads = 0

    def advance(plan) -> None:
        nonlocal heads
        chunk = next((i.tokens for i in plan.items if i.req_id == prefill.request_id), 0) \
            if plan is not None else 0
        prefill.num_computed_tokens += max(chunk, 1)
        if prefill.num_computed_tokens >= prefill.num_prompt_tokens:
            # A new prompt of a slightly different length: a new head for the auto target.
            heads += 1
            prefill.request_id = f"prefill{heads}"
            prefill.num_prompt_tokens = prefill.num_tokens = PROMPT - 64 * heads
            prefill.num_computed_tokens = 0

    done = 0
    while done < steps:
        if prefill.num_computed_tokens == 0:
            t0 = time.perf_counter()
            plan = rt.plan(sched)
            new_head.append(time.perf_counter() - t0)
            advance(plan)
            done += 1
            continue
        # Time a batch of steps within one prompt (no new head inside the batch).
        plans = []
        t0 = time.perf_counter()
        for _ in range(BATCH):
            plan = rt.plan(sched)
            plans.append(plan)
            chunk = next((i.tokens for i in plan.items if i.req_id == prefill.request_id), 1)
            prefill.num_computed_tokens += chunk
            if prefill.num_computed_tokens >= prefill.num_prompt_tokens - BUDGET:
                break
        dt = time.perf_counter() - t0
        batches.append(dt / len(plans))
        done += len(plans)
        if prefill.num_computed_tokens >= prefill.num_prompt_tokens - BUDGET:
            prefill.num_computed_tokens = prefill.num_prompt_tokens
            advance(None)
    cand = []
    for _ in range(40):
        t0 = time.perf_counter()
        for _ in range(BATCH):
            rt.candidates(sched)
        cand.append((time.perf_counter() - t0) / BATCH)
    us = sorted(t * 1e6 for t in batches)
    heads_us = sorted(t * 1e6 for t in new_head)
    return {
        "policy": kind, "running": n_running, "steps": done,
        "best_us": us[0], "median_us": statistics.median(us),
        "new_head_best_us": heads_us[0] if heads_us else None,
        "new_head_median_us": statistics.median(heads_us) if heads_us else None,
        "new_heads": len(heads_us),
        "candidates_best_us": min(cand) * 1e6,
    }


def search_cost(queue: int, repeats: int = 30) -> dict:
    """The auto target's search on a cache miss (a fresh AutoTarget each time)."""
    p = ChunkSizePredictor(MODEL, base_chunk=BUDGET, min_chunk=4096)
    times = []
    for k in range(repeats):
        auto = AutoTarget(p, 4)
        prefills = [(0, PROMPT - 64 * k)] * queue
        t0 = time.perf_counter()
        auto.choose(prefills, BUDGET)
        times.append(time.perf_counter() - t0)
    us = sorted(t * 1e6 for t in times)
    return {"queue": queue, "best_us": us[0], "median_us": statistics.median(us)}


LOOKUP_BLOCK = 16
LOOKUP_PREFIX = 8192  # tokens of each of 4 shared system prompts / conversation histories
LOOKUP_SUFFIX = 1024
LOOKUP_MAX_SEQS = 256
LOOKUP_ALONE = 40


def lookup_cost(n_waiting: int, steps: int = 400) -> dict | None:
    """Per-step plan cost with waiting requests that hit vLLM's prefix cache (None without
    vLLM)."""
    try:
        import torch
        from vllm import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
        )
        from vllm.v1.request import Request
    except Exception:
        return None
    import random

    from vllm_ascend_cpp import compat

    init_none_hash(sha256)
    hasher = get_request_block_hasher(LOOKUP_BLOCK, sha256)
    spec = FullAttentionSpec(block_size=LOOKUP_BLOCK, num_kv_heads=1, head_size=8,
                             dtype=torch.float32)
    blocks = 4 * (LOOKUP_PREFIX + LOOKUP_SUFFIX) // LOOKUP_BLOCK + 64
    manager = KVCacheManager(
        KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[],
                      kv_cache_groups=[KVCacheGroupSpec(["layer0"], spec)]),
        max_model_len=LOOKUP_PREFIX + 2 * LOOKUP_SUFFIX, scheduler_block_size=LOOKUP_BLOCK,
        hash_block_size=LOOKUP_BLOCK, enable_caching=True)
    rng = random.Random(0)
    prefixes = [[rng.randrange(1, 30000) for _ in range(LOOKUP_PREFIX)] for _ in range(4)]
    params = SamplingParams(max_tokens=1)
    made = 0

    def new_request() -> Request:
        nonlocal made
        made += 1
        tokens = prefixes[made % 4] + [rng.randrange(1, 30000) for _ in range(LOOKUP_SUFFIX)]
        return Request(f"r{made}", tokens, params, None, block_hasher=hasher)

    for _ in range(4):  # the shared prefixes are computed once and stay cached (freed)
        req = new_request()
        got, hit, _ = manager.get_computed_blocks(req)
        manager.allocate_slots(req, req.num_tokens - hit, hit, got)
        manager.free(req)
    out: dict = {"waiting": n_waiting}
    n_batches = max(1, steps // BATCH)
    for label, use in (("without_lookup", False), ("with_lookup", True)):
        rt = build_runtime(EngineSpec(stages=4, model=MODEL), Policy("cpp-base", BUDGET))
        # Built before the clock starts: making a request (its tokens, its block hashes) is
        # the front end's work, not the scheduler's.
        arrivals = deque(new_request() for _ in range(n_batches * BATCH))
        sched = Sched([], [new_request() for _ in range(n_waiting)])
        sched.requests = {r.request_id: r for r in sched.waiting}
        sched.kv_cache_manager = manager
        # vLLM's default max_num_seqs on GPUs: with nothing running, every one of 256 waiting
        # requests may be admitted, as in vLLM; the token budget, not the seat count, is what
        # stops the step's walk (16 of these requests once their prefixes are found).
        sched.max_num_running_reqs = LOOKUP_MAX_SEQS
        if use:
            rt.attach_prefix_cache(compat.prefix_cache_lookup(sched),
                                   compat.prefix_cache_probe(sched),
                                   compat.prefix_cache_in_step(sched))
        t0 = time.perf_counter()
        rt.plan(sched)
        first = time.perf_counter() - t0
        rt.left_waiting((), ())  # the first step scheduled nothing (it is planned again)
        batches = []
        for _ in range(n_batches):
            t0 = time.perf_counter()
            for _ in range(BATCH):
                rt.plan(sched)
                head = sched.waiting.popleft()  # scheduled: its entry goes
                del sched.requests[head.request_id]
                # As CppRuntime.scheduled records it: scheduled, and (max_tokens=1) finished.
                rt.left_waiting((head.request_id,), (head.request_id,))
                new = arrivals.popleft()  # an arrival at the back
                sched.waiting.append(new)
                sched.requests[new.request_id] = new
            batches.append((time.perf_counter() - t0) / BATCH)
        us = sorted(t * 1e6 for t in batches)
        out[label] = {"best_us": us[0], "median_us": statistics.median(us),
                      "first_step_us": first * 1e6}
        if rt.prefix_hits is not None:
            out["lookups"] = rt.prefix_hits.lookups
            out["steps"] = 1 + len(batches) * BATCH
    # One lookup on its own (vLLM's longest-cache-hit search over the request's blocks), on
    # requests never looked up: what each step above pays for the request that moves within
    # reach, and what vLLM's own schedule() pays again when it admits that request.
    lookup = compat.prefix_cache_lookup(sched)
    fresh = [new_request() for _ in range(LOOKUP_ALONE)]
    alone = []
    for req in fresh:
        t0 = time.perf_counter()
        lookup(req)
        alone.append((time.perf_counter() - t0) * 1e6)
    # vLLM's own search (the coordinator's walk over every cached block, the lookup this
    # project used before bisecting), on other fresh requests: what the bisection saves.
    walk = manager.coordinator.find_longest_cache_hit
    walked = []
    for req in (new_request() for _ in range(LOOKUP_ALONE)):
        t0 = time.perf_counter()
        walk(req.block_hashes, req.num_tokens - 1)
        walked.append((time.perf_counter() - t0) * 1e6)
    out["one_lookup"] = {"best_us": min(alone), "median_us": statistics.median(alone),
                         "blocks": LOOKUP_PREFIX // LOOKUP_BLOCK,
                         "vllm_walk_best_us": min(walked),
                         "vllm_walk_median_us": statistics.median(walked)}
    return out


def _fmt(v: float | None) -> str:
    return f"{v:.0f}" if v is not None else "n/a"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--out", default=str(RESULTS / "planner_overhead"))
    ap.add_argument("--lookup-rounds", type=int, default=3,
                    help="rounds of the prefix-lookup rows (the best round is tabled)")
    args = ap.parse_args()
    rows = []
    for kind in ("cpp-base", "cpp-auto"):
        for n in (1, 64, 256):
            measure(kind, n, 50)  # warm up imports and caches of the interpreter
            row = measure(kind, n, args.steps)
            rows.append(row)
            print(f"{kind:<9} running={n:<4} best {row['best_us']:7.1f} us  median "
                  f"{row['median_us']:7.1f} us  new head best "
                  f"{row['new_head_best_us'] or float('nan'):8.1f} us  (candidates alone "
                  f"{row['candidates_best_us']:.1f} us)", flush=True)
    rounds: list[dict] = []
    for k in range(args.lookup_rounds):
        for n in (1, 64, 256):
            # The machine's speed drifts by up to 2x within minutes: each row carries the
            # auto search's time for one queued prompt, taken just before it, as a yardstick.
            yardstick = search_cost(1, repeats=10)["best_us"]
            row = lookup_cost(n)
            if row is None:
                break
            row.update(round=k + 1, yardstick_us=yardstick)
            rounds.append(row)
    if not rounds:
        print("prefix-cache lookup: vLLM is not installed, skipped")
    # Per queue length, the round whose 'with' figure was best (its yardstick shown), and the
    # median of the rounds' best batches.
    lookups = []
    for n in (1, 64, 256):
        mine = [r for r in rounds if r["waiting"] == n]
        if not mine:
            continue
        row = dict(min(mine, key=lambda r: r["with_lookup"]["best_us"]))
        row["rounds_with_best_us"] = [round(r["with_lookup"]["best_us"], 1) for r in mine]
        row["rounds_yardstick_us"] = [round(r["yardstick_us"]) for r in mine]
        lookups.append(row)
        w, wo = row["with_lookup"], row["without_lookup"]
        print(f"prefix lookup, waiting={n:<4} rounds (with, best) {row['rounds_with_best_us']} "
              f"yardsticks {row['rounds_yardstick_us']}; best round:", flush=True)
        print(f"prefix lookup, waiting={n:<4} with: best {w['best_us']:7.1f} us median "
              f"{w['median_us']:7.1f} us first step {w['first_step_us']:8.1f} us | without: "
              f"best {wo['best_us']:7.1f} us median {wo['median_us']:7.1f} us "
              f"({row['lookups']} lookups in {row['steps']} steps; one lookup alone: best "
              f"{row['one_lookup']['best_us']:.1f} us, vLLM's walk best "
              f"{row['one_lookup']['vllm_walk_best_us']:.0f} us)", flush=True)
    searches = [search_cost(q) for q in (1, 4, 16)]
    for r in searches:
        print(f"auto search on a cache miss, {r['queue']} queued 128K prefills: best "
              f"{r['best_us']:.0f} us, median {r['median_us']:.0f} us")
    command = "python benchmarks/planner_overhead.py" + "".join(f" {a}" for a in sys.argv[1:])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"command": command, "python": platform.python_version(),
            "machine": platform.machine(), "processor": platform.processor() or "?",
            "budget": BUDGET, "prompt": PROMPT, "model": MODEL.to_dict(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "cpus": os.cpu_count()}
    payload = {**meta, "rows": rows, "auto_search": searches, "prefix_lookup": lookups,
               "prefix_lookup_rounds": rounds}
    out.with_suffix(".json").write_text(json.dumps(payload, indent=1), encoding="utf-8")
    L = ["# Scheduler overhead per step (core planner + scheduler hook)", "",
         f"Made by `{command}` on {meta['machine']} (Python {meta['python']}, "
         f"{meta['cpus']} CPUs, load average {meta['load_average'][0]} at the end of the run: "
         "other jobs share the machine), so treat the figures as upper bounds.", "",
         "Each step is one call of `CppRuntime.plan`: candidate building from the scheduler's "
         "queues (through `compat`) plus `ProfilingChunkManager.plan_step`. Running requests: "
         "one 128K prefill in progress and the rest decoding, plus one waiting prefill; "
         "budget 16K. The prefill advances by its planned chunk every step and a new prompt "
         "starts when it is done, so 'new head' is the auto target's re-choice (a search, "
         "cached by the queue's shape in coarse buckets) and 'median' the steady state.", "",
         "Steady steps are timed in batches of 25: 'best' is the fastest batch (the "
         "cleanest figure on a shared machine), 'median' the typical one.", "",
         "| target | running | best (us/step) | median (us/step) | new head, best (us) | "
         "new head, median (us) | candidate building alone, best (us) |",
         "|---|---|---|---|---|---|---|"]
    for r in rows:
        L.append(f"| {r['policy'].removeprefix('cpp-')} | {r['running']} | {r['best_us']:.1f} | "
                 f"{r['median_us']:.1f} | {_fmt(r['new_head_best_us'])} | "
                 f"{_fmt(r['new_head_median_us'])} | {r['candidates_best_us']:.1f} |")
    big = {r["policy"]: r for r in rows if r["running"] == 256}
    if "cpp-base" in big:
        r = big["cpp-base"]
        L += ["", f"At 256 running requests, candidate building (the hook's side: one "
              f"`compat.request_progress` and one `Candidate` per request) is "
              f"{r['candidates_best_us']:.0f} of the {r['best_us']:.0f} us; the core planner "
              "the rest. With the prompt's new heads falling into the same cache buckets, "
              "'new head' steps hit the auto target's cache here."]
    L += ["", "The auto target's search itself, on a cache miss (it runs when the head of the "
          "prefill queue changes, more prefill work arrives or decodes join or leave, and its "
          "result is cached by the queue's shape; the tracker reuses the target on every other "
          "step):", "",
          "| queued 128K prefills | best (us) | median (us) |", "|---|---|---|"]
    L += [f"| {r['queue']} | {r['best_us']:.0f} | {r['median_us']:.0f} |" for r in searches]
    if lookups:
        L += ["", "## With the prefix-cache lookup", "",
              f"`CppRuntime.plan` with 1, 64 and 256 waiting requests of {LOOKUP_PREFIX} "
              f"shared + {LOOKUP_SUFFIX} own tokens (4 shared prefixes cached in vLLM's real "
              f"KVCacheManager, block size {LOOKUP_BLOCK}), base target, budget 16K. Every "
              "step the head of the queue is scheduled and a new request arrives at the back, "
              "so a step looks up the one request that moves within its reach and reuses the "
              "kept answers of the others (checked every step with two hash-table reads "
              "each), and, as in the engine, checks whether a request of the plan finds more "
              "once the requests before it in the step have cached their blocks; 'first "
              "step' is the step that looks up every request within reach (a "
              "burst of arrivals). 'without' is the same queue planned blind (no lookup).", "",
              f"max_num_seqs is {LOOKUP_MAX_SEQS} (vLLM's default on GPUs) and nothing is "
              "running, so every waiting request may be admitted, as vLLM would admit it. "
              "The token budget ends the step's walk: after 16 requests once their prefixes "
              "are found (1024 tokens each), after 2 without the lookup (9216 each). The hook "
              "builds candidates for, and looks up, only the requests the walk can reach; "
              "past them it needs to know that each waiting request is a prompt not yet "
              "started with no output to replay (all the plan needs of it), which holds "
              "without reading them when no request vLLM scheduled before is waiting "
              "(`compat.ScheduledBefore`, the case here: each scheduled request finishes "
              "with its one token), so the queue's length past the reach costs nothing.", "",
              "'one lookup' is the plugin's lookup alone on a request never looked up: a "
              "bisection over the request's block hashes (this dense layout), about "
              f"log2({LOOKUP_PREFIX // LOOKUP_BLOCK}) hash-table reads. 'vLLM's walk' is "
              "vLLM's own longest-cache-hit search on other fresh requests, which reads its "
              f"{LOOKUP_PREFIX // LOOKUP_BLOCK} cached blocks one by one (what `schedule()` "
              "itself pays when it admits the request, and what the plugin used before). Each "
              "steady step here makes one lookup; the rest of the 'with' figure is the checks "
              "of the kept answers within reach and of prefixes cached within the step.", "",
              f"Each queue length ran in {args.lookup_rounds} rounds; the table shows the "
              "round whose 'with' figure was best, with the yardstick taken just before it "
              "(the auto search for one queued 128K prompt, as in the table above: the "
              "machine's speed drifts by up to 2x within minutes), and every round's 'with' "
              "best batch with its yardstick.", "",
              "| waiting | with: best (us/step) | with: median (us/step) | with: first step "
              "(us) | without: best (us/step) | without: median (us/step) | one lookup: best "
              "(us) | one lookup: median (us) | vLLM's walk: best (us) | vLLM's walk: median "
              "(us) | yardstick (us) | every round: with, best (yardstick) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in lookups:
            w, wo, one = r["with_lookup"], r["without_lookup"], r["one_lookup"]
            L.append(f"| {r['waiting']} | {w['best_us']:.1f} | {w['median_us']:.1f} | "
                     f"{w['first_step_us']:.0f} | {wo['best_us']:.1f} | "
                     f"{wo['median_us']:.1f} | {one['best_us']:.1f} | "
                     f"{one['median_us']:.1f} | {one['vllm_walk_best_us']:.0f} | "
                     f"{one['vllm_walk_median_us']:.0f} | {r['yardstick_us']:.0f} | "
                     + ", ".join(f"{w_:.0f} ({y_})" for w_, y_ in zip(
                         r["rounds_with_best_us"], r["rounds_yardstick_us"])) + " |")
    out.with_suffix(".md").write_text("\n".join(L) + "\n", encoding="utf-8")
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
