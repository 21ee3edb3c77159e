"""benchmarks/auto_gain.py: its base forecast is what the real StepPlanner's steps give through
a batch queue, auto's choice is as good as the script's fine grid, and the table lists every
case."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import auto_gain  # noqa: E402
from tests.unit.test_auto_target import planner_mean_completion  # noqa: E402
from vllm_ascend_cpp.core.latency_model import LatencyModel  # noqa: E402

MODEL = LatencyModel(a=1.68e-5, b=0.0925, c=2.8, gamma=1.9e-4)
CASES = tuple(c for c in auto_gain.CASES if c[0] in
              ("lone 16k", "lone 4k", "11k and 16k arriving together"))


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return auto_gain.run(MODEL, hosts=(0.0, 30.0), cases=CASES)


def test_base_forecast_is_the_planners_steps(rows):
    _, base_p = auto_gain.predictors(MODEL)
    queues = {name: queue for name, queue, _ in CASES}
    for r in rows:
        truth = planner_mean_completion(base_p, queues[r["case"]], [[]], base_p.target_ms,
                                        auto_gain.BASE_BUDGET, auto_gain.STAGES,
                                        host_ms=r["host_ms"])
        assert r["base_forecast_ms"] == pytest.approx(truth, rel=0.01)


def test_auto_is_as_good_as_the_fine_grid_and_inside_a_sane_range(rows):
    assert len(rows) == 2 * len(CASES)
    for r in rows:
        assert r["auto_forecast_ms"] <= r["grid_best_ms"] * 1.02
        assert 0 < r["flat_low_ms"] <= r["flat_high_ms"]
        assert r["ratio"] == pytest.approx(r["auto_forecast_ms"] / r["base_forecast_ms"])
    # More host time per dispatch: fewer, larger steps for the same lone prompt.
    lone = {r["host_ms"]: r["auto_target_ms"] for r in rows if r["case"] == "lone 16k"}
    assert lone[30.0] > lone[0.0]


def test_render_lists_every_case(rows):
    md = auto_gain.render(rows, "x.json", MODEL)
    for name, _, _ in CASES:
        assert f"| {name} | 0 |" in md and f"| {name} | 30 |" in md
    assert "SIMULATED" in md
