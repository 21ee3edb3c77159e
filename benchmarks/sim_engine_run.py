"""A real-engine A/B's cells in the simulator: choices or traffic?

`bench_engine.py` runs closed-loop clients: a client sends its next prompt when its last request
has finished, so a policy that finishes requests sooner also changes when the next ones arrive.
This script takes a one-engine results JSON and replays every cell and round of it in the
pipeline simulator, with the model the engine fitted to what it served (`meta.coefficients`)
and the host time per step given: first as the bench ran it (closed loop), then with every
policy serving the arrival times each policy's closed loop made. Where auto is behind base in
the closed loop but not on any common arrival list, the loss is the traffic, not the choices.
A run made with `--same-arrivals` served every policy one recorded arrival list per cell and
round; those lists are replayed too ("the run's arrivals"), the simulator's view of exactly the
traffic the engine served.

    python benchmarks/sim_engine_run.py benchmarks/results/engine_bench_auto_vs_base_flow.json \
        --host-ms 0 17 34 --out benchmarks/results/sim_engine_run_flow

Ratios are geometric means over the rounds of the per-round ratio of mean TTFTs; the measured
column is the real engine's (the same per-round pairing, from the JSON).

On the run's arrivals every request is also set against its simulated self: each policy's
measured TTFT over the simulator's for that request, and auto's TTFT minus base's, measured and
simulated. A policy mean hides where a difference sits: in a same-arrivals run the first wave
(every client at once, nothing in flight) is the same queue in every round, so one choice the
policies make there is counted once per round. Several results files pool into one per-request
table (the cells and policies they share); policies other than the standard fixed, base and auto
ones (``--extra-policy``) are left out. Where a cell ran several fixed budgets, "auto/fixed" is
against the cell's tuned one (the lowest median TTFT over the rounds, as the bench picks it),
named in its own column; where it ran CPP base at prompt/8 and at prompt/4, "auto/base" is
against prompt/8's, the base of the bench's bars.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_engine import (  # noqa: E402
    bench_base,
    build_parser,
    cell_lengths,
    tuned_fixed,
)
from vllm_ascend_cpp.core.latency_model import LatencyModel  # noqa: E402
from vllm_ascend_cpp.sim import (  # noqa: E402
    EngineSpec,
    ProfileInfo,
    Workload,
    load_profile,
    simulate_policy,
)

AUTO, BASE = "cpp-auto", "cpp-base"
# The arrival list of a same-arrivals run (bench_engine.py --same-arrivals), a column of its own.
RUN = "the run"


def policy_kind(name: str) -> tuple[str, int]:
    """`fixed-1024` -> ("fixed", 1024); `cpp-auto-8192` -> ("cpp-auto", 8192)."""
    kind, budget = name.rsplit("-", 1)
    return kind, int(budget)


def geomean(values: list[float]) -> float:
    good = [v for v in values if math.isfinite(v) and v > 0]
    return math.exp(sum(math.log(v) for v in good) / len(good)) if good else math.nan


def ratio(series: dict[str, list[float]], kinds: dict[str, str], a: str, b: str) -> float:
    """Geometric mean over the rounds of policy kind ``a``'s value over ``b``'s."""
    return geomean([x / y for x, y in zip(series[kinds[a]], series[kinds[b]])])


def saved_arguments(command: str) -> list[str]:
    """The bench arguments of a saved command line. Results files keep the command as text
    with a note in parentheses after two spaces (code and machine) and the JSON of each
    ``--extra-policy`` unquoted, so neither survives ``shlex`` as written."""
    command = command.split("  (")[0]
    command = re.sub(r"(--extra-policy )(\S+?:\d+:\{.*?\})(?= --|$)",
                     lambda m: m.group(1) + shlex.quote(m.group(2)), command)
    return shlex.split(command)[2:]


def parses(name: str) -> bool:
    """Whether a policy name is one of the standard three kinds this script can rebuild."""
    try:
        kind, _ = policy_kind(name)
    except ValueError:
        return False
    return kind in ("fixed", AUTO, BASE)


def served_setup(data: dict, host_ms: float
                 ) -> tuple[argparse.Namespace, ProfileInfo, EngineSpec]:
    """The run's bench arguments, its profile with the model the engine fitted to what it
    served, and a simulated engine of that model with ``host_ms`` per step."""
    meta = data["meta"]
    args = build_parser().parse_args(saved_arguments(meta["command"]))
    model = LatencyModel(**meta["coefficients"])
    info = replace(load_profile({"coefficients": meta["startup_coefficients"], "pp_size": 2}),
                   model=model)
    engine = EngineSpec(stages=info.pp_size or 2, model=model, block_size=info.block_size,
                        sched_ms=float(host_ms))
    return args, info, engine


def replay(data: dict, host_ms: float) -> list[dict]:
    meta = data["meta"]
    args, info, engine = served_setup(data, host_ms)
    rows = []
    for cell, measured in data["table"].items():
        names = [n for n in measured if parses(n)]
        pols = {n: info.policy(*policy_kind(n)) for n in names}
        kinds = {policy_kind(n)[0]: n for n in names}
        # The cell's tuned fixed budget, as the bench picks it: "auto/fixed" is against it.
        fixed = tuned_fixed({n: measured[n] for n in names})
        if fixed is not None:
            kinds["fixed"] = fixed
        # With base at prompt/8 and prompt/4 in one run, "auto/base" is against the bars' base.
        base = bench_base(args.prompt_len)
        if base in names:
            kinds[BASE] = base
        k = int(cell.split("-")[0][1:])
        variable = cell.endswith("-var")
        closed: dict[str, list[float]] = {n: [] for n in names}
        makespan: dict[str, list[float]] = {n: [] for n in names}
        same = bool(meta.get("arrivals_from")) and all(
            measured[n].get("arrivals_per_rep_s") for n in names)
        common: dict[str, dict[str, list[float]]] = {src: {n: [] for n in names}
                                                     for src in names + [RUN] * same}
        # Per round, each request's (measured, simulated) TTFT per policy on the run's arrivals
        # (only when the run served them and kept every request's TTFT).
        by_request: list[list[dict[str, tuple[float, float]]]] = []
        keep_requests = same and all(measured[n].get("ttfts_per_rep_ms") for n in names)
        for rnd in range(meta["reps"]):
            lens, _ = cell_lengths(args, k, variable, rnd)
            wl = Workload(concurrency=k, prompt_len=max(lens), output_len=args.output_len,
                          prompts=tuple(lens))
            runs = {n: simulate_policy(engine, p, wl) for n, p in pols.items()}
            for n, r in runs.items():
                closed[n].append(r.mean_ttft_ms)
                makespan[n].append(r.makespan_ms)
            sources = {src: r.arrival_ms for src, r in runs.items()}
            if same:
                # A same-arrivals run: every policy served these times, so the simulator can
                # serve exactly what the engine did.
                sources[RUN] = [t * 1e3 for t in measured[names[0]]["arrivals_per_rep_s"][rnd]]
            for src, times in sources.items():
                fixed_arrivals = replace(wl, arrivals_ms=tuple(times))
                sims = {n: simulate_policy(engine, p, fixed_arrivals) for n, p in pols.items()}
                for n, r in sims.items():
                    common[src][n].append(r.mean_ttft_ms)
                if src == RUN and keep_requests:
                    by_request.append(request_pairs(measured, sims, rnd))

        measured_ms = {n: measured[n]["ttft_per_rep_ms"] for n in names}
        row = {"cell": cell, "host_ms": host_ms, "base": kinds.get(BASE),
               "measured_auto_vs_base": ratio(measured_ms, kinds, AUTO, BASE),
               "closed_auto_vs_base": ratio(closed, kinds, AUTO, BASE),
               "closed_makespan_auto_vs_base": ratio(makespan, kinds, AUTO, BASE),
               "same_arrivals_auto_vs_base": {src: ratio(common[src], kinds, AUTO, BASE)
                                              for src in common}}
        if fixed is not None:
            row["fixed"] = fixed
            row["measured_auto_vs_fixed"] = ratio(measured_ms, kinds, AUTO, "fixed")
            row["closed_auto_vs_fixed"] = ratio(closed, kinds, AUTO, "fixed")
            row["same_arrivals_auto_vs_fixed"] = {src: ratio(common[src], kinds, AUTO, "fixed")
                                                  for src in common}
        if by_request:
            row["rounds_by_request"] = by_request
            row["arrivals_by_round_s"] = measured[names[0]]["arrivals_per_rep_s"]
        rows.append(row)
    return rows


def request_pairs(measured: dict, sims: dict, rnd: int) -> list[dict[str, tuple[float, float]]]:
    """Each request of round ``rnd`` (prompt order): policy -> (measured, simulated) TTFT ms."""
    return [{n: (float(measured[n]["ttfts_per_rep_ms"][rnd][i]), float(r.ttft_ms[i]))
             for n, r in sims.items()}
            for i in range(len(next(iter(sims.values())).ttft_ms))]


def by_request(rows: list[dict]) -> list[dict]:
    """Per cell, host time and request (pooled over the rows' sources and rounds): each
    policy's measured TTFT over the simulated one (median), and auto's TTFT minus base's,
    measured (median and mean) and simulated (mean), in ms."""
    # (host, cell, request) -> (arrival s, policy -> (measured, simulated), the row's base)
    # per round.
    pooled: dict[tuple, list[tuple[float, dict[str, tuple[float, float]], str | None]]] = {}
    for row in rows:
        for rnd, pairs_by_request in enumerate(row.get("rounds_by_request", [])):
            for i, pairs in enumerate(pairs_by_request):
                pooled.setdefault((row["host_ms"], row["cell"], i), []).append(
                    (row["arrivals_by_round_s"][rnd][i], pairs, row.get("base")))
    out = []
    for (host, cell, i), seen in sorted(pooled.items()):
        rounds = [pairs for _, pairs, _ in seen]
        names = [n for n in rounds[0] if all(n in r for r in rounds)]
        entry = {"host_ms": host, "cell": cell, "request": i, "rounds": len(rounds),
                 "arrival_s_median": statistics.median(t for t, _, _ in seen),
                 "measured_over_simulated": {
                     n: statistics.median(r[n][0] / r[n][1] for r in rounds) for n in names}}
        kinds = {policy_kind(n)[0]: n for n in names}
        bases = {b for _, _, b in seen}
        if len(bases) == 1 and bases <= set(names):  # None, a row without a base, is no name
            kinds[BASE] = bases.pop()
        if AUTO in kinds and BASE in kinds:
            a, b = kinds[AUTO], kinds[BASE]
            real = [r[a][0] - r[b][0] for r in rounds]
            entry["auto_minus_base_ms"] = {
                "measured_median": statistics.median(real), "measured_mean": statistics.mean(real),
                "simulated_mean": statistics.mean(r[a][1] - r[b][1] for r in rounds)}
        out.append(entry)
    return out


def markdown(rows: list[dict], sources: list[str], command: str) -> str:
    # Every arrival list any row has, in first-seen order (a run may lack fixed 1024).
    names = list(dict.fromkeys(n for r in rows for n in r["same_arrivals_auto_vs_base"]))
    many = len(sources) > 1
    head = ("| " + "source | " * many + "host ms | cell | base | measured auto/base | "
            "simulated closed loop auto/base | closed-loop makespan auto/base | "
            + " | ".join(f"auto/base on {n}'s arrivals" for n in names)
            + " | tuned fixed | measured auto/fixed | simulated closed loop auto/fixed | "
            + " | ".join(f"auto/fixed on {n}'s arrivals" for n in names) + " |")
    listed = ", ".join(f"`{s}`" for s in sources)
    lines = ["# A real-engine A/B's cells in the simulator", "",
             f"Command: `{command}`", "",
             f"Source{'s' * many}: {listed} (the served model and prompt lengths, every round). "
             "Closed loop as the bench runs it, then every policy on the arrival times each "
             "policy's closed loop made"
             + ("; the run served the same arrivals to every policy (bench_engine.py "
                "--same-arrivals), so its measured ratios compare with the column on the "
                "run's arrivals" if RUN in names else "")
             + ". Geometric means over the rounds.", "",
             head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        same_b = " | ".join(f"{r['same_arrivals_auto_vs_base'].get(n, math.nan):.3f}"
                            for n in names)
        same_f = " | ".join(f"{r.get('same_arrivals_auto_vs_fixed', {}).get(n, math.nan):.3f}"
                            for n in names)
        lines.append(
            "| " + (f"{Path(r['source']).stem} | " if many else "")
            + f"{r['host_ms']:g} | {r['cell']} | {r.get('base') or '-'} | "
            f"{r['measured_auto_vs_base']:.3f} | "
            f"{r['closed_auto_vs_base']:.3f} | {r['closed_makespan_auto_vs_base']:.3f} | "
            f"{same_b} | {r.get('fixed', '-')} | "
            f"{r.get('measured_auto_vs_fixed', math.nan):.3f} | "
            f"{r.get('closed_auto_vs_fixed', math.nan):.3f} | {same_f} |")
    per_request = by_request(rows)
    if per_request:
        policies = list(per_request[0]["measured_over_simulated"])
        lines += ["", "## Each request on the run's arrivals", "",
                  "Requests in prompt order within a round (the first wave arrives at 0 s), "
                  "pooled over the rounds" + (" of every source" if many else "") + ": each "
                  "policy's measured TTFT over the simulator's for the same request (median), "
                  "and auto's TTFT minus base's, measured and simulated (ms). Where the "
                  "measured difference departs from the simulated one the engine did "
                  "something the simulator, with the same model and arrivals, does not.", "",
                  "| host ms | cell | request | rounds | arrival s (median) | "
                  + " | ".join(f"{n} measured/simulated" for n in policies)
                  + " | auto-base measured median | measured mean | simulated mean |",
                  "|" + "---|" * (8 + len(policies))]
        for e in per_request:
            diff = e.get("auto_minus_base_ms", {})
            lines.append(
                f"| {e['host_ms']:g} | {e['cell']} | {e['request']} | {e['rounds']} | "
                f"{e['arrival_s_median']:.1f} | "
                + " | ".join(f"{e['measured_over_simulated'].get(n, math.nan):.3f}"
                             for n in policies)
                + f" | {diff.get('measured_median', math.nan):+.0f} | "
                f"{diff.get('measured_mean', math.nan):+.0f} | "
                f"{diff.get('simulated_mean', math.nan):+.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+",
                    help="bench_engine.py --one-engine results JSONs (several: pooled per "
                         "request)")
    ap.add_argument("--host-ms", type=float, nargs="+", default=[0.0],
                    help="host time per step to simulate (ms), one run each")
    ap.add_argument("--out", default=None, help="output stem (JSON and Markdown)")
    args = ap.parse_args(argv)
    rows = []
    for source in args.results:
        data = json.loads(Path(source).read_text())
        for host in args.host_ms:
            rows += [{"source": source, **row} for row in replay(data, host)]
    command = "python benchmarks/sim_engine_run.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    text = markdown(rows, args.results, command)
    print(text)
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(
            {"command": command, "sources": args.results, "rows": rows,
             "by_request": by_request(rows)}, indent=1))
        Path(args.out + ".md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
