"""The machine-speed yardstick of benchmark cells (benchmarks/cell_speed.py) and its tables."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import bench_engine as be  # noqa: E402
from benchmarks import cell_speed  # noqa: E402
from vllm_ascend_cpp.core.latency_model import LatencyModel  # noqa: E402

MODEL = LatencyModel(a=1.3e-5, b=0.1, c=2.0, gamma=0.002, d=1e-6)


def _steps(slow: float) -> list[dict]:
    """A cell's trace lines, each stamped ``slow`` times the model's forecast of its step
    after the line before; step 3 follows an idle wait for an arrival."""
    shapes = [  # (prefills as (history, chunk), decode histories)
        ([(0, 2048)], []), ([(2048, 1408), (0, 128)], []), ([], [5000, 7000]),
        ([(3456, 1152)], [5001, 7001]), ([(128, 2944)], [9000]), ([(4608, 1024)], []),
    ]
    lines, t = [{"time": 100.0, "requests": [], "decodes": 0}], 100.0
    for i, (pre, dec) in enumerate(shapes):
        # The forecast from every decode's own history: the line keeps only their sum.
        ms = MODEL.step_ms(pre + [(h, 1) for h in dec])
        t += (ms * slow * (20 if i == 3 else 1)) / 1e3
        lines.append({"time": t, "requests": [{"history": h, "chunk": x} for h, x in pre],
                      "decodes": len(dec), "decode_history": sum(dec)})
    return lines


def test_slowdown_is_the_cells_wall_time_over_the_model_skipping_idle_waits() -> None:
    assert cell_speed.cell_slowdown(_steps(1.0), MODEL) == pytest.approx(1.0)
    assert cell_speed.cell_slowdown(_steps(1.37), MODEL) == pytest.approx(1.37)
    # A model that prices every step 20% higher sees a machine 1/1.2 as slow; taken over the
    # policy's own median round, that bias is gone.
    dear = LatencyModel(a=MODEL.a * 1.2, b=MODEL.b * 1.2, c=MODEL.c * 1.2,
                        gamma=MODEL.gamma * 1.2, d=MODEL.d * 1.2)
    per_round = [cell_speed.cell_slowdown(_steps(s), dear) for s in (1.0, 1.3, 0.95)]
    assert per_round[0] == pytest.approx(1 / 1.2)
    assert cell_speed.relative(per_round) == pytest.approx([1.0, 1.3, 0.95])
    decode_only = [ln for ln in _steps(1.0) if not ln["requests"]]
    assert cell_speed.cell_slowdown(decode_only, MODEL) is None


def test_adjusted_ttft_takes_out_a_round_the_machine_slowed() -> None:
    # Round 2 ran 40% slow for everything: its TTFT is back in line once adjusted.
    assert cell_speed.adjusted([1000.0, 1400.0, 990.0], [0.9, 1.26, 0.9]) == \
        pytest.approx([1000.0, 1000.0, 990.0])
    assert cell_speed.adjusted([1000.0, 1400.0], [0.9, None]) is None
    assert cell_speed.relative([]) is None


def test_steal_time_is_read_from_proc_stat(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  3078277 6852 244762 973100 2745 0 3132 6624 0 0\ncpu0 1 2 3\n")
    assert cell_speed.steal_s(str(stat)) == pytest.approx(6624 / os.sysconf("SC_CLK_TCK"))
    stat.write_text("intr 1 2 3\n")
    assert cell_speed.steal_s(str(stat)) is None
    assert cell_speed.steal_s(str(tmp_path / "missing")) is None


def _served(ttft: float, slowdown: float) -> dict:
    return {"mean_ttft_s": ttft, "ttfts_s": [ttft * 0.5, ttft * 1.5], "e2e_s": [4.0, 5.0],
            "mean_e2e_s": 4.5, "throughput_tok_s": 10.0, "cv": None, "bubble_fraction": None,
            "slowdown": slowdown, "steal_s": 0.1}


def test_tables_give_the_bars_at_each_policys_usual_speed() -> None:
    # Auto's round 2 met a slow machine (1.3x its usual steps): raw it is about 1% below base
    # in every round but that one, and the slow round's 29% over decides the interval.
    runs = {
        "fixed-1024": [{"results": {"c2-fixed": _served(t, s)}}
                       for t, s in ((1.00, 1.0), (1.00, 1.0), (1.00, 1.0))],
        "cpp-base-2048": [{"results": {"c2-fixed": _served(t, s)}}
                          for t, s in ((0.95, 0.9), (0.96, 0.9), (0.95, 0.9))],
        "cpp-auto-8192": [{"results": {"c2-fixed": _served(t, s)}}
                          for t, s in ((0.94, 0.8), (1.24, 1.04), (0.94, 0.8))],
    }
    table = be.summarise(runs)
    auto = table["c2-fixed"]["cpp-auto-8192"]
    assert auto["ttfts_per_rep_ms"][1] == pytest.approx([620.0, 1860.0])
    assert auto["ttft_adjusted_per_rep_ms"] == pytest.approx([940.0, 1240.0 / 1.3, 940.0])
    meta = {"command": "x", "prompt_len": 16384, "output_len": 128, "reps": 3,
            "attention_share": 0.5, "mode": "one-engine", "auto_budget": 8192}
    rows = {(r["policy"], r["baseline"], r["metric"]): r for r in be.bars(table, meta)}
    vs_base = rows[("cpp-auto-8192", "cpp-base-2048", "ttft")]
    assert vs_base["ratio"]["values"][1] > 1.25
    assert max(vs_base["adjusted"]["ratio"]["values"]) < 1.0
    assert vs_base["adjusted"]["verdict"] == "met"
    assert "adjusted" not in rows[("cpp-auto-8192", "fixed-1024", "throughput")]
    text = be.markdown(table, meta)
    assert "| cpp-auto-8192 | 1.000/1.300/1.000 | 0.1/0.1/0.1 | 940/954/940 |" in text
    assert "TTFT at usual speed | result at usual speed |" in text
    # Throughput has no speed-adjusted figure.
    assert "| throughput | >= 0.98x | 1.000x [1.000-1.000] | met | - | - |" in text
