"""Pool the rounds of several engine A/B runs of the same plugin code and judge the bars again.

One `bench_engine.py --one-engine` run gives five rounds per cell; on these machines the
per-round ratios of auto over the tuned fixed budget spread by +-5%, so a 95% interval is
about +-3% wide and a bar of 1.02x is "not resolvable" in most cells whatever the truth is.
Every per-round ratio is paired within its round (same engine, same minute), so rounds from
several runs, even on different machines, are samples of the same thing as long as the plugin
code, the policies and the workload were the same. This script checks that, concatenates the
per-round ratios of each bar row, and gives the pooled point, interval and verdict with the
same rules as `bench_engine.py` (`bar_verdict`, `ratio_stats.ratio`). The TTFT bars at each
policy's usual speed (`adjusted`, `benchmarks/cell_speed.py`) are pooled the same way when every
pooled run recorded them.

Provenance: a run's plugin code is the git tree of `vllm_ascend_cpp/` at the commit that last
wrote its results file, or, for a file not committed yet, the working tree's (refused when
`vllm_ascend_cpp/` has uncommitted changes). Runs of different code, or of a different
workload (mode, prompt and output length, auto budget and base chunk), are refused; a bar row
(setting, policy, baseline, metric) that some run lacks is left out, or with `--partial` pooled
over the runs that have it (a concurrency-2 run pooled with full runs).

    python benchmarks/pool_bars.py RUN.json RUN.json ... [--partial] --out benchmarks/results/NAME
Writes NAME.json and NAME.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import ratio_stats as rs  # noqa: E402
from benchmarks.bench_engine import bar_verdict  # noqa: E402

# What must agree between runs for their rounds to be samples of one thing. The dtype follows
# the machine (bfloat16 where the CPU has AVX-512, float32 elsewhere), and so does the speed:
# the same cell ran about 2.5 times faster on a bfloat16 machine than on a float32 one.
_SAME = ("mode", "prompt_len", "output_len", "auto_budget", "auto_base", "dtype")


def _git(*args: str) -> str:
    out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                         check=False)
    return out.stdout.strip() if out.returncode == 0 else ""


def _in_repo(path: Path) -> str:
    """``path`` relative to the repository ("" when it lies outside)."""
    full = path.resolve()
    return str(full.relative_to(ROOT)) if full.is_relative_to(ROOT) else ""


def plugin_tree(path: Path) -> str:
    """The git tree of ``vllm_ascend_cpp/`` the run at ``path`` was made with ("" unknown)."""
    rel = _in_repo(path)
    committed = rel and not _git("status", "--porcelain", "--", rel)
    commit = _git("log", "-1", "--format=%H", "--", rel) if committed else ""
    if commit:
        return _git("rev-parse", f"{commit}:vllm_ascend_cpp")
    if _git("status", "--porcelain", "--", "vllm_ascend_cpp"):
        return ""  # uncommitted plugin changes: the code of the run is not known
    return _git("rev-parse", "HEAD:vllm_ascend_cpp")


def _how(bar: str) -> tuple[str, float]:
    op, value = bar.split()
    return ("le" if op == "<=" else "ge"), float(value.rstrip("x"))


def pool(runs: list[dict], names: list[str], trees: list[str] | None = None, *,
         partial: bool = False) -> dict:
    """The bars of ``runs`` with their rounds pooled; raises ValueError when the runs are not
    of one workload and one plugin code. ``partial`` pools a row over the runs that have it
    instead of leaving it out."""
    if not runs:
        raise ValueError("nothing to pool")
    first = runs[0]["meta"]
    for name, run in zip(names, runs, strict=True):
        meta = run["meta"]
        diff = [k for k in _SAME if meta.get(k) != first.get(k)]
        if diff:
            raise ValueError(f"{name} differs from {names[0]} in {', '.join(diff)}")
    if trees is not None:
        if not all(trees):
            raise ValueError("the plugin code of a run is not known: "
                             + ", ".join(n for n, t in zip(names, trees, strict=True) if not t))
        if len(set(trees)) > 1:
            raise ValueError("runs of different plugin code: " + ", ".join(
                f"{n} {t[:10]}" for n, t in zip(names, trees, strict=True)))
    rows: dict[tuple, dict] = {}
    for name, run in zip(names, runs, strict=True):
        for b in run.get("bars", []):
            key = (b["key"], b["policy"], b["baseline"], b["metric"], b["bar"])
            row = rows.setdefault(key, {"key": b["key"], "policy": b["policy"],
                                        "baseline": b["baseline"], "metric": b["metric"],
                                        "bar": b["bar"], "values": [], "adjusted": [],
                                        "per_run": {}})
            row["values"] += b["ratio"]["values"]
            adj = b.get("adjusted")
            if adj is None or row["adjusted"] is None:
                row["adjusted"] = None  # a run without it: no pooled figure at usual speed
            else:
                row["adjusted"] += adj["ratio"]["values"]
            row["per_run"][name] = {"quoted": b["ratio"]["quoted"], "verdict": b["verdict"]}
            if adj is not None:
                row["per_run"][name]["adjusted"] = {"quoted": adj["ratio"]["quoted"],
                                                    "verdict": adj["verdict"]}
    out = []
    for row in rows.values():
        if len(row["per_run"]) != len(runs) and not partial:
            continue  # a row some run lacks is not pooled
        how, bar = _how(row["bar"])
        r = rs.ratio(row.pop("values"))
        adj_values = row.pop("adjusted")
        pooled = {**row, "ratio": r.to_dict(), "verdict": bar_verdict(r, bar, how),
                  "point_on_the_right_side": r.point <= bar if how == "le" else r.point >= bar}
        if adj_values:
            a = rs.ratio(adj_values)
            pooled["adjusted"] = {"ratio": a.to_dict(), "verdict": bar_verdict(a, bar, how)}
        out.append(pooled)
    return {"runs": names, "plugin_tree": trees[0] if trees else None,
            "meta": {k: first.get(k) for k in _SAME}, "bars": out}


def markdown(res: dict, command: str) -> str:
    runs = res["runs"]
    labels = " | ".join(Path(r).stem.removeprefix("engine_bench_") for r in runs)
    lines = ["# Engine A/B bars, rounds pooled over runs of one plugin code", "",
             f"Command: `{command}`", "",
             f"Runs: {', '.join(f'`{r}`' for r in runs)}"
             + (f"; plugin code `vllm_ascend_cpp/` tree {res['plugin_tree'][:10]}"
                if res.get("plugin_tree") else "") + ". "
             "Each per-round ratio is paired within its round; the pooled figure is the geometric "
             "mean of every round's ratio with a 95% bootstrap interval, judged as "
             "`bench_engine.py` judges one run (met / missed only when the interval is wholly "
             "on one side of the bar).", "",
             "| setting | policy | against | metric | bar | "
             + labels
             + " | pooled [95% interval] | rounds | result | point within bar |",
             "|---|---|---|---|---|" + "---|" * len(runs) + "---|---|---|---|"]
    for b in res["bars"]:
        per = " | ".join(b["per_run"][r]["quoted"] if r in b["per_run"] else "-" for r in runs)
        lines.append(f"| {b['key']} | {b['policy']} | {b['baseline']} | {b['metric']} | "
                     f"{b['bar']} | {per} | {b['ratio']['quoted']} | {len(b['ratio']['values'])}"
                     f" | {b['verdict']} | {'yes' if b['point_on_the_right_side'] else 'no'} |")
    adjusted = [b for b in res["bars"] if "adjusted" in b]
    if adjusted:
        lines += ["", "The TTFT bars at each policy's usual speed (each run's `adjusted` rounds, "
                  "pooled the same way; the raw ratios above stay the verdict):", "",
                  "| setting | policy | against | bar | "
                  + labels
                  + " | pooled at usual speed | rounds | result |",
                  "|---|---|---|---|" + "---|" * len(runs) + "---|---|---|"]
        for b in adjusted:
            per = " | ".join(b["per_run"][r]["adjusted"]["quoted"]
                             if "adjusted" in b["per_run"].get(r, {}) else "-" for r in runs)
            a = b["adjusted"]
            lines.append(f"| {b['key']} | {b['policy']} | {b['baseline']} | {b['bar']} | "
                         f"{per} | {a['ratio']['quoted']} | {len(a['ratio']['values'])} | "
                         f"{a['verdict']} |")
    met = sum(b["verdict"] == "met" for b in res["bars"])
    missed = sum(b["verdict"] == "missed" for b in res["bars"])
    points = sum(b["point_on_the_right_side"] for b in res["bars"])
    lines += ["", f"Pooled: {met} of {len(res['bars'])} bars met, {missed} missed, the rest not "
              f"resolvable; the point estimate is within the bar in {points} of "
              f"{len(res['bars'])}.", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="bench_engine results JSON files")
    ap.add_argument("--out", required=True, help="output path without suffix")
    ap.add_argument("--partial", action="store_true",
                    help="pool a bar row over the runs that have it instead of leaving it out")
    a = ap.parse_args()
    paths = [Path(p) for p in a.runs]
    runs = [json.loads(p.read_text()) for p in paths]
    names = [_in_repo(p) or str(p) for p in paths]
    try:
        res = pool(runs, names, [plugin_tree(p) for p in paths], partial=a.partial)
    except ValueError as e:
        print(f"pool_bars: {e}", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    command = "python benchmarks/pool_bars.py " + " ".join(sys.argv[1:])
    text = markdown(res, command)
    out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
