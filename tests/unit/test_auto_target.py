"""``target: auto``: as good as a brute-force search over targets, grows with the prefill queue,
stays sticky within a busy pipeline, and never crashes on degenerate models."""

from __future__ import annotations

import itertools
import math

import pytest

from vllm_ascend_cpp.config import CppConfig, EngineFacts
from vllm_ascend_cpp.core.auto_target import AutoTarget, AutoTargetTracker
from vllm_ascend_cpp.core.latency_model import LatencyModel, pipeline_ttft_ms
from vllm_ascend_cpp.core.manager import ProfilingChunkManager
from vllm_ascend_cpp.core.predictor import ChunkSizePredictor
from vllm_ascend_cpp.core.report import format_report
from vllm_ascend_cpp.core.settings import CoreSettings
from vllm_ascend_cpp.core.step_planner import Candidate
from vllm_ascend_cpp.runtime import core_settings

K = 1024


def exact_ttft(p: ChunkSizePredictor, target: float, prompt: int, budget: int,
               stages: int) -> float:
    plan = p.with_model(p.model, target_ms=target).plan(prompt, budget=budget)
    return pipeline_ttft_ms([c.predicted_ms for c in plan], stages)


# A grid over the shape of the cost curve, prompt length, depth and budget: every 7th
# combination keeps the test fast while still visiting every value of every axis.
GRID = list(itertools.product(
    [1e-8, 2e-7, 2e-6],          # a
    [0.002, 0.02],               # b
    [0.0, 3.0, 40.0],            # c
    [0.0, 2e-4],                 # gamma
    [3000, 40 * K, 200 * K],     # prompt
    [2, 4, 8],                   # stages
    [(4 * K, 1024), (16 * K, 4096)],  # (budget = base chunk, min chunk)
))[::7]


def brute_best_ttft(p: ChunkSizePredictor, prompt: int, budget: int, stages: int,
                    points: int = 160) -> tuple[float, float]:
    """``(best TTFT, its target)`` over a fine geometric grid of targets, found by running the
    predictor's own plan at each one (no AutoTarget code involved).

    Below the cost of the smallest chunk the predictor allows every chunk is that chunk, and
    above the cost of a budget-sized last chunk every chunk is the budget: the grid spans both
    ends with room to spare, and includes the base target.
    """
    m = p.model
    smallest = min(max(p.min_chunk, p.alignment), budget, prompt)
    last = min(budget, prompt)
    low = m.chunk_cost_ms(0, smallest) / 2
    high = m.chunk_cost_ms(prompt - last, last) * 2
    ratio = (high / low) ** (1.0 / (points - 1))
    targets = [low * ratio ** k for k in range(points)] + [p.target_ms]
    return min((exact_ttft(p, t, prompt, budget, stages), t) for t in targets)


@pytest.mark.parametrize("a,b,c,gamma,prompt,stages,budget_min", GRID)
def test_auto_is_as_good_as_a_brute_force_search_over_targets(a, b, c, gamma, prompt, stages,
                                                              budget_min):
    budget, min_chunk = budget_min
    model = LatencyModel(a=a, b=b, c=c, gamma=gamma)
    p = ChunkSizePredictor(model, base_chunk=budget, min_chunk=min_chunk)
    choice = AutoTarget(p, stages).choose([(0, prompt)], budget)
    assert choice is not None and choice.target_ms > 0
    auto = exact_ttft(p, choice.target_ms, prompt, budget, stages)
    best, best_target = brute_best_ttft(p, prompt, budget, stages)
    # Auto's 24-point grid and refinement may miss a narrow step of the brute-force curve.
    assert auto <= best * 1.02, f"auto {auto:.1f} ms at {choice.target_ms:.3g} ms, " \
        f"brute force {best:.1f} ms at {best_target:.3g} ms"
    assert choice.predicted_ms == pytest.approx(auto)


def test_closed_form_direction_more_overhead_fewer_steps():
    # n* ~ sqrt((S-1) W / c): a larger per-step overhead or a shallower pipeline wants a
    # larger target.
    def target(c: float, stages: int) -> float:
        p = ChunkSizePredictor(LatencyModel(a=1e-7, b=0.01, c=c), base_chunk=16 * K,
                               min_chunk=512)
        return AutoTarget(p, stages).choose([(0, 64 * K)], 16 * K).target_ms

    assert target(2.0, 4) < target(50.0, 4)
    assert target(20.0, 8) < target(20.0, 2)


def test_target_grows_with_queued_prefills():
    model = LatencyModel(a=2e-7, b=0.0064, c=18.0)
    p = ChunkSizePredictor(model, base_chunk=16 * K, min_chunk=4096)
    auto = AutoTarget(p, 4)
    targets = [auto.choose([(0, 128 * K)] * q, 16 * K).target_ms for q in (1, 2, 4, 8, 16)]
    # The forecast is ragged (whole steps), so allow a little noise between neighbours...
    assert all(y >= 0.97 * x for x, y in zip(targets, targets[1:]))
    # ...but queued work never lowers the head's own best, and a long queue raises it. Not to
    # the budget's cap: with at most S batches in flight the stages pay for every fall in step
    # cost, and budget-sized chunks rise threefold over a 128K prompt and fall at the next.
    assert min(targets[1:]) >= targets[0]
    assert targets[-1] > 1.1 * targets[0]

    def steps(t: float) -> int:
        return len(p.with_model(model, target_ms=t).plan(128 * K, budget=16 * K))

    assert steps(targets[-1]) < steps(targets[0])  # fewer, larger steps


def test_choices_are_cached_by_bucket():
    p = ChunkSizePredictor(LatencyModel(a=2e-7, b=0.0064, c=18.0), base_chunk=16 * K,
                           min_chunk=4096)
    auto = AutoTarget(p, 4)
    first = auto.choose([(0, 100_000)], 16 * K)
    again = auto.choose([(0, 100_001)], 16 * K)
    assert again is first and auto.cache_hits == 1 and auto.cache_misses == 1


@pytest.mark.parametrize("model", [
    LatencyModel(a=0.0, b=0.0, c=5.0),            # only overhead: target 0, not ready
    LatencyModel(a=0.0, b=0.01, c=0.0),           # linear, no overhead
    LatencyModel(a=1e-7, b=0.0, c=0.0),           # attention only
    LatencyModel(a=0.0, b=0.0, c=0.0),            # nothing at all
    LatencyModel(a=1e-7, b=0.01, c=10.0, gamma=1.0),  # prefix term swamps every target
    LatencyModel(a=1e30, b=1e30, c=1e30),         # absurd scale
])
def test_degenerate_models_never_crash(model):
    m = ProfilingChunkManager(CoreSettings(base_chunk=8192, min_chunk=2048, pp_size=4,
                                           target_mode="auto", online_calibration=False))
    m.load_profile({"model": model.to_dict()})
    cands = [Candidate("d0", 500, 1, False), Candidate("p0", 1000, 50_000, True),
             Candidate("p1", 0, 70_000, True)]
    for _ in range(5):
        plan = m.plan_step(cands, max_budget=8192)
        assert plan.token_budget >= 1
        cands = [Candidate(c.req_id, c.history + 100, c.remaining, c.is_prefill)
                 for c in cands]
    for prefills, budget in (([(0, 1)], 1), ([(10**9, 5)], 3), ([(0, 0)], 10), ([], 10)):
        AutoTarget(m.predictor, 4).choose(prefills, budget)


def test_manager_plans_with_the_auto_target_and_reports_it():
    model = LatencyModel(a=2e-7, b=0.0064, c=18.0, gamma=5e-4)
    settings = dict(base_chunk=32 * K, min_chunk=4096, pp_size=4, online_calibration=False,
                    reference_prompt_len=128 * K)
    base = ProfilingChunkManager(CoreSettings(**settings))
    auto = ProfilingChunkManager(CoreSettings(**settings, target_mode="auto"))
    for m in (base, auto):
        m.load_profile({"model": model.to_dict()})
    cands = [Candidate("p0", 0, 128 * K, True)]
    b_plan = base.plan_step(cands, max_budget=32 * K)
    a_plan = auto.plan_step(cands, max_budget=32 * K)
    assert auto.auto is not None and auto.auto.target_ms is not None
    assert auto.summary()["target_mode"] == "auto"
    assert auto.summary()["auto_target_ms"] == pytest.approx(auto.auto.target_ms)
    assert a_plan.token_budget >= 1 and not a_plan.fallback and not b_plan.fallback
    report = auto.report
    assert report["target_mode"] == "auto"
    assert report["target_ms"] == pytest.approx(report["auto_target"]["target_ms"])
    assert report["ttft_dynamic_ms"] <= base.report["ttft_dynamic_ms"] * (1 + 1e-9)
    assert "target auto" in format_report(report)
    assert "target auto" not in format_report(base.report)


def test_tracker_is_sticky_for_a_head_and_rechooses_on_arrivals():
    model = LatencyModel(a=2e-7, b=0.0064, c=18.0)
    p = ChunkSizePredictor(model, base_chunk=32 * K, min_chunk=4096)
    tracker = AutoTargetTracker(AutoTarget(p, 4))
    history, remaining = 0, 128 * K
    seen = []
    while remaining > 0:
        t = tracker.target_for([Candidate("a", history, remaining, True)], 32 * K)
        seen.append(t)
        chunk = p.with_model(model, target_ms=t).next_chunk(history, remaining, 32 * K).chunk
        history += chunk
        remaining -= chunk
    assert len(set(seen)) == 1 and tracker.choices_made == 1
    # A second prompt arriving while the first is half done: the target may only grow.
    t_alone = tracker.target_for([Candidate("b", 0, 128 * K, True)], 32 * K)
    t_busy = tracker.target_for([Candidate("b", 64 * K, 64 * K, True),
                                 Candidate("c", 0, 128 * K, True)], 32 * K)
    assert t_busy >= t_alone
    assert tracker.target_for([], 32 * K) == t_busy


def test_settings_and_runtime_mapping():
    with pytest.raises(ValueError, match="target_mode"):
        CoreSettings(base_chunk=8192, target_mode="fastest")
    facts = EngineFacts(pp_size=2, tp_size=1, max_num_batched_tokens=8192, max_num_seqs=8,
                        block_size=16, max_model_len=65536)
    for target, mode in (("auto", "auto"), ("base", "base"), ("fixed", "base")):
        cfg = CppConfig(enabled=True, base_chunk=8192, min_chunk=2048, target=target)
        assert core_settings(cfg, facts).target_mode == mode
    assert CoreSettings.from_dict(CoreSettings(base_chunk=64, target_mode="auto")
                                  .to_dict()).target_mode == "auto"


def test_under_auto_the_sweep_covers_the_budget():
    facts = EngineFacts(pp_size=2, tp_size=1, max_num_batched_tokens=8192, max_num_seqs=8,
                        block_size=16, max_model_len=65536)
    sweeps = {}
    for target in ("auto", "base"):
        cfg = CppConfig(enabled=True, base_chunk=2048, target=target)
        settings = core_settings(cfg, facts)
        assert settings.base_chunk == 2048 and settings.step_budget == 8192
        sweeps[target] = ProfilingChunkManager(settings).sample_sizes()
    # Auto plans chunks up to the budget: its sweep measures them; base never leaves 2048.
    assert max(sweeps["auto"]) == 8192 and max(sweeps["base"]) == 2048
    assert len(sweeps["auto"]) == len(sweeps["base"])
    with pytest.raises(ValueError, match="step_budget"):
        CoreSettings(base_chunk=4096, step_budget=2048)


def test_unready_predictor_gives_no_choice():
    p = ChunkSizePredictor(None, base_chunk=8192)
    assert AutoTarget(p, 4).choose([(0, 10_000)], 8192) is None
    assert AutoTargetTracker(AutoTarget(p, 4)).target_for(
        [Candidate("a", 0, 10_000, True)], 8192) is None
    assert math.isnan(AutoTarget(p, 4).base_target_ms)


@pytest.mark.parametrize("stages", [2, 4])
def test_host_time_is_paid_on_the_dispatch_path(stages):
    # Host time delays each dispatch: once it outgrows what a full pipeline hides, fewer and
    # larger steps win. The forecast's completions, host time included, are those of the
    # planner's steps replayed through the engine's batch queue.
    model = LatencyModel(a=2.7e-6, b=0.022, c=1.0, gamma=1.5e-4, d=2.7e-6)
    p = ChunkSizePredictor(model, base_chunk=8 * K, min_chunk=256)
    queue = [(0, 16 * K), (0, 12 * K)]
    bare = AutoTarget(p, stages).choose(queue, 8 * K)
    hosted = AutoTarget(p, stages, host_ms=8.0).choose(queue, 8 * K)
    assert hosted.target_ms > bare.target_ms
    for host, choice in ((0.0, bare), (8.0, hosted)):
        auto = AutoTarget(p, stages, host_ms=host)
        forecast, _ = auto.forecast(queue, 8 * K, choice.target_ms)
        truth = planner_mean_completion(p, queue, [[]], choice.target_ms, 8 * K, stages,
                                        host_ms=host)
        assert forecast == pytest.approx(truth, rel=0.01)
    for bad in (-3.0, math.nan, math.inf):
        assert AutoTarget(p, 2, host_ms=bad).host_ms == 0.0


def test_manager_learns_host_time_from_back_to_back_steps():
    model = LatencyModel(a=2.7e-6, b=0.022, c=1.0, d=2.7e-6)
    settings = dict(base_chunk=8 * K, min_chunk=256, pp_size=2, online_calibration=False,
                    reference_prompt_len=16 * K)
    auto = ProfilingChunkManager(CoreSettings(**settings, target_mode="auto"))
    base = ProfilingChunkManager(CoreSettings(**settings))
    for m in (auto, base):
        m.load_profile({"model": model.to_dict()})
    cands = [Candidate("p0", 0, 16 * K, True)]
    before = auto.plan_step(cands, max_budget=8 * K)
    for gap in [3.9, 4.1, -2.0, 4.0, 4.0, math.nan, 4.2, 3.8, 4.0, 4.0]:
        auto.record_host_gap(gap)
        base.record_host_gap(gap)
    assert auto.host_ms == pytest.approx(4.0, abs=0.11)
    assert auto.summary()["host_ms_per_step"] == auto.host_ms
    assert base.host_ms == 0.0  # the base target does not trade steps against overhead
    after = auto.plan_step(cands, max_budget=8 * K)
    assert after.prefill_cap > before.prefill_cap  # fewer, larger steps
    # A small wobble does not rebuild the tracker (its cache would be lost for nothing).
    tracker = auto.auto
    auto.record_host_gap(4.3)
    assert auto.auto is tracker


def planner_mean_completion(p: ChunkSizePredictor, queue: list[tuple[int, int]],
                            phases: list[list[Candidate]], target: float, budget: int,
                            stages: int, host_ms: float = 0.0) -> float:
    """Mean completion over ``queue`` when vLLM's walk is replayed step by step through the
    real StepPlanner: step k carries the decodes of ``phases[k % len(phases)]`` (ahead of the
    prefills, as running requests are), then the prefills still to do. One phase per stage:
    the next step's phase is what the manager passes as ``next_phase_decodes``. The steps go
    through the simulator's stages (``sim.engine._through_stages``) from a batch queue of at
    most ``stages`` batches, each dispatched ``host_ms`` after the engine could schedule it,
    as ``simulate_policy`` runs vLLM's ``step_with_batch_queue``."""
    assert len(phases) in (1, stages)
    from vllm_ascend_cpp.core.step_planner import StepPlanner
    from vllm_ascend_cpp.sim.engine import _through_stages

    planner = StepPlanner(p)
    todo = {f"p{i}": [L, R] for i, (L, R) in enumerate(queue)}
    stage_free = [0.0] * stages
    in_flight: list[float] = []
    now = 0.0
    done: list[float] = []
    k = 0
    while todo:
        cands = list(phases[k % len(phases)]) + [Candidate(rid, L, R, True)
                                                  for rid, (L, R) in todo.items()]
        after = sum(c.remaining for c in phases[(k + 1) % len(phases)])
        plan = planner.plan(cands, max_budget=budget, target_ms=target,
                            next_phase_decodes=after if stages > 1 else None)
        if len(in_flight) >= stages:
            now = max(now, in_flight.pop(0))
        now += host_ms
        end = _through_stages(stage_free, now, plan.predicted_ms, [1.0] * stages)[1][-1]
        in_flight.append(end)
        for item in plan.items:
            if item.is_prefill:
                todo[item.req_id][0] += item.tokens
                todo[item.req_id][1] -= item.tokens
                if todo[item.req_id][1] <= 0:
                    del todo[item.req_id]
                    done.append(end)
        k += 1
    return sum(done) / len(done)


@pytest.mark.parametrize("target", [12.0, 25.0, 40.0, 60.0])
def test_forecast_follows_the_planner_when_decodes_ride_in_one_phase(target):
    # Two stages: three long decodes (22 ms) ride in every other step. Where they take most
    # of the target the planner still gives the lead its smallest chunk; the forecast must
    # follow that step by step, which an average load spread over every step does not.
    model = LatencyModel(a=2.65e-6, b=0.021, c=0.65, gamma=3.6e-4, d=2.5e-6)
    p = ChunkSizePredictor(model, base_chunk=2048, min_chunk=256)
    auto = AutoTarget(p, 2)
    decodes = [Candidate(f"d{i}", 20_000 + i, 1, False) for i in range(3)]
    load = (sum(auto.decode_cost(d.history, 1) for d in decodes), 3)
    queue = [(0, 9000), (0, 14_000)]
    truth = planner_mean_completion(p, queue, [decodes, []], target, 2048, 2)
    phased, _ = auto.forecast(queue, 2048, target, decodes=(load, (0.0, 0)))
    # The lean forecast leaves out a few of the planner's rules (a step carrying decodes is
    # trimmed to whole alignment units: 253 prefill tokens where it plans 256), and with at
    # most S batches in flight every fall in step cost counts: within 1.5%.
    assert phased == pytest.approx(truth, rel=0.015)
    if target < 1.5 * load[0]:
        averaged, _ = auto.forecast(queue, 2048, target, decodes=(load[0] / 2, 3))
        assert abs(averaged - truth) > 5 * abs(phased - truth)


def test_tracker_counts_the_decodes_vllm_skips_while_their_token_is_in_flight():
    # Under PP a decode is a candidate once every S steps. A choice made on a step that shows
    # no decode must still see the ones of the other phases.
    model = LatencyModel(a=2.65e-6, b=0.021, c=0.65, gamma=3.6e-4, d=2.5e-6)
    p = ChunkSizePredictor(model, base_chunk=2048, min_chunk=256)
    auto = AutoTarget(p, 2)
    tracker = AutoTargetTracker(auto)
    decodes = [Candidate(f"d{i}", 20_000, 1, False) for i in range(4)]
    load = (sum(auto.decode_cost(d.history, 1) for d in decodes), 4)
    tracker.target_for(decodes + [Candidate("a", 0, 3000, True)], 2048)
    tracker.record([(d.history, 1) for d in decodes])
    # Next step: the decodes are in flight, a new prompt is the head.
    got = tracker.target_for([Candidate("b", 0, 12_000, True)], 2048)
    blind = AutoTarget(p, 2).choose([(0, 12_000)], 2048)
    seeing = AutoTarget(p, 2).choose([(0, 12_000)], 2048, ((0.0, 0), load))
    assert got == pytest.approx(seeing.target_ms)
    assert seeing.target_ms != pytest.approx(blind.target_ms)


def test_tracker_rechooses_when_decodes_join_or_leave_under_the_same_head():
    # The decodes riding along change every coming step's load, so a choice made without
    # them is stale even though the head and the queue are the same.
    model = LatencyModel(a=2.65e-6, b=0.021, c=0.65, gamma=3.6e-4, d=2.5e-6)
    p = ChunkSizePredictor(model, base_chunk=2048, min_chunk=256)
    auto = AutoTarget(p, 2)
    tracker = AutoTargetTracker(auto)
    first = tracker.target_for([Candidate("a", 0, 12_000, True)], 2048)
    tracker.record([])
    assert tracker.target_for([Candidate("a", 1024, 10_976, True)], 2048) == first
    tracker.record([])
    assert tracker.choices_made == 1
    decodes = [Candidate(f"d{i}", 20_000, 1, False) for i in range(4)]
    joined = tracker.target_for(decodes + [Candidate("a", 2048, 9952, True)], 2048)
    tracker.record([(d.history, 1) for d in decodes])
    assert tracker.choices_made == 2
    load = (sum(auto.decode_cost(d.history, 1) for d in decodes), 4)
    fresh = AutoTarget(p, 2).choose([(2048, 9952)], 2048, (load, (0.0, 0)))
    assert joined == pytest.approx(max(first, fresh.target_ms))
    assert joined > first
    # The same decodes one step later (in flight, so not candidates): nothing changed.
    assert tracker.target_for([Candidate("a", 3072, 8880, True)], 2048) == joined
    tracker.record([])
    assert tracker.choices_made == 2
    # Two of them finish: a new choice, but the target does not fall for the same head.
    tracker.target_for(decodes[:2] + [Candidate("a", 4096, 7856, True)], 2048)
    assert tracker.choices_made == 3
    assert tracker.target_ms >= joined


def test_new_costs_keep_the_head_and_its_target():
    # A refit or a new host time gives the auto target new costs, but the head being
    # prefilled is the same: starting afresh would choose for its rest only, and the target
    # would fall mid-prompt (on a serving engine accepted refits come every ~100 steps).
    model = LatencyModel(a=2.7e-6, b=0.022, c=5.0, d=2.7e-6)
    m = ProfilingChunkManager(CoreSettings(base_chunk=8 * K, min_chunk=256, pp_size=2,
                                           online_calibration=False, target_mode="auto"))
    m.load_profile({"model": model.to_dict()})
    m.plan_step([Candidate("p0", 0, 24 * K, True)], max_budget=8 * K)
    first = m.auto.target_ms
    later = [Candidate("p0", 20 * K, 4 * K, True)]
    fresh = AutoTargetTracker(AutoTarget(m.predictor, 2)).target_for(later, 8 * K)
    assert fresh < first  # what a fresh tracker would pick for the rest alone
    old = m.auto
    m.use_host_ms(2.0)
    assert m.auto is not old and m.auto.auto.host_ms == 2.0
    m.plan_step(later, max_budget=8 * K)
    assert m.auto.head == "p0" and m.auto.target_ms >= first
    # An accepted refit (same coefficients here, so only the rebuild is tested).
    m._use_model(model)
    m.plan_step([Candidate("p0", 21 * K, 3 * K, True)], max_budget=8 * K)
    assert m.auto.target_ms >= first
    # A new head is chosen for on its own.
    m.plan_step([Candidate("p1", 0, 2 * K, True)], max_budget=8 * K)
    assert m.auto.head == "p1"


def test_decodes_of_steps_nobody_planned_reach_the_first_choice_for_a_new_head():
    # Steps with decodes only are not planned (nothing to size), but they are scheduled and
    # recorded. A prompt arriving during them must be chosen for with the decode that comes
    # back in the next step: a memory of planned steps only still held the decodes of the
    # last prefill step (none here), and the first chunk came out a third below base's.
    model = LatencyModel(a=1.8e-5, b=0.12, c=5.2, gamma=2.9e-4, d=1.5e-6)
    m = ProfilingChunkManager(CoreSettings(base_chunk=8 * K, min_chunk=256, pp_size=2,
                                           online_calibration=False, target_mode="auto"))
    m.load_profile({"model": model.to_dict()})
    m.plan_step([Candidate("r0", 0, 4 * K, True)], max_budget=8 * K)
    m.record_decodes([])
    # r0 is decoding: its token rides every other step, the steps between are empty. The
    # last step carried it, so its token is in flight now and rides in the next step.
    for k in range(5):
        m.record_decodes([(4 * K + k, 1)] if k % 2 == 0 else [])
    m.plan_step([Candidate("r1", 0, 16 * K, True)], max_budget=8 * K)
    auto = m.auto.auto
    cycle = ((0.0, 0), (auto.decode_cost(4 * K + 4, 1), 1))
    assert m.auto.target_ms == pytest.approx(auto.choose([(0, 16 * K)], 8 * K, cycle).target_ms)
    blind = auto.choose([(0, 16 * K)], 8 * K, ((0.0, 0), (0.0, 0))).target_ms
    assert m.auto.target_ms > blind


def test_a_step_planned_again_does_not_shift_the_decode_cycle():
    # The runtime plans a step again when prefixes cached within it change the walk; vLLM
    # still schedules one step, so the decodes auto forecasts for the coming steps must be
    # the same as when the step was planned once.
    model = LatencyModel(a=2.65e-6, b=0.021, c=0.65, gamma=3.6e-4, d=2.5e-6)

    def run(plans_of_step_two: int) -> tuple[float, ProfilingChunkManager]:
        m = ProfilingChunkManager(CoreSettings(base_chunk=8 * K, min_chunk=256, pp_size=3,
                                               online_calibration=False, target_mode="auto"))
        m.load_profile({"model": model.to_dict()})
        many = [Candidate(f"d{i}", 30_000, 1, False) for i in range(12)]
        few = [Candidate(f"e{i}", 2_000, 1, False) for i in range(2)]
        m.plan_step(many + [Candidate("a", 0, 600, True)], max_budget=8 * K)
        m.record_decodes([(d.history, 1) for d in many])
        for _ in range(plans_of_step_two):
            m.plan_step(few + [Candidate("b", 0, 700, True)], max_budget=8 * K)
        m.record_decodes([(d.history, 1) for d in few])
        m.plan_step([Candidate("c", 0, 20_000, True)], max_budget=8 * K)
        return m.auto.target_ms, m

    once, m = run(1)
    twice, _ = run(2)
    assert twice == pytest.approx(once)
    # And it is the choice for this step's (no) decodes, then those of the two steps before.
    auto = m.auto.auto
    cycle = ((0.0, 0),
             (sum(auto.decode_cost(30_000, 1) for _ in range(12)), 12),
             (sum(auto.decode_cost(2_000, 1) for _ in range(2)), 2))
    assert once == pytest.approx(auto.choose([(0, 20_000)], 8 * K, cycle).target_ms)


@pytest.mark.parametrize("stages", [2, 4])
def test_large_steps_in_flight_keep_a_new_head_from_falling_below_them(stages):
    # With at most S batches in flight, a step far cheaper than the ones still in the
    # pipeline leaves the first stage waiting for a slot: a new head behind large steps is
    # better off starting near their size. Steps in flight at the queue's own size change
    # little.
    model = LatencyModel(a=4e-7, b=0.01, c=0.5)
    p = ChunkSizePredictor(model, base_chunk=2048, min_chunk=256)
    auto = AutoTarget(p, stages)
    queue = [(0, 8 * K)] * 3
    alone = auto.choose(queue, 2048).target_ms
    behind_large = auto.choose(queue, 2048, in_flight=[30.0] * (stages - 1)).target_ms
    behind_equal = auto.choose(queue, 2048, in_flight=[alone] * (stages - 1)).target_ms
    assert behind_large > 1.5 * alone
    assert behind_equal == pytest.approx(alone, rel=0.1)
    # Only the last S-1 steps can still be in the pipeline; bad costs are ignored.
    assert auto.choose(queue, 2048, in_flight=[30.0] * 8 + [alone] * (stages - 1)) \
        .target_ms == pytest.approx(behind_equal)
    assert auto.choose(queue, 2048, in_flight=[math.nan, -1.0]).target_ms == alone
