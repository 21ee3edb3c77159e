"""benchmarks/sim_engine_run.py: a real-engine A/B's cells replayed in the simulator."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from benchmarks import sim_engine_run as ser
from benchmarks.bench_engine import build_parser, cell_lengths, cells
from vllm_ascend_cpp.core import LatencyModel
from vllm_ascend_cpp.sim import EngineSpec, Workload, load_profile, simulate_policy

MODEL = LatencyModel(a=2.6e-6, b=0.021, c=0.65, gamma=3.6e-4, d=2.5e-6)
COMMAND = ("python benchmarks/bench_engine.py --one-engine --reps 2 --concurrency 2 "
           "--requests-per-client 2 --variable --prompt-len 4096 --output-len 8 "
           "--only fixed-1024 cpp-base-512 cpp-auto-8192")


def results() -> dict:
    names = ["fixed-1024", "cpp-base-512", "cpp-auto-8192"]
    ttft = {"fixed-1024": [100.0, 200.0], "cpp-base-512": [100.0, 100.0],
            "cpp-auto-8192": [110.0, 90.0]}
    return {"meta": {"command": COMMAND, "reps": 2, "coefficients": MODEL.to_dict(),
                     "startup_coefficients": MODEL.to_dict()},
            "table": {cell: {n: {"ttft_per_rep_ms": ttft[n],
                                 "ttft_ms": {"median": statistics.median(ttft[n])}}
                             for n in names}
                      for cell in ("c2-fixed", "c2-var")}}


def test_against_fixed_means_the_cells_tuned_fixed_budget(tmp_path) -> None:
    # Two fixed budgets, the faster one listed first and the faster one differing by cell:
    # each cell's ratio is against its own fastest, and the row names it.
    data = results()
    data["meta"]["command"] = COMMAND.replace("--only fixed-1024", "--only fixed-512 fixed-1024")
    ttft_512 = {"c2-fixed": [80.0, 100.0], "c2-var": [300.0, 300.0]}
    for cell, pols in data["table"].items():
        data["table"][cell] = {"fixed-512": {
            "ttft_per_rep_ms": ttft_512[cell],
            "ttft_ms": {"median": statistics.median(ttft_512[cell])}}, **pols}
    rows = ser.replay(data, 0.0)
    assert [(r["cell"], r["fixed"]) for r in rows] == [("c2-fixed", "fixed-512"),
                                                       ("c2-var", "fixed-1024")]
    # auto 110, 90 over fixed 512's 80, 100; over fixed 1024's 100, 200.
    assert rows[0]["measured_auto_vs_fixed"] == pytest.approx(math.sqrt(110 / 80 * 90 / 100))
    assert rows[1]["measured_auto_vs_fixed"] == pytest.approx(math.sqrt(1.1 * 0.45))
    assert "| tuned fixed |" in ser.markdown(rows, ["run"], "cmd")
    assert "| fixed-512 | " in ser.markdown(rows, ["run"], "cmd")


def test_against_base_means_the_bars_base_at_prompt_over_8(tmp_path) -> None:
    # Base at prompt/4 listed after base at prompt/8 (4096 // 8 = 512): the ratios and each
    # request's difference stay against prompt/8's, and the row names it.
    data = results()
    data["meta"]["command"] = COMMAND.replace("cpp-base-512", "cpp-base-512 cpp-base-1024")
    data["meta"]["arrivals_from"] = "fixed-1024"
    served = [[0.0, 0.0, 0.3, 0.5], [0.0, 0.0, 0.1, 0.2]]
    real = {"cpp-base-512": [[1000.0] * 4] * 2, "cpp-base-1024": [[500.0] * 4] * 2,
            "cpp-auto-8192": [[1100.0] * 4] * 2, "fixed-1024": [[2000.0] * 4] * 2}
    for pols in data["table"].values():
        pols["cpp-base-1024"] = {"ttft_per_rep_ms": [50.0, 50.0], "ttft_ms": {"median": 50.0}}
        for n, v in pols.items():
            v["arrivals_per_rep_s"] = served
            v["ttfts_per_rep_ms"] = real[n]
    rows = ser.replay(data, 0.0)
    assert [r["base"] for r in rows] == ["cpp-base-512", "cpp-base-512"]
    assert rows[0]["measured_auto_vs_base"] == pytest.approx(math.sqrt(1.1 * 0.9))
    assert set(rows[0]["same_arrivals_auto_vs_base"]) >= {"cpp-base-512", "cpp-base-1024"}
    diffs = [e["auto_minus_base_ms"]["measured_mean"] for e in ser.by_request(rows)]
    assert diffs == pytest.approx([100.0] * 8)
    assert "| c2-var | cpp-base-512 | " in ser.markdown(rows, ["run"], "cmd")


def test_cell_lengths_are_the_ones_the_bench_sends() -> None:
    args = build_parser().parse_args(COMMAND.split()[2:])
    for rnd in range(2):
        sent = {key: [len(p) for p in prompts] for key, _, prompts in cells(args, rnd)}
        assert sent["c2-fixed"] == cell_lengths(args, 2, False, rnd)[0] == [4096] * 4
        assert sent["c2-var"] == cell_lengths(args, 2, True, rnd)[0]
        assert len(set(sent["c2-var"])) > 1


def test_replay_pairs_rounds_and_replays_each_policys_arrivals(tmp_path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(results()))
    out = tmp_path / "sim"
    assert ser.main([str(path), "--host-ms", "0", "2", "--out", str(out)]) == 0
    rows = json.loads((out.with_suffix(".json")).read_text())["rows"]
    assert [(r["cell"], r["host_ms"]) for r in rows] == [
        ("c2-fixed", 0.0), ("c2-var", 0.0), ("c2-fixed", 2.0), ("c2-var", 2.0)]
    # Measured ratios pair the rounds: sqrt(1.1 * 0.9) against base, sqrt(1.1 * 0.45) fixed.
    assert rows[0]["measured_auto_vs_base"] == pytest.approx(math.sqrt(1.1 * 0.9))
    assert rows[0]["measured_auto_vs_fixed"] == pytest.approx(math.sqrt(1.1 * 0.45))
    # One figure against the simulator run directly: fixed prompts (alike in both rounds),
    # auto and base both on base's closed-loop arrival times.
    args = build_parser().parse_args(COMMAND.split()[2:])
    lens = tuple(cell_lengths(args, 2, False, 0)[0])
    engine = EngineSpec(stages=2, model=MODEL, sched_ms=2.0)
    wl = Workload(concurrency=2, prompt_len=max(lens), output_len=8, prompts=lens)
    info = load_profile({"coefficients": MODEL.to_dict(), "pp_size": 2})
    base, auto = info.policy("cpp-base", 512), info.policy("cpp-auto", 8192)
    arrivals = simulate_policy(engine, base, wl).arrival_ms
    on_base = Workload(concurrency=2, prompt_len=max(lens), output_len=8, prompts=lens,
                       arrivals_ms=tuple(arrivals))
    direct = (simulate_policy(engine, auto, on_base).mean_ttft_ms
              / simulate_policy(engine, base, on_base).mean_ttft_ms)
    assert rows[2]["same_arrivals_auto_vs_base"]["cpp-base-512"] == pytest.approx(direct)
    text = out.with_suffix(".md").read_text()
    assert "cpp-auto-8192's arrivals" in text and "| 2 | c2-var |" in text


def test_a_same_arrivals_run_is_also_replayed_on_the_arrivals_it_served(tmp_path) -> None:
    data = results()
    data["meta"]["arrivals_from"] = "fixed-1024"
    # Round 0 spreads the second wave far apart (nobody queues), round 1 sends it at once.
    served = [[0.0, 0.0, 100.0, 200.0], [0.0, 0.0, 0.0, 0.0]]
    for cell in data["table"].values():
        for v in cell.values():
            v["arrivals_per_rep_s"] = served
    rows = ser.replay(data, 0.0)
    assert all(ser.RUN in r["same_arrivals_auto_vs_base"] for r in rows)
    # Against the simulator run directly on round 0's and round 1's times, fixed prompts.
    args = build_parser().parse_args(COMMAND.split()[2:])
    info = load_profile({"coefficients": MODEL.to_dict(), "pp_size": 2})
    engine = EngineSpec(stages=2, model=MODEL, sched_ms=0.0)
    base, auto = info.policy("cpp-base", 512), info.policy("cpp-auto", 8192)
    ratios = []
    for rnd, times in enumerate(served):
        lens = tuple(cell_lengths(args, 2, False, rnd)[0])
        wl = Workload(concurrency=2, prompt_len=max(lens), output_len=8, prompts=lens,
                      arrivals_ms=tuple(t * 1e3 for t in times))
        ratios.append(simulate_policy(engine, auto, wl).mean_ttft_ms
                      / simulate_policy(engine, base, wl).mean_ttft_ms)
    assert rows[0]["same_arrivals_auto_vs_base"][ser.RUN] == pytest.approx(
        math.sqrt(ratios[0] * ratios[1]))
    text = ser.markdown(rows, ["run.json"], "x")
    assert "on the run's arrivals" in text and "--same-arrivals" in text
    # A closed-loop run (no arrivals_from) has no such column.
    assert ser.RUN not in ser.replay(results(), 0.0)[0]["same_arrivals_auto_vs_base"]


def test_a_saved_command_with_a_note_and_extra_policies_parses() -> None:
    # As results files keep it: the JSON unquoted, a note in parentheses after two spaces.
    saved = (COMMAND + ' --extra-policy cpp-auto-in-4096:4096:{"target": "auto", '
             '"min_chunk": 512} --arrivals-from cpp-base-512  (main\'s code, 1234abc\'s '
             'tree; float32)')
    args = build_parser().parse_args(ser.saved_arguments(saved))
    assert args.only == ["fixed-1024", "cpp-base-512", "cpp-auto-8192"]
    assert args.arrivals_from == "cpp-base-512"
    assert [p["cpp"] for p in args.extra_policy] == [{"target": "auto", "min_chunk": 512}]
    # Names this script cannot rebuild are left out of a replay, not an error.
    assert ser.parses("cpp-auto-8192") and ser.parses("fixed-1024")
    assert not ser.parses("cpp-auto-in-4096") and not ser.parses("cpp-auto-8192-m512")


def test_each_request_is_set_against_the_simulator_on_the_arrivals_it_served(tmp_path) -> None:
    data = results()
    data["meta"]["arrivals_from"] = "fixed-1024"
    served = [[0.0, 0.0, 0.3, 0.5], [0.0, 0.0, 0.1, 0.2]]
    # Measured: base 1,000 ms for every request; auto 100 ms more on the first, 50 on the
    # second in round 0 and 150 in round 1, level on the others; fixed 2,000 ms.
    real = {"cpp-base-512": [[1000.0] * 4] * 2,
            "cpp-auto-8192": [[1100.0, 1050.0, 1000.0, 1000.0],
                              [1100.0, 1150.0, 1000.0, 1000.0]],
            "fixed-1024": [[2000.0] * 4] * 2}
    for cell in data["table"].values():
        for n, v in cell.items():
            v["arrivals_per_rep_s"] = served
            v["ttfts_per_rep_ms"] = real[n]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    out = tmp_path / "sim"
    # The same file twice: pooled, every request has twice the rounds and the same medians.
    assert ser.main([str(path), str(path), "--out", str(out)]) == 0
    saved = json.loads(out.with_suffix(".json").read_text())
    entries = {(e["cell"], e["request"]): e for e in saved["by_request"]}
    assert len(entries) == 8 and all(e["rounds"] == 4 for e in entries.values())
    # Against the simulator run directly on each round's arrivals, fixed prompts.
    args = build_parser().parse_args(COMMAND.split()[2:])
    info = load_profile({"coefficients": MODEL.to_dict(), "pp_size": 2})
    engine = EngineSpec(stages=2, model=MODEL, sched_ms=0.0)
    sim = {n: [] for n in real}
    for rnd, times in enumerate(served):
        lens = tuple(cell_lengths(args, 2, False, rnd)[0])
        wl = Workload(concurrency=2, prompt_len=max(lens), output_len=8, prompts=lens,
                      arrivals_ms=tuple(t * 1e3 for t in times))
        for n in real:
            sim[n].append(simulate_policy(engine, info.policy(*ser.policy_kind(n)), wl).ttft_ms)
    for i in range(4):
        e = entries[("c2-fixed", i)]
        assert e["arrival_s_median"] == pytest.approx((served[0][i] + served[1][i]) / 2)
        for n in real:
            want = sorted(real[n][r][i] / sim[n][r][i] for r in range(2))
            assert e["measured_over_simulated"][n] == pytest.approx(sum(want) / 2)
        diff = e["auto_minus_base_ms"]
        assert diff["measured_median"] == pytest.approx([100.0, 100.0, 0.0, 0.0][i])
        assert diff["measured_mean"] == pytest.approx([100.0, 100.0, 0.0, 0.0][i])
        assert diff["simulated_mean"] == pytest.approx(sum(
            sim["cpp-auto-8192"][r][i] - sim["cpp-base-512"][r][i] for r in range(2)) / 2)
    text = out.with_suffix(".md").read_text()
    assert "## Each request on the run's arrivals" in text and "| 0 | c2-fixed | 0 | 4 |" in text
