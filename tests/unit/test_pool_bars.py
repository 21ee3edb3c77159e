"""Pooling the rounds of several engine A/B runs (benchmarks/pool_bars.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import pool_bars as pb  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
META = {"mode": "one-engine", "prompt_len": 16384, "output_len": 128, "auto_budget": 8192}


def _run(values: list[float], *, meta: dict | None = None, bar: str = "<= 1.02x",
         extra: bool = False) -> dict:
    bars = [{"key": "c2-fixed", "policy": "cpp-auto-8192", "baseline": "fixed-1024",
             "metric": "ttft", "bar": bar, "verdict": "not resolvable at this spread",
             "ratio": {"values": values, "quoted": "-"}}]
    if extra:
        bars.append({**bars[0], "key": "c4-fixed"})
    return {"meta": meta or META, "bars": bars}


def test_rounds_are_pooled_not_run_means() -> None:
    # Each run alone straddles the bar; together ten rounds sit below it. Averaging the two
    # runs' points instead would leave two values and no verdict at all.
    a = [0.99, 1.03, 0.97, 1.00, 1.01]
    b = [1.00, 0.98, 1.02, 0.99, 0.98]
    res = pb.pool([_run(a), _run(b)], ["a", "b"], ["t", "t"])
    (row,) = res["bars"]
    assert row["ratio"]["values"] == a + b
    assert row["verdict"] == "met"
    assert row["ratio"]["hi"] <= 1.02
    assert row["per_run"]["a"]["verdict"] == "not resolvable at this spread"


def test_a_bar_the_pooled_rounds_clear_on_the_wrong_side_is_missed() -> None:
    res = pb.pool([_run([1.05, 1.06, 1.04]), _run([1.07, 1.05, 1.06])], ["a", "b"])
    assert res["bars"][0]["verdict"] == "missed"
    assert res["bars"][0]["point_on_the_right_side"] is False
    ge = pb.pool([_run([0.95, 0.96, 0.97], bar=">= 0.98x")], ["a"])
    assert ge["bars"][0]["verdict"] == "missed"


def test_a_row_some_run_lacks_is_left_out() -> None:
    res = pb.pool([_run([1.0] * 3, extra=True), _run([1.0] * 3)], ["a", "b"])
    assert [b["key"] for b in res["bars"]] == ["c2-fixed"]


def test_partial_pools_a_row_over_the_runs_that_have_it() -> None:
    full = _run([0.99, 1.01, 1.00], extra=True)
    full["bars"][1]["ratio"] = {"values": [0.95, 0.96, 0.97], "quoted": "Q4"}
    res = pb.pool([full, _run([1.02, 0.98, 1.00])], ["full", "c2"], partial=True)
    rows = {b["key"]: b for b in res["bars"]}
    assert rows["c2-fixed"]["ratio"]["values"] == [0.99, 1.01, 1.00, 1.02, 0.98, 1.00]
    assert rows["c4-fixed"]["ratio"]["values"] == [0.95, 0.96, 0.97]
    assert set(rows["c4-fixed"]["per_run"]) == {"full"}
    # The run without the row shows a dash, not another run's figure.
    assert "| c4-fixed | cpp-auto-8192 | fixed-1024 | ttft | <= 1.02x | Q4 | - | 0.960x" \
        in pb.markdown(res, "cmd")
    assert [b["key"] for b in pb.pool([full, _run([1.0] * 3)], ["full", "c2"])["bars"]] \
        == ["c2-fixed"]


def _adjusted(run: dict, values: list[float]) -> dict:
    run["bars"][0]["adjusted"] = {"ratio": {"values": values, "quoted": "q"},
                                  "verdict": "not resolvable at this spread"}
    return run


def test_the_bars_at_usual_speed_are_pooled_when_every_run_has_them() -> None:
    a = _adjusted(_run([1.1, 0.9, 1.0]), [0.97, 0.98, 0.99])
    b = _adjusted(_run([1.0, 1.1, 0.9]), [0.98, 0.97, 0.99])
    (row,) = pb.pool([a, b], ["a", "b"])["bars"]
    assert row["adjusted"]["ratio"]["values"] == [0.97, 0.98, 0.99, 0.98, 0.97, 0.99]
    assert row["adjusted"]["verdict"] == "met"  # the raw rounds alone resolve nothing
    assert row["verdict"] == "not resolvable at this spread"
    assert "pooled at usual speed" in pb.markdown(pb.pool([a, b], ["a", "b"]), "cmd")
    # One run without them: a pooled figure of the other's rounds alone would pass for both.
    (row,) = pb.pool([a, _run([1.0, 1.1, 0.9])], ["a", "c"])["bars"]
    assert "adjusted" not in row


def test_runs_of_another_workload_or_code_are_refused() -> None:
    with pytest.raises(ValueError, match="prompt_len"):
        pb.pool([_run([1.0] * 3), _run([1.0] * 3, meta={**META, "prompt_len": 8192})],
                ["a", "b"])
    with pytest.raises(ValueError, match="dtype"):  # another machine kind
        pb.pool([_run([1.0] * 3, meta={**META, "dtype": "float32"}),
                 _run([1.0] * 3, meta={**META, "dtype": "bfloat16"})], ["a", "b"])
    with pytest.raises(ValueError, match="different plugin code"):
        pb.pool([_run([1.0] * 3), _run([1.0] * 3)], ["a", "b"], ["t1", "t2"])
    with pytest.raises(ValueError, match="not known"):
        pb.pool([_run([1.0] * 3), _run([1.0] * 3)], ["a", "b"], ["t1", ""])


def _full_history() -> bool:
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"],
                         capture_output=True, text=True, check=False)
    return out.returncode == 0 and out.stdout.strip() == "false"


@pytest.mark.skipif(not _full_history(), reason="needs the repository's git history")
def test_the_code_of_committed_runs_is_read_from_history() -> None:
    # The two EPYC runs were made on one plugin code; the whole-units run on an earlier one.
    epyc = pb.plugin_tree(RESULTS / "engine_bench_auto_vs_base_epyc.json")
    assert epyc and epyc == pb.plugin_tree(RESULTS / "engine_bench_auto_vs_base_epyc2.json")
    assert pb.plugin_tree(RESULTS / "engine_bench_auto_vs_base_units2.json") not in ("", epyc)
