"""Where a trace's timed steps depart from the latency model: costs the model does not have.

Reads a `trace_file` (one JSON line per step, written by a benchmark such as
`bench_engine.py --one-engine`, which leaves it in its work directory) and reports, over the
timed steps, the measured time against the time the model in use predicted:

* steps that ran one prefill and nothing else, split into a request's first chunk (no cached
  prefix) and later chunks, by chunk size: measured / predicted, median and mean;
* steps whose total token count the trace had not shown before against counts it had:
  measured - predicted (ms). Kernels that build and cache one implementation per shape
  (oneDNN's matmul primitives on the CPU) pay for a new count once;
* stalls: steps measured at more than 3x their prediction and 500 ms or more, with the stage
  that stalled;
* steps after a pause: the engine went PAUSE_S or more without a step (a benchmark's
  bookkeeping between cells) and a new prompt started; measured / predicted of the first
  steps after it, by position, against every later step.
* with `--bench RESULTS.json` (a one-engine `bench_engine.py` run that kept each cell's start,
  `start_wall_per_rep`): each policy's cell starts, the wall time from the cell's start to its
  second step's result over what the model the engine fitted to the whole trace gives for it
  (the first result passes every stage, the second one stage more). Timed steps are a sample;
  wall times cover every step, so this catches a cost at the start of a cell that the
  sampled timings mostly miss.
  It also adds each policy's host gaps: the wall time between two back-to-back prefill steps'
  results minus the later step's forward (timed steps), as the engine records them (the auto
  target puts their median, floored at 0, on every dispatch), and with that step's rise over
  the one before taken out (`core.host_gap_ms`, from the lines' predicted costs).
  And each policy's result intervals: the wall time from the result before each step with
  prefill work to its own, over what the model predicts for it under vLLM's batch queue; the
  time over it per cell and by step size (a cost per step the model lacks against a slow
  machine), and the stretches of several slow steps in a row, with the stage times of the
  timed steps in them.

    python benchmarks/trace_costs.py /tmp/cpp-bench-XXXX/trace-one-engine.jsonl \
        --out benchmarks/results/trace_costs_anchored
    python benchmarks/trace_costs.py TRACE --bench benchmarks/results/engine_bench_X.json
Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vllm_ascend_cpp.core.latency_model import host_gap_ms  # noqa: E402
from vllm_ascend_cpp.sim.profile import step_items  # noqa: E402
from vllm_ascend_cpp.trace import read_trace  # noqa: E402

# Chunk-size buckets (tokens) for single-prefill steps.
BUCKETS = ((1, 1024), (1025, 2048), (2049, 3072), (3073, 1 << 30))
STALL_RATIO = 3.0
STALL_MS = 500.0
# A gap between two steps' lines this long is a pause, not a slow step.
PAUSE_S = 0.3
# Steps 0 .. AFTER_PAUSE-1 after a pause are reported one by one, later ones together.
AFTER_PAUSE = 3
# A result interval this many times its prediction is slow; MIN_STRETCH of them in a row are
# a slow stretch.
SLOW_RATIO = 1.25
MIN_STRETCH = 4
TOP_STRETCHES = 12
# Expected result intervals are grouped at these edges (ms) for the excess per step.
INTERVAL_BUCKETS_MS = (100, 200, 400)


def _timed(line: dict) -> bool:
    m, p = line.get("measured_ms"), line.get("predicted_ms")
    return isinstance(m, (int, float)) and isinstance(p, (int, float)) and m > 0 and p > 0


def _first_chunks(line: dict) -> list[int]:
    """Sizes of the step's chunks that start a prompt (no cached prefix)."""
    return [int(r.get("chunk") or 0) for r in line.get("requests") or []
            if int(r.get("history") or 0) == 0]


def _bucket(n: int) -> str:
    lo, hi = next((lo, hi) for lo, hi in BUCKETS if lo <= n <= hi)
    return f"{lo}-{hi}" if hi < 1 << 30 else f"{lo}+"


def _summary(values: Sequence[float]) -> dict:
    return {"steps": len(values), "median": statistics.median(values),
            "mean": statistics.mean(values)}


def first_chunk_costs(lines: Sequence[dict]) -> dict[str, dict]:
    """measured / predicted of timed single-prefill steps (no decodes), keyed
    ``"first <bucket>"`` (no cached prefix) or ``"later <bucket>"``."""
    groups: dict[str, list[float]] = defaultdict(list)
    for ln in lines:
        reqs = ln.get("requests") or []
        if len(reqs) != 1 or ln.get("decodes") or not _timed(ln):
            continue
        first = bool(_first_chunks(ln))
        key = f"{'first' if first else 'later'} {_bucket(int(reqs[0].get('chunk') or 0))}"
        groups[key].append(ln["measured_ms"] / ln["predicted_ms"])
    return {k: _summary(v) for k, v in sorted(groups.items())}


def new_size_costs(lines: Sequence[dict]) -> dict[str, dict]:
    """measured - predicted (ms) of timed prefill steps whose token count is new to the trace
    (in step order) against counts seen before; also the number of distinct counts."""
    seen: set[int] = set()
    groups: dict[str, list[float]] = defaultdict(list)
    for ln in sorted(lines, key=lambda x: x.get("step", 0)):
        n = int(ln.get("num_tokens") or 0)
        new = n not in seen
        seen.add(n)
        if ln.get("requests") and _timed(ln):
            groups["new" if new else "seen"].append(ln["measured_ms"] - ln["predicted_ms"])
    out = {k: _summary(v) for k, v in sorted(groups.items())}
    out["distinct_token_counts"] = len(seen)
    return out


def stalls(lines: Sequence[dict]) -> list[dict]:
    out = []
    for ln in lines:
        if _timed(ln) and ln["measured_ms"] >= STALL_MS \
                and ln["measured_ms"] > STALL_RATIO * ln["predicted_ms"]:
            first = _first_chunks(ln)
            out.append({"step": ln.get("step"), "num_tokens": ln.get("num_tokens"),
                        "first_chunk": max(first) if first else None,
                        "predicted_ms": ln["predicted_ms"], "measured_ms": ln["measured_ms"],
                        "stage_ms": ln.get("stage_ms")})
    return out


def after_pause_costs(lines: Sequence[dict]) -> dict[str, dict]:
    """measured / predicted of timed prefill steps by their position after a pause: a gap of
    ``PAUSE_S`` or more before a step that starts a prompt (a chunk with no cached prefix).
    Keys ``"step 0"`` .. ``"step {AFTER_PAUSE-1}"`` and ``"later"`` (every other step,
    including those before the first pause)."""
    groups: dict[str, list[float]] = defaultdict(list)
    since = AFTER_PAUSE
    prev_time = None
    for ln in sorted(lines, key=lambda x: x.get("step", 0)):
        t = ln.get("time")
        reqs = ln.get("requests") or []
        if prev_time is not None and t is not None and t - prev_time >= PAUSE_S \
                and _first_chunks(ln):
            since = 0
        if reqs and _timed(ln):
            key = f"step {since}" if since < AFTER_PAUSE else "later"
            groups[key].append(ln["measured_ms"] / ln["predicted_ms"])
        since += 1
        if t is not None:
            prev_time = t
    order = [f"step {i}" for i in range(AFTER_PAUSE)] + ["later"]
    return {k: _summary(groups[k]) for k in order if groups.get(k)}


def cell_start_costs(lines: Sequence[dict], table: dict, model: Any, stages: int = 2
                     ) -> dict[str, dict]:
    """Per policy (over every cell of a bench results ``table`` that kept
    ``start_wall_per_rep``): the wall time from each cell's start to its second step's result
    minus ``model``'s forecast of it (``stages`` times the first step, plus the second), in ms,
    with the cell's count of step sizes new to the engine beside it."""
    times = [ln.get("time") for ln in lines]
    out: dict[str, dict] = {}
    for key, pols in table.items():
        for name, v in pols.items():
            starts = v.get("start_wall_per_rep") or []
            news = v.get("new_shapes_per_rep") or [None] * len(starts)
            for w, new in zip(starts, news):
                if w is None:
                    continue
                i = bisect.bisect_left(times, w)
                if i + 1 >= len(lines):
                    continue
                first, second = step_items(lines[i]), step_items(lines[i + 1])
                if first is None or second is None:
                    continue
                forecast = stages * model.step_ms(first) + model.step_ms(second)
                over = (lines[i + 1]["time"] - w) * 1e3 - forecast
                d = out.setdefault(name, {"cells": []})
                d["cells"].append({"cell": key, "over_ms": round(over, 1), "new_shapes": new})
    for d in out.values():
        over = [c["over_ms"] for c in d["cells"]]
        d.update(_summary(over))
        d["over_500ms"] = sum(x > 500 for x in over)
    return out


def _cells(table: dict) -> list[tuple[float, str, str, int]]:
    """``(start wall time, policy, cell key, round)`` of every cell, closed-loop recordings
    included, in time order."""
    out = []
    for key, pols in table.items():
        for name, v in pols.items():
            out += [(w, name, key, r) for r, w in enumerate(v.get("start_wall_per_rep") or [])
                    if w is not None]
            out += [(w, f"{name} (closed loop)", key, r)
                    for r, w in enumerate(v.get("closed_loop_start_wall_per_rep") or [])
                    if w is not None]
    return sorted(out)


def host_gaps(lines: Sequence[dict], table: dict, stages: int = 2) -> dict[str, dict]:
    """Per policy: back-to-back prefill steps' host gaps (ms), raw and with the rise out."""
    starts = _cells(table)
    walls = [w for w, *_ in starts]
    raw: dict[str, list[float]] = defaultdict(list)
    out: dict[str, list[float]] = defaultdict(list)
    prev = None
    for ln in lines:
        prefill = any(r.get("chunk", 0) > 1 for r in ln.get("requests") or [])
        t, meas, pred = ln.get("time"), ln.get("measured_ms"), ln.get("predicted_ms")
        i = bisect.bisect_right(walls, t) - 1 if t is not None else -1
        name = starts[i][1] if i >= 0 else None
        if (name is not None and prefill and meas is not None and prev is not None
                and prev[2] == name):
            interval = (t - prev[0]) * 1e3
            raw[name].append(interval - meas)
            out[name].append(host_gap_ms(interval, meas, stages,
                                         pred if pred is not None else float("nan"),
                                         prev[1] if prev[1] is not None else float("nan")))
        prev = (t, pred, name) if prefill and t is not None else None
    return {name: {"steps": len(raw[name]),
                   "raw_median": statistics.median(raw[name]),
                   "median": statistics.median(out[name]),
                   "used_median": statistics.median(max(0.0, g) for g in out[name])}
            for name in sorted(raw)}


def _expected_interval(ends: Sequence[float], prev_ms: float, this_ms: float,
                       stages: int) -> float:
    """When a step's result should come after the one before it, from the results already
    back (``ends``, the last ``stages`` result times in ms, oldest first) and the two steps'
    predicted costs, with no host time: the step is dispatched when the result ``stages``
    back came in (vLLM keeps at most that many batches in flight), and the step before it
    holds each stage until it moves on (its cost per stage, leaving the last at its result).
    Under heavy and light steps in turn (decodes in one pipeline phase) a light step's result
    then follows the heavy one's closely and a heavy step's comes late, which a plain
    ``predicted`` per interval would call fast and slow."""
    last = ends[-1]
    end = ends[0] if len(ends) >= stages else -math.inf
    for s in range(stages):
        end = max(end, last - (stages - 1 - s) * prev_ms) + this_ms
    return end - last


def result_intervals(lines: Sequence[dict], table: dict, stages: int = 2
                     ) -> dict[str, dict]:
    """Per policy: the wall time from the result before a step with prefill work to the
    step's own over what the model in use predicted for it (see :func:`_expected_interval`).

    Cells are cut by the bench's ``start_wall_per_rep``. Decode-only steps count as steps in
    flight but are not reported (their intervals are the host's pace, not the model's).
    Intervals longer than ``PAUSE_S`` and ``STALL_RATIO`` times their prediction are idle
    time (no request to run), not slow steps, and are left out. Reported: the ratio's median
    and mean, the share of intervals at ``SLOW_RATIO`` or more, the time over prediction
    (ms) in total, per cell and by expected interval (a constant excess per step shows as the
    same ms in every bucket, a slow machine as the same ratio), and the slow stretches: runs
    of ``MIN_STRETCH`` or more consecutive slow intervals, with the timed steps' stage times
    in them."""
    starts = _cells(table)
    walls = [w for w, *_ in starts]
    per: dict[str, dict] = {}
    prev_cell = None
    run: list[dict] = []

    def close_run(name: str | None) -> None:
        if name is not None and len(run) >= MIN_STRETCH:
            timed = [r for r in run if r["stage_ms"]]
            stage_cols = list(zip(*(r["stage_ms"] for r in timed))) if timed else []
            per[name]["stretches"].append({
                "cell": run[0]["cell"], "first_step": run[0]["step"], "steps": len(run),
                "seconds": round(sum(r["interval"] for r in run) / 1e3, 2),
                "over_ms": round(sum(r["interval"] - r["expected"] for r in run), 1),
                "median_ratio": round(statistics.median(r["interval"] / r["expected"]
                                                        for r in run), 3),
                "timed": len(timed),
                "stage_over_predicted": [round(statistics.median(
                    ms / r["pred"] for ms, r in zip(col, timed)), 3) for col in stage_cols]})
        run.clear()

    cur_name = None
    ends: list[float] = []
    prev_pred = 0.0
    for ln in lines:
        t, pred = ln.get("time"), ln.get("predicted_ms")
        if t is None or not isinstance(pred, (int, float)) or pred <= 0:
            continue
        i = bisect.bisect_right(walls, t) - 1
        if i < 0:
            continue
        name = starts[i][1]
        if i != prev_cell:
            close_run(cur_name)
            ends, prev_cell, cur_name = [], i, name
        now = t * 1e3
        if ends and ln.get("requests"):
            interval = now - ends[-1]
            expected = _expected_interval(ends, prev_pred, float(pred), stages)
            d = per.setdefault(name, {"over": defaultdict(list),
                                      "stretches": [], "cells": {}})
            if interval > PAUSE_S * 1e3 and interval > STALL_RATIO * expected:
                close_run(name)
            else:
                ratio = interval / expected
                d["cells"][i] = d["cells"].get(i, 0.0) + interval - expected
                d["over"][_interval_bucket(expected)].append((interval - expected, ratio))
                stage = ln.get("stage_ms")
                if ratio >= SLOW_RATIO:
                    run.append({"cell": f"{starts[i][2]} round {starts[i][3] + 1}",
                                "step": ln.get("step"),
                                "interval": interval, "expected": expected,
                                "pred": float(pred),
                                "stage_ms": stage if isinstance(stage, list) and stage
                                and _timed(ln) else None})
                else:
                    close_run(name)
        elif not ln.get("requests"):
            # A decode-only step ends a run of slow prefill steps: TTFT is what is at stake.
            close_run(cur_name)
        ends = (ends + [now])[-max(1, int(stages)):]
        prev_pred = float(pred)
    close_run(cur_name)
    out: dict[str, dict] = {}
    for name, d in sorted(per.items()):
        rows = [row for v in d["over"].values() for row in v]
        if not rows:
            continue
        over_all = [x for x, _ in rows]
        r = [ratio for _, ratio in rows]
        out[name] = {
            "cells": len(d["cells"]), "intervals": len(r),
            "median_ratio": statistics.median(r), "mean_ratio": statistics.mean(r),
            "slow_share": sum(x >= SLOW_RATIO for x in r) / len(r),
            "over_s": sum(over_all) / 1e3,
            "over_by_expected": {k: _over_summary(d["over"][k]) for k in _BUCKET_LABELS
                                 if d["over"].get(k)},
            "stretches": d["stretches"],
            "over_s_per_cell": {f"{starts[i][2]} round {starts[i][3] + 1}": round(v / 1e3, 2)
                                for i, v in sorted(d["cells"].items())},
            "stretch_over_s": sum(s["over_ms"] for s in d["stretches"]) / 1e3}
    return out


def _over_summary(rows: Sequence[tuple[float, float]]) -> dict:
    over = [x for x, _ in rows]
    ratios = sorted(r for _, r in rows)
    return {"intervals": len(rows), "median_ms": statistics.median(over),
            "mean_ms": statistics.mean(over),
            "p90_ratio": ratios[min(len(ratios) - 1, int(0.9 * len(ratios)))],
            "slow_share": sum(r >= SLOW_RATIO for r in ratios) / len(ratios)}


_BUCKET_LABELS = [f"{lo}-{hi} ms" for lo, hi in zip((0, *INTERVAL_BUCKETS_MS),
                                                     INTERVAL_BUCKETS_MS)] \
    + [f"{INTERVAL_BUCKETS_MS[-1]}+ ms"]


def _interval_bucket(ms: float) -> str:
    return _BUCKET_LABELS[bisect.bisect_right(INTERVAL_BUCKETS_MS, ms)]


def analyse(lines: Sequence[dict]) -> dict:
    return {"steps": len(lines), "timed": sum(_timed(ln) for ln in lines),
            "single_prefill": first_chunk_costs(lines), "token_counts": new_size_costs(lines),
            "stalls": stalls(lines), "after_pause": after_pause_costs(lines)}


def render(res: dict, command: str, about: str = "") -> str:
    md = ["# Where timed steps depart from the latency model", ""]
    if about:
        md += [about, ""]
    md += [f"Made by `{command}`: {res['steps']} steps, "
          f"{res['timed']} timed. Predicted is the model in use when the step ran.", "",
          "## One prefill, nothing else: measured / predicted", "",
          "| chunk | steps | median | mean |", "|---|---|---|---|"]
    for k, s in res["single_prefill"].items():
        md.append(f"| {k} | {s['steps']} | {s['median']:.3f} | {s['mean']:.3f} |")
    tc = res["token_counts"]
    md += ["", f"## Step token counts new to the trace ({tc['distinct_token_counts']} distinct)",
           "", "| token count | steps | median ms over | mean ms over |", "|---|---|---|---|"]
    for k in ("new", "seen"):
        if k in tc:
            md.append(f"| {k} | {tc[k]['steps']} | {tc[k]['median']:.1f} | {tc[k]['mean']:.1f} |")
    md += ["", f"## Stalls (measured > {STALL_RATIO:g}x predicted and >= {STALL_MS:g} ms)", ""]
    if res["stalls"]:
        md += ["| step | tokens | first chunk in it | predicted ms | measured ms | stage ms |",
               "|---|---|---|---|---|---|"]
        md += [f"| {s['step']} | {s['num_tokens']} | {s['first_chunk'] or '-'} | "
               f"{s['predicted_ms']:.0f} | {s['measured_ms']:.0f} | {s['stage_ms']} |"
               for s in res["stalls"]]
    else:
        md.append("none")
    md += ["", f"## Steps after a pause of {PAUSE_S:g} s or more that starts a prompt: "
           "measured / predicted", "",
           "| position | steps | median | mean |", "|---|---|---|---|"]
    for k, s in res.get("after_pause", {}).items():
        md.append(f"| {k} | {s['steps']} | {s['median']:.3f} | {s['mean']:.3f} |")
    if res.get("cell_starts"):
        md += ["", "## Cell starts: wall time to the second step's result over the model the "
               "engine fitted (ms)", "",
               "| policy | cells | median | mean | over 500 ms | per cell (new step sizes) |",
               "|---|---|---|---|---|---|"]
        for name, d in res["cell_starts"].items():
            per = ", ".join(f"{c['over_ms']:.0f} ({c['new_shapes']})" for c in d["cells"])
            md.append(f"| {name} | {d['steps']} | {d['median']:.0f} | {d['mean']:.0f} | "
                      f"{d['over_500ms']} | {per} |")
    if res.get("host_gaps"):
        md += ["", "## Host gaps between back-to-back prefill steps (ms)", "",
               "Interval between the two results minus the later step's forward, over timed "
               "steps: as the engine records them (the auto target uses their median floored "
               "at 0), and with the later step's rise over the one before taken out "
               "(`core.host_gap_ms`).", "",
               "| policy | steps | median, as recorded | median, rise out | "
               "rise out, median floored at 0 |", "|---|---|---|---|---|"]
        for name, d in res["host_gaps"].items():
            md.append(f"| {name} | {d['steps']} | {d['raw_median']:.1f} | {d['median']:.1f} | "
                      f"{d['used_median']:.1f} |")
    if res.get("intervals"):
        md += _render_intervals(res["intervals"])
    return "\n".join(md) + "\n"


def _render_intervals(iv: dict) -> list[str]:
    md = ["", "## Result intervals over the model's prediction", "",
          "Wall time from the result before a step with prefill work to the step's own, over "
          "the model's prediction of it given the results already back and the step before "
          "it (vLLM's batch queue, no host time; idle gaps left out). Slow: "
          f"{SLOW_RATIO:g}x or more; a stretch is {MIN_STRETCH} or more slow intervals in a "
          "row.", "",
          "| policy | cells | intervals | median | mean | slow share | over prediction (s) | "
          "of it in stretches (s) | stretches |", "|---|---|---|---|---|---|---|---|---|"]
    for name, d in iv.items():
        md.append(f"| {name} | {d['cells']} | {d['intervals']} | {d['median_ratio']:.3f} | "
                  f"{d['mean_ratio']:.3f} | {d['slow_share']:.1%} | {d['over_s']:.1f} | "
                  f"{d['stretch_over_s']:.1f} | {len(d['stretches'])} |")
    md += ["", "Time over prediction per cell (s):", "", "| policy | per cell |", "|---|---|"]
    for name, d in iv.items():
        cells = ", ".join(f"{k} {v:+.2f}" for k, v in d["over_s_per_cell"].items())
        md.append(f"| {name} | {cells} |")
    md += ["", "Time over prediction per interval, by the interval expected (ms): a cost per "
           "step the model lacks shows as the same ms in every row, a slow machine as a "
           "growing one.", "",
           "| policy | expected | intervals | median ms over | mean ms over | p90 ratio | "
           "slow share |", "|---|---|---|---|---|---|---|"]
    for name, d in iv.items():
        for k, b in d["over_by_expected"].items():
            md.append(f"| {name} | {k} | {b['intervals']} | {b['median_ms']:.1f} | "
                      f"{b['mean_ms']:.1f} | {b['p90_ratio']:.3f} | {b['slow_share']:.1%} |")
    worst = sorted(((s, name) for name, d in iv.items() for s in d["stretches"]),
                   key=lambda x: -x[0]["over_ms"])[:TOP_STRETCHES]
    if worst:
        md += ["", f"The {len(worst)} stretches with the most time over prediction "
               "(stage times of the timed steps in them over their prediction, stage 0 "
               "first):", "",
               "| policy | cell | first step | steps | seconds | over (ms) | median ratio | "
               "timed | stages over prediction |", "|---|---|---|---|---|---|---|---|---|"]
        for s, name in worst:
            stages = ", ".join(f"{x:.2f}" for x in s["stage_over_predicted"]) or "-"
            md.append(f"| {name} | {s['cell']} | {s['first_step']} | {s['steps']} | "
                      f"{s['seconds']:.2f} | "
                      f"{s['over_ms']:.0f} | {s['median_ratio']:.2f} | {s['timed']} | "
                      f"{stages} |")
    return md


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--out", default=None, help="output path without extension")
    ap.add_argument("--about", default="", help="a line on where the trace came from")
    ap.add_argument("--bench", default=None,
                    help="a one-engine bench_engine.py results JSON: add its cell starts")
    args = ap.parse_args(argv)
    lines = read_trace(args.trace)
    res = analyse(lines)
    if args.bench:
        from vllm_ascend_cpp.sim import refit_from_trace

        report_path = Path(args.trace + ".report.json")
        report = json.loads(report_path.read_text()) if report_path.exists() else {}
        model = refit_from_trace(lines, report.get("samples"))
        if model is None:
            raise SystemExit(f"no model can be fitted to {args.trace}")
        table = json.loads(Path(args.bench).read_text())["table"]
        stages = int(report.get("pp_size") or 2)
        res["cell_starts"] = cell_start_costs(lines, table, model, stages)
        res["host_gaps"] = host_gaps(lines, table, stages)
        res["intervals"] = result_intervals(lines, table, stages)
    command = f"python benchmarks/trace_costs.py {args.trace}" + (
        f" --bench {args.bench}" if args.bench else "") + (
        f" --out {args.out}" if args.out else "")
    text = render(res, command, args.about)
    print(text)
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
        Path(args.out + ".md").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
