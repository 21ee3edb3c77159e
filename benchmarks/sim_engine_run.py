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
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_engine import build_parser, cell_lengths  # noqa: E402
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


def served_setup(data: dict, host_ms: float
                 ) -> tuple[argparse.Namespace, ProfileInfo, EngineSpec]:
    """The run's bench arguments, its profile with the model the engine fitted to what it
    served, and a simulated engine of that model with ``host_ms`` per step."""
    meta = data["meta"]
    args = build_parser().parse_args(shlex.split(meta["command"])[2:])
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
        names = list(measured)
        pols = {n: info.policy(*policy_kind(n)) for n in names}
        kinds = {policy_kind(n)[0]: n for n in names}
        k = int(cell.split("-")[0][1:])
        variable = cell.endswith("-var")
        closed: dict[str, list[float]] = {n: [] for n in names}
        makespan: dict[str, list[float]] = {n: [] for n in names}
        same = bool(meta.get("arrivals_from")) and all(
            measured[n].get("arrivals_per_rep_s") for n in names)
        common: dict[str, dict[str, list[float]]] = {src: {n: [] for n in names}
                                                     for src in names + [RUN] * same}
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
                for n, p in pols.items():
                    common[src][n].append(simulate_policy(engine, p, fixed_arrivals).mean_ttft_ms)

        measured_ms = {n: measured[n]["ttft_per_rep_ms"] for n in names}
        row = {"cell": cell, "host_ms": host_ms,
               "measured_auto_vs_base": ratio(measured_ms, kinds, AUTO, BASE),
               "closed_auto_vs_base": ratio(closed, kinds, AUTO, BASE),
               "closed_makespan_auto_vs_base": ratio(makespan, kinds, AUTO, BASE),
               "same_arrivals_auto_vs_base": {src: ratio(common[src], kinds, AUTO, BASE)
                                              for src in common}}
        if "fixed" in kinds:
            row["measured_auto_vs_fixed"] = ratio(measured_ms, kinds, AUTO, "fixed")
            row["closed_auto_vs_fixed"] = ratio(closed, kinds, AUTO, "fixed")
            row["same_arrivals_auto_vs_fixed"] = {src: ratio(common[src], kinds, AUTO, "fixed")
                                                  for src in common}
        rows.append(row)
    return rows


def markdown(rows: list[dict], source: str, command: str) -> str:
    names = list(rows[0]["same_arrivals_auto_vs_base"])
    head = ("| host ms | cell | measured auto/base | simulated closed loop auto/base | "
            "closed-loop makespan auto/base | "
            + " | ".join(f"auto/base on {n}'s arrivals" for n in names)
            + " | measured auto/fixed | simulated closed loop auto/fixed | "
            + " | ".join(f"auto/fixed on {n}'s arrivals" for n in names) + " |")
    lines = ["# A real-engine A/B's cells in the simulator", "",
             f"Command: `{command}`", "",
             f"Source: `{source}` (its served model and prompt lengths, every round). "
             "Closed loop as the bench runs it, then every policy on the arrival times each "
             "policy's closed loop made"
             + ("; the run served the same arrivals to every policy (bench_engine.py "
                "--same-arrivals), so its measured ratios compare with the column on the "
                "run's arrivals" if RUN in names else "")
             + ". Geometric means over the rounds.", "",
             head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        same_b = " | ".join(f"{r['same_arrivals_auto_vs_base'][n]:.3f}" for n in names)
        same_f = " | ".join(f"{r.get('same_arrivals_auto_vs_fixed', {}).get(n, math.nan):.3f}"
                            for n in names)
        lines.append(
            f"| {r['host_ms']:g} | {r['cell']} | {r['measured_auto_vs_base']:.3f} | "
            f"{r['closed_auto_vs_base']:.3f} | {r['closed_makespan_auto_vs_base']:.3f} | "
            f"{same_b} | {r.get('measured_auto_vs_fixed', math.nan):.3f} | "
            f"{r.get('closed_auto_vs_fixed', math.nan):.3f} | {same_f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="a bench_engine.py --one-engine results JSON")
    ap.add_argument("--host-ms", type=float, nargs="+", default=[0.0],
                    help="host time per step to simulate (ms), one run each")
    ap.add_argument("--out", default=None, help="output stem (JSON and Markdown)")
    args = ap.parse_args(argv)
    data = json.loads(Path(args.results).read_text())
    rows = [row for host in args.host_ms for row in replay(data, host)]
    command = "python benchmarks/sim_engine_run.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    text = markdown(rows, args.results, command)
    print(text)
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(
            {"command": command, "source": args.results, "rows": rows}, indent=1))
        Path(args.out + ".md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
