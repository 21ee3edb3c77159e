"""`target: auto` against `base` in the simulator, at concurrency 2 and 4.

The simulator replays vLLM's scheduling walk and the pipeline with the plugin's own runtime
making the decisions; a policy's result is the simulated mean TTFT of its requests. The
comparison is between two simulated runs, not a repeat of auto's own forecast.

The bar (issue 13): at concurrency 2 and 4 auto is never worse than base. A closed loop of
clients does not judge the choices alone: a policy that finishes its decodes sooner brings its
clients back sooner, and bunched, into a busier queue, so its mean TTFT also counts the traffic
it made. The choices are judged on the same traffic, so the grid here replays one list of
submission times for both policies (base's closed-loop times, jittered), and also auto's own
list: a closed-loop loss that is gone on auto's own traffic is the traffic's, not the choices'.
`benchmarks/sim_auto_vs_base.py` runs the same grid with other prompt draws and 16 jitter
draws per case and saves the figures (`benchmarks/results/sim_auto_vs_base_flow.md`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.sim_auto_vs_base import GRID, MODELS, case_runs, ratio, ratios  # noqa: E402
from vllm_ascend_cpp.core import step_planner  # noqa: E402


def test_auto_against_base_across_a_grid():
    same, own, closed, span = {}, {}, {}, {}
    for case in GRID:
        extra: dict = {}
        closed[case], draws = case_runs(MODELS[case[0]], *case[1:], draws=1, extra=extra)
        same[case] = draws[0][0] / draws[0][1]
        own[case], span[case] = extra["ratio_auto_arrivals"], extra["makespan_ratio"]
    for name, values in (("base's arrivals", same), ("auto's arrivals", own),
                         ("closed loop", closed), ("closed-loop makespan", span)):
        worst = max(values, key=values.get)
        print(f"{name}: auto/base over {len(GRID)} cases: mean "
              f"{np.mean(list(values.values())):.3f}, worst {values[worst]:.3f} at {worst}, "
              f"{sum(r > 1.0 for r in values.values())} cases above 1")
    # One jitter draw moves base against itself by 1% to 2% (the benchmark's base spread,
    # median) and by up to 15%: a case may sit above 1.0 on one draw by noise. One more than
    # half a percent above is judged on 16 draws (auto's mean TTFT over them against base's),
    # where the noise averages out: there it must not be above base.
    for case in {c for values in (same, own) for c, r in values.items() if r > 1.005}:
        extra = {}
        _, draws = case_runs(MODELS[case[0]], *case[1:], draws=16, extra=extra, own_draws=16)
        for name, runs in (("base's", draws), ("auto's", extra["auto_arrivals_draws"])):
            pooled = np.mean([a for a, _ in runs]) / np.mean([b for _, b in runs])
            print(f"{case} on {name} arrivals: {runs[0][0] / runs[0][1]:.3f} on one draw, "
                  f"{pooled:.3f} over 16")
            assert pooled <= 1.0, (case, name)
    assert np.mean(list(same.values())) <= 0.92
    # The closed loop's time to serve every request is not worse on average.
    assert np.mean(list(span.values())) <= 1.0


def test_a_head_that_fits_in_one_step_does_not_force_a_large_target():
    # Before: the head's own best target (a tie broken upwards to the base target when its
    # tail fits in one step) was a floor for the whole queue, so its tail step was filled
    # with a budget's worth of the next prompt: auto lost 9.4% to base here (1.094).
    assert ratio(MODELS["cheap-c"], 2, 4096, 0.0, 2) <= 0.95


def test_steps_in_flight_do_not_pull_the_target_up():
    # Before: the forecast charged the queue (S-1) times the largest step since the pipeline
    # last drained, which in a closed loop never happens; the target climbed and auto lost
    # 4.4% to base here (1.044) and 2.8% with a large per-step constant (1.028), closed loop.
    for case in (("cheap-c", 4, 16384, 0.0, 4), ("big-c", 4, 4096, 0.0, 4)):
        extra: dict = {}
        _, draws = case_runs(MODELS[case[0]], *case[1:], draws=1, extra=extra)
        assert draws[0][0] <= draws[0][1], case
        assert extra["ratio_auto_arrivals"] <= 1.0, case


def test_a_closed_loop_loss_is_the_traffic_auto_made():
    # Cheap per-step constant, concurrency 4, 16K prompts, 4 stages: auto's closed-loop mean
    # TTFT is well above base's (1.215 on this draw). Auto finishes the first prompts' decodes
    # sooner (its steps are smaller), so its clients come back sooner and bunched: the third
    # wave arrives within 300 ms under auto, over 1,050 ms under base. On either policy's
    # traffic auto is ahead, and it serves the closed loop's requests sooner.
    extra: dict = {}
    closed, draws = case_runs(MODELS["cheap-c"], 4, 16384, 0.0, 4, draws=1, extra=extra)
    assert closed > 1.05
    assert draws[0][0] < draws[0][1]
    assert extra["ratio_auto_arrivals"] < 1.0
    assert extra["makespan_ratio"] < 1.0


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
    # Within one draw's noise (see the grid above).
    assert ratios(MODELS["cpu"], 4, 16384, 0.0, 4, seed=2)[1] <= 1.005


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


@pytest.mark.parametrize("host_ms", [0.0, 17.0])
def test_a_prompt_arriving_during_decode_only_steps_is_chosen_for_with_their_decodes(host_ms):
    # The real engine's A/B of the batch-queue forecast (its served model, 16K prompts,
    # concurrency 2, two stages), replayed on base's closed-loop arrival times: the third
    # prompt arrives while the second one's decodes run alone. Steps without prefill are not
    # planned, and the auto target used to remember only the decodes of planned steps, so
    # its first choice for the newcomer saw none: a first chunk of 1,536 tokens where base
    # planned 2,048, and auto lost 0.6% (host 0 ms) and 1.1% (17 ms) to base on this traffic.
    import json
    from dataclasses import replace

    from benchmarks.bench_engine import cell_lengths
    from benchmarks.sim_engine_run import policy_kind, served_setup
    from vllm_ascend_cpp.sim import Workload, simulate_policy

    root = Path(__file__).resolve().parents[2]
    data = json.loads((root / "benchmarks/results/engine_bench_auto_vs_base_flow.json")
                      .read_text())
    args, info, engine = served_setup(data, host_ms)
    assert engine.stages == 2
    lens, _ = cell_lengths(args, 2, False, 0)
    wl = Workload(concurrency=2, prompt_len=max(lens), output_len=args.output_len,
                  prompts=tuple(lens))
    base = info.policy(*policy_kind("cpp-base-2048"))
    auto = info.policy(*policy_kind("cpp-auto-8192"))
    traffic = replace(wl, arrivals_ms=tuple(simulate_policy(engine, base, wl).arrival_ms))
    assert traffic.arrivals_ms[2] > 0  # a later wave, not the first
    assert simulate_policy(engine, auto, traffic).mean_ttft_ms \
        <= simulate_policy(engine, base, traffic).mean_ttft_ms
