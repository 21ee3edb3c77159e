"""Property fuzzing of the core at extreme and degenerate values (10,000 cases per property).

test_core_predictor.py and test_core_step_planner.py fuzz realistic ranges; here the ranges are
the whole representable space the core accepts: coefficients from 0 and denormals to 1e300,
histories to 2^50, budgets and blocks of 1 token up to 2^31, any smoothing in (0, 1], minimum
chunks from 0 to far above the base chunk. Whatever the numbers, the core must not raise, must
make progress every step, and must keep every invariant of the core issue: chunks sum to the
prompt, are aligned except the last, never exceed the budget or what is left, and never grow
with history for a fixed target; the step planner never starves decodes and never plans an
empty step while something can run. derandomize=True keeps CI reproducible.
"""

from __future__ import annotations

import math
import os
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_ascend_cpp.core import (
    Candidate,
    ChunkSizePredictor,
    CoreSettings,
    CppState,
    LatencyModel,
    ProfilingChunkManager,
    StepPlanner,
    simulate,
)

# CPP_FUZZ_CASES raises the count for a deeper local run; CI uses the default.
CASES = int(os.environ.get("CPP_FUZZ_CASES", "10000"))
FUZZ = settings(max_examples=CASES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))

# One draw per parameter: hypothesis' own generation, not the core, is what costs time here,
# and 10,000 cases per property must fit the CI budget. Its float and integer strategies
# already favour the boundaries (0, denormals, the largest values, small integers), so plain
# ranges reach the degenerate and extreme points without palettes.
coefficient = st.floats(0.0, 1e300)
models = st.builds(LatencyModel, a=coefficient, b=coefficient, c=coefficient, gamma=coefficient)
any_coefficient = st.floats(-1e300, 1e300)
maybe_negative_models = st.builds(LatencyModel, a=any_coefficient, b=any_coefficient,
                                  c=any_coefficient, gamma=any_coefficient)
sizes = st.integers(1, 2**31)
blocks = st.integers(1, 2**20)
smoothing = st.floats(1e-12, 1.0)
targets = st.sampled_from([None, None, None, 1e-300, 1e-3, 1.0, 100.0, 1e6, 1e300])


@st.composite
def predictors(draw: st.DrawFn, model_strategy: st.SearchStrategy = models) -> ChunkSizePredictor:
    base = draw(sizes)
    return ChunkSizePredictor(
        draw(st.none() | model_strategy),
        base_chunk=base,
        smooth_factor=draw(smoothing),
        # Above the base it is clamped to the base, so this range covers every behaviour.
        min_chunk=draw(st.integers(0, base)),
        block_size=draw(blocks),
        target_ms=draw(targets),
    )


# Upper bound on chunks per prompt: a chunk is at least one aligned unit (or the budget, or
# what is left), and the tail rules at most halve what remains, so this keeps every case fast.
UNITS_PER_PROMPT = 16


@st.composite
def prompt_cases(draw: st.DrawFn) -> tuple:
    p = draw(predictors())
    budget = draw(sizes)
    unit = min(p.alignment, budget, p.base_chunk)  # the fixed fallback chunk may be smaller
    prompt = draw(st.integers(1, UNITS_PER_PROMPT * unit))
    history = draw(st.integers(0, 2**50))
    return p, prompt, budget, history


@FUZZ
@given(prompt_cases())
def test_every_prompt_is_chunked_to_completion_with_the_invariants(case: tuple) -> None:
    p, prompt, budget, history0 = case
    align = p.alignment
    history, remaining = history0, prompt
    chunks = []
    previous = None
    while remaining > 0:
        assert len(chunks) <= 2 * UNITS_PER_PROMPT + 64, "no progress toward the prompt's end"
        d = p.next_chunk(history, remaining, budget)
        assert isinstance(d.chunk, int)
        assert 1 <= d.chunk <= min(remaining, budget), (d, remaining, budget)
        last = d.chunk == remaining
        if d.fallback:
            # Only without a usable model: then every chunk is the fixed one.
            assert not p.ready and d.chunk == min(p.base_chunk, remaining, budget), d
        else:
            # Past gamma exhaustion too: the smallest chunk, never a jump back up.
            if not last:
                assert d.chunk % align == 0 or (budget < align and d.chunk == budget), (d, align)
            if previous is not None:
                assert d.chunk <= previous, (previous, d)
            previous = d.chunk
        chunks.append((history, d.chunk))
        history += d.chunk
        remaining -= d.chunk
    assert sum(n for _, n in chunks) == prompt


HISTORIES = [0, 1, 63, 64, 4096, 65536, 2**31, 2**40]


def seeded_candidates(seed: int, n: int) -> list[Candidate]:
    """Running decodes and partial prefills, then waiting prefills, in vLLM's walk order."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if rng.random() < 0.5:
            history = rng.choice(HISTORIES[1:]) + rng.randrange(64)
            out.append(Candidate(f"r{i}", history, rng.choice([1, 1, 1, 2, 8]), False))
        else:
            remaining = rng.choice([1, 2, 63, 64, 65, 2048, 100_000, 2**31]) + rng.randrange(8)
            out.append(Candidate(f"r{i}", rng.choice(HISTORIES), remaining, True))
    return out


@st.composite
def step_cases(draw: st.DrawFn) -> tuple:
    p = draw(predictors(maybe_negative_models))
    cands = seeded_candidates(draw(st.integers(0, 2**32)), draw(st.integers(0, 12)))
    max_budget = draw(sizes)
    max_requests = draw(st.sampled_from([None, None, 1, 2, 5, 32]))
    target = draw(st.sampled_from([None, None, 1e-300, 1.0, 1e300, math.nan, math.inf, -1.0, 0.0]))
    return StepPlanner(p), cands, max_budget, max_requests, target


@FUZZ
@given(step_cases())
def test_step_planner_never_starves_and_never_plans_an_empty_step(case: tuple) -> None:
    sp, cands, max_budget, max_requests, target = case
    plan = sp.plan(cands, max_budget=max_budget, max_requests=max_requests, target_ms=target)
    assert 1 <= plan.token_budget <= max_budget
    assert plan.prefill_cap >= 0
    assert plan.items == simulate(cands, plan.token_budget, plan.prefill_cap, max_requests)
    walk = cands if max_requests is None else cands[:max_requests]
    if walk:
        assert plan.items, "candidates exist but the step schedules nothing"
    assert sum(i.tokens for i in plan.items) <= max_budget
    cap = plan.prefill_cap
    need = [min(c.remaining, cap) if c.is_prefill and cap > 0 else c.remaining for c in walk]
    scheduled = {i.req_id: i.tokens for i in plan.items}
    decodes = [i for i, c in enumerate(walk) if not c.is_prefill]
    if decodes and sum(need[: decodes[-1] + 1]) <= max_budget:
        for i in decodes:
            assert scheduled.get(walk[i].req_id) == walk[i].remaining, "a decode was starved"
    lead = next((i for i, c in enumerate(walk) if c.is_prefill), None)
    if lead is not None and sum(need[:lead]) < max_budget:
        assert scheduled.get(walk[lead].req_id, 0) >= 1, "the lead prefill did not progress"


# -- many steps through the manager, as the engine drives it ---------------------------------

# Timings no real step can have: the calibrator must reject every one before any fit.
garbage_ms = st.sampled_from([math.nan, math.inf, -math.inf, None, 0.0, -0.0, -1e-300, -1e300])


@st.composite
def serving_cases(draw: st.DrawFn) -> tuple:
    base = draw(sizes)
    block = draw(blocks)
    s = CoreSettings(
        base_chunk=base,
        smooth_factor=draw(smoothing),
        min_chunk=draw(st.integers(0, base)),
        block_size=block,
        # The calibrator is fed timings no real step can have: it must reject every one before
        # any fit (a fit needs scipy and ~10 ms, which 10,000 cases cannot afford).
        online_calibration=draw(st.booleans()),
        calibration_window=16,
        max_failed_fits=1,
        # The startup report plans this prompt chunk by chunk (the engine bounds it by
        # max_model_len); a few dozen base chunks keep 1-token bases fast.
        reference_prompt_len=min(32 * base, draw(st.sampled_from([1, 4096, 65536]))),
    )
    max_budget = draw(sizes)
    unit = max(1, min(max(block, 64), max_budget, base))
    rng = random.Random(draw(st.integers(0, 2**32)))
    # (prompt tokens, prefix-cache hit = history at start, output tokens)
    requests = [(rng.randint(1, 6 * unit), rng.choice(HISTORIES), rng.randint(1, 3))
                for _ in range(draw(st.integers(1, 4)))]
    model = draw(st.none() | maybe_negative_models)
    max_requests = draw(st.sampled_from([None, None, 1, 2, 8]))
    timings = [draw(garbage_ms)]
    return s, model, requests, max_budget, max_requests, timings


@FUZZ
@given(serving_cases())
def test_a_queue_is_served_to_completion_step_by_step(case: tuple) -> None:
    s, model, requests, max_budget, max_requests, timings = case
    m = ProfilingChunkManager(s)
    if model is not None:
        try:
            m.load_profile({"model": model.to_dict()})
        except ValueError:
            m.fail("unusable profile")  # what startup does: serve with fixed chunks
    # [history, prompt_end, outputs_left]; a prefix hit starts the request at history > 0.
    state = [[hit, hit + prompt, out] for prompt, hit, out in requests]
    chunks: dict[str, int] = {f"q{i}": 0 for i in range(len(state))}
    limit = sum(p for p, _, _ in requests) + sum(o for *_, o in requests) + 8 * len(requests)
    fallbacks = 0
    for step in range(limit + 1):
        cands = []
        for i, (h, end, out) in enumerate(state):
            if h < end:
                cands.append(Candidate(f"q{i}", h, end - h, True))
            elif out > 0:
                cands.append(Candidate(f"q{i}", h, 1, False))
        if not cands:
            break
        serving = m.state in (CppState.READY, CppState.CALIBRATING)
        plan = m.plan_step(cands, max_budget=max_budget, max_requests=max_requests)
        assert serving or plan.fallback, f"planned in state {m.state.value}"
        fallbacks += plan.fallback
        assert plan.items, "a step with runnable requests scheduled nothing"
        assert 1 <= plan.token_budget <= max_budget
        for item in plan.items:
            i = int(item.req_id[1:])
            h, end, out = state[i]
            if item.is_prefill:
                assert 1 <= item.tokens <= end - h
                chunks[item.req_id] += item.tokens
                state[i][0] = h + item.tokens
                if state[i][0] == end:
                    state[i][2] = out - 1  # the last prefill chunk samples a token
            else:
                state[i][0] = h + 1
                state[i][2] = out - 1
        if m.should_time_step():
            m.record_step(plan.step_items(), timings[step % len(timings)], plan.predicted_ms)
    else:
        raise AssertionError("the queue was not served within the step bound")
    assert all(out <= 0 and h >= end for h, end, out in state)
    assert [chunks[f"q{i}"] for i in range(len(state))] == [p for p, _, _ in requests]
    cal = m.calibrator
    if cal is not None:
        assert cal.n_rows == 0 and cal.attempts == 0  # garbage never reaches a fit
    summary = m.summary()
    assert summary["steps_planned"] == step
    assert summary["fallback_steps"] == fallbacks
