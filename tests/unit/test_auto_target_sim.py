"""`target: auto` against `base` in the simulator, at concurrency 2 and 4.

The simulator replays vLLM's scheduling walk and the pipeline with the plugin's own runtime
making the decisions; a policy's result is the simulated mean TTFT of closed-loop clients.
The comparison is between two simulated runs, not a repeat of auto's own forecast.

The bar (issue 13): at concurrency 2 and 4 auto is never worse than base on any case of the
grid (four latency models, two prompt lengths, with and without host time, 2 and 4 stages) on
this prompt draw, and better on average. Other draws still have a few losing cases (5 of 384
over six runs, up to 0.6%; when both policies serve the same arrivals, averaged over four
draws of them, 3 of 384, up to 1.0%). `benchmarks/sim_auto_vs_base.py` runs the same grid with
more requests and other prompt draws and saves the figures.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.sim_auto_vs_base import GRID, MODELS, ratio, ratios  # noqa: E402
from vllm_ascend_cpp.core import step_planner  # noqa: E402


def test_auto_against_base_across_a_grid():
    ratios = {case: ratio(MODELS[case[0]], *case[1:]) for case in GRID}
    worst = max(ratios, key=ratios.get)
    print(f"auto/base mean TTFT over {len(GRID)} cases: mean {np.mean(list(ratios.values())):.3f}"
          f", worst {ratios[worst]:.3f} at {worst}, "
          f"{sum(r > 1.0 for r in ratios.values())} cases above 1")
    assert ratios[worst] <= 1.0, (worst, ratios[worst])
    assert np.mean(list(ratios.values())) <= 0.92


def test_a_head_that_fits_in_one_step_does_not_force_a_large_target():
    # Before: the head's own best target (a tie broken upwards to the base target when its
    # tail fits in one step) was a floor for the whole queue, so its tail step was filled
    # with a budget's worth of the next prompt: auto lost 9.4% to base here (1.094).
    assert ratio(MODELS["cheap-c"], 2, 4096, 0.0, 2) <= 0.95


def test_steps_in_flight_do_not_pull_the_target_up():
    # Before: the forecast charged the queue (S-1) times the largest step since the pipeline
    # last drained, which in a closed loop never happens; the target climbed and auto lost
    # 4.4% to base here (1.044) and 2.8% with a large per-step constant (1.028).
    assert ratio(MODELS["cheap-c"], 4, 16384, 0.0, 4) <= 1.0
    assert ratio(MODELS["big-c"], 4, 4096, 0.0, 4) <= 1.0


def test_decodes_in_flight_are_not_forgotten(monkeypatch: pytest.MonkeyPatch):
    # Before: the forecast saw only the decodes of the step it chose on; on a step whose
    # decodes were all in flight it saw none, chose a small target, and the heavy steps gave
    # the prompt its smallest chunk. On the same arrivals auto lost 13.4% to base here (1.134);
    # with the phases but no re-choice when decodes joined or left, 3.4% (1.034). The planner's
    # phase rule (finish in the quieter phase) moves this one draw by itself: it trades a held
    # prompt's TTFT for the decodes' throughput (benchmarks/results/sim_phase_balance.md), and
    # with it auto runs 1.031 here and 0.953 on another draw of the same case. It is off here
    # so that the check stays on what it guards.
    monkeypatch.setattr(step_planner, "BALANCE_PHASES", False)
    assert ratios(MODELS["cpu"], 4, 16384, 0.0, 4, seed=2)[1] <= 1.0


def test_jitter_draws_delay_every_later_arrival_by_less_than_the_bound():
    from benchmarks.sim_auto_vs_base import JITTER_MS, jittered_arrivals

    times = [0.0, 0.0, 120.0, 120.0, 400.0, 900.0]
    draws = [jittered_arrivals(times, seed=3, draw=k) for k in range(4)]
    for d in draws:
        assert list(d) == sorted(d)
        assert d[:2] == (0.0, 0.0)  # the first wave is not delayed
        # Sorted delayed times still pair off with the originals within the bound.
        assert all(0.0 <= x - t < JITTER_MS for x, t in zip(d[2:], times[2:], strict=True))
    assert len(set(draws)) == len(draws)  # each draw is its own
    assert draws[0] == jittered_arrivals(times, seed=3)  # reproducible
    assert draws[0] != jittered_arrivals(times, seed=4)
