"""The step planner: vLLM's walk replayed, budgets that meet the target, decodes never starved."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_ascend_cpp.core.latency_model import LatencyModel
from vllm_ascend_cpp.core.predictor import ChunkSizePredictor
from vllm_ascend_cpp.core.step_planner import Candidate, PlannedItem, StepPlanner, simulate

MODEL = LatencyModel(a=1e-7, b=0.02, c=30.0, gamma=1e-5)


def planner(model=MODEL, base=8192, min_chunk=0, **kw) -> StepPlanner:
    return StepPlanner(ChunkSizePredictor(model, base_chunk=base, min_chunk=min_chunk, **kw))


def decode(i: int, history: int = 1000, n: int = 1) -> Candidate:
    return Candidate(f"d{i}", history, n, False)


def prefill(i: int, remaining: int, history: int = 0) -> Candidate:
    return Candidate(f"p{i}", history, remaining, True)


# -- simulate ---------------------------------------------------------------------------------

def reference_walk(candidates, budget, cap, max_requests):
    """vLLM's walk written out the slow way, one request at a time."""
    out = []
    for cand in candidates:
        if max_requests is not None and len(out) >= max_requests:
            break
        want = cand.remaining
        if cand.is_prefill and cap > 0:
            want = min(want, cap)
        n = min(want, budget)
        if n <= 0:
            break
        out.append(PlannedItem(cand.req_id, cand.history, n, cand.is_prefill))
        budget -= n
    return tuple(out)


def test_simulate_examples():
    cands = [decode(0), decode(1, n=3), prefill(0, 10000, 500), prefill(1, 7000)]
    items = simulate(cands, 5000, 2048)
    assert [(i.req_id, i.tokens) for i in items] == [("d0", 1), ("d1", 3), ("p0", 2048),
                                                      ("p1", 2048)]
    items = simulate(cands, 5000, 0)
    assert [(i.req_id, i.tokens) for i in items] == [("d0", 1), ("d1", 3), ("p0", 4996)]
    assert len(simulate(cands, 5000, 0, max_requests=2)) == 2
    # A request that would get nothing ends the walk.
    assert simulate([decode(0), prefill(0, 0), decode(1)], 100, 0) == simulate([decode(0)], 100, 0)
    assert simulate(cands, 0, 0) == ()


candidate_lists = st.lists(
    st.builds(Candidate, req_id=st.text(max_size=3), history=st.integers(0, 10**6),
              remaining=st.integers(0, 20000), is_prefill=st.booleans()),
    max_size=30)


@settings(max_examples=2000, deadline=None)
@given(candidate_lists, st.integers(0, 50000), st.integers(0, 20000),
       st.one_of(st.none(), st.integers(0, 40)))
def test_simulate_matches_the_reference_walk(cands, budget, cap, max_requests):
    assert simulate(cands, budget, cap, max_requests) == reference_walk(cands, budget, cap,
                                                                        max_requests)


# -- plan -------------------------------------------------------------------------------------

def test_not_ready_gives_the_fallback_plan():
    sp = StepPlanner(ChunkSizePredictor(None, base_chunk=8192))
    cands = [decode(0), prefill(0, 100000)]
    plan = sp.plan(cands, max_budget=8192)
    assert plan.fallback and plan.token_budget == 8192 and plan.prefill_cap == 0
    assert math.isnan(plan.predicted_ms)
    assert plan.items == simulate(cands, 8192, 0)


def test_single_prefill_budget_is_the_predictor_chunk():
    sp = planner(base=16384, min_chunk=4096)
    for history in (0, 30000, 100000):
        plan = sp.plan([prefill(0, 200000, history)], max_budget=16384)
        chunk = sp.predictor.next_chunk(history, 200000, 16384).chunk
        assert plan.token_budget == chunk == plan.prefill_cap
        assert plan.items == (PlannedItem("p0", history, chunk, True),)
        assert plan.predicted_ms == pytest.approx(MODEL.request_ms(history, chunk))
        assert not plan.fallback


def test_finishing_prefill_has_no_cap_and_leftover_time_goes_to_the_next():
    sp = planner(base=16384)
    plan = sp.plan([prefill(0, 1000, 50000), prefill(1, 100000)], max_budget=16384)
    assert plan.prefill_cap == 0
    tokens = {i.req_id: i.tokens for i in plan.items}
    # The step is whole units of the alignment: the unfinished p1 gives up the odd tokens.
    assert tokens["p0"] == 1000 and 0 < tokens["p1"] < 16384 and (1000 + tokens["p1"]) % 64 == 0
    assert plan.predicted_ms - MODEL.c <= sp.predictor.target_ms * (1 + 1e-9)
    assert plan.token_budget == 1000 + tokens["p1"]


def test_decodes_shrink_the_lead_chunk_and_are_all_scheduled():
    sp = planner(base=16384)
    decodes = [decode(i, history=30000) for i in range(64)]
    plan = sp.plan([*decodes, prefill(0, 200000)], max_budget=16384)
    alone = sp.plan([prefill(0, 200000)], max_budget=16384)
    assert all(any(i.req_id == d.req_id for i in plan.items) for d in decodes)
    assert plan.prefill_cap < alone.prefill_cap
    assert plan.predicted_ms - MODEL.c <= sp.predictor.target_ms * (1 + 1e-9)


@pytest.mark.parametrize("remaining", [1000, 100, 65])
def test_a_prompt_that_would_finish_in_the_busier_phase_finishes_one_step_later(remaining):
    sp = planner(base=16384)
    cands = [decode(0), prefill(0, remaining, 5000)]
    free = sp.plan(cands, max_budget=16384)
    assert free.prefill_cap == 0 and free.items[-1].tokens == remaining
    # This step carries one decode, the next none: the prompt's last chunk waits for it.
    held = sp.plan(cands, max_budget=16384, next_phase_decodes=0)
    # Half in whole units of the alignment (64), never below the smallest chunk (64 here).
    half = max(remaining // 2 // 64 * 64, 64)
    assert held.lead.clamp == "phase_hold" and held.lead.chunk == half
    # Whole units may take the decode's odd token off the chunk; it still does not finish.
    assert 0 < held.items[-1].tokens <= half < remaining
    # As busy or busier next: no reason to wait.
    for busy in (1, 2):
        assert sp.plan(cands, max_budget=16384, next_phase_decodes=busy) == free


@pytest.mark.parametrize("min_chunk,remaining", [(0, 1), (0, 64), (0, 40), (1024, 1000)])
def test_the_phase_hold_never_cuts_below_the_smallest_chunk(min_chunk, remaining):
    # A prompt no longer than the smallest chunk (one alignment unit, or min_chunk) runs whole.
    sp = planner(base=16384, min_chunk=min_chunk)
    short = [decode(0), prefill(0, remaining, 5000)]
    assert sp.plan(short, max_budget=16384, next_phase_decodes=0) == sp.plan(
        short, max_budget=16384)


def test_the_phase_hold_never_splits_an_unfinished_chunk():
    sp = planner(base=16384)
    long = [decode(0), prefill(0, 500000, 5000)]
    assert sp.plan(long, max_budget=16384, next_phase_decodes=0) == sp.plan(long,
                                                                            max_budget=16384)


def test_a_lead_past_gamma_exhaustion_gets_the_smallest_chunk_and_the_step_goes_over():
    # History so long that gamma*L alone exceeds the target: no size meets it. The lead gets
    # min_chunk (not the base chunk it used to get), the step is still planned, and the plan
    # says it goes over its target.
    sp = planner(model=LatencyModel(a=1e-7, b=0.02, c=30.0, gamma=1e-1), base=2048,
                 min_chunk=256)
    cands = [decode(0, history=0), prefill(0, 100_000, 10**6), prefill(1, 5000)]
    plan = sp.plan(cands, max_budget=16384)
    assert not plan.fallback and plan.lead.clamp == "over_target" and "gamma" in plan.reason
    assert plan.lead.chunk == 256
    # Nothing else joins a step already over its target (the lead gives the decode's token
    # up to keep the step at whole units).
    assert [i.req_id for i in plan.items] == ["d0", "p0"] and plan.scheduled_tokens == 256
    assert plan.predicted_ms > plan.target_ms


def test_a_cheap_rest_is_taken_a_step_early_when_the_next_phase_is_busier():
    sp = planner(base=16384)
    lead = sp.plan([prefill(0, 10**6, 5000)], max_budget=32768).lead.chunk
    # A rest of a tenth of a chunk after this one: it would finish in the next step.
    cands = [prefill(0, lead + lead // 10, 5000)]
    free = sp.plan(cands, max_budget=32768)
    assert free.prefill_cap == lead
    early = sp.plan(cands, max_budget=32768, next_phase_decodes=3)
    assert early.prefill_cap == 0 and early.items[-1].tokens == lead + lead // 10
    assert early.lead.clamp == "phase_merge"
    # Not when the next phase is as quiet, nor when the rest is a whole second chunk.
    assert sp.plan(cands, max_budget=32768, next_phase_decodes=0) == free
    twice = [prefill(0, 2 * lead, 5000)]
    assert sp.plan(twice, max_budget=32768, next_phase_decodes=3) == sp.plan(
        twice, max_budget=32768)


def test_decodes_riding_along_keep_the_step_at_whole_units():
    # vLLM's fixed budget gives the prefill what the decodes leave of it; the plan does the
    # same with its own chunk, so step sizes recur instead of meeting the kernels new.
    sp = planner(base=2048)
    for n in (1, 3, 63, 64, 65):
        decodes = [decode(i, history=9000) for i in range(n)]
        plan = sp.plan([prefill(0, 200000, 4096), *decodes], max_budget=8192)
        alone = sp.plan([prefill(0, 200000, 4096)], max_budget=8192,
                        target_ms=sp.predictor.target_ms
                        - sum(MODEL.chunk_cost_ms(9000, 1) for _ in decodes))
        unit = sp.predictor.alignment
        assert plan.scheduled_tokens % unit == 0, (n, plan.items)
        lead = plan.items[0].tokens
        # The lead gives up fewer than one unit against the aligned chunk it was given.
        assert alone.items[0].tokens - unit < lead <= alone.items[0].tokens
        assert plan.prefill_cap == lead and len(plan.items) == n + 1


def test_decodes_are_never_starved_even_over_target():
    sp = planner(model=LatencyModel(a=0.0, b=0.02, c=1.0, gamma=0.01), base=1024)
    decodes = [decode(i, history=50000) for i in range(300)]  # 300 * 500 ms >> target
    plan = sp.plan([prefill(0, 90000, 2000), *decodes], max_budget=8192)
    ids = {i.req_id for i in plan.items}
    assert all(d.req_id in ids for d in decodes)
    assert any(i.req_id == "p0" and i.tokens >= 1 for i in plan.items)  # lead progresses
    assert plan.predicted_ms > sp.predictor.target_ms


def test_explicit_target_changes_the_budget():
    sp = planner(base=16384)
    cands = [prefill(0, 200000)]
    small = sp.plan(cands, max_budget=16384, target_ms=100.0)
    big = sp.plan(cands, max_budget=16384)
    assert small.token_budget < big.token_budget
    assert sp.plan(cands, max_budget=16384, target_ms=-1.0).fallback


def test_max_requests_limits_the_walk():
    sp = planner(base=4096)
    cands = [decode(i) for i in range(10)] + [prefill(0, 100000)]
    plan = sp.plan(cands, max_budget=4096, max_requests=5)
    assert len(plan.items) == 5 and plan.prefill_cap == 0
    assert sp.plan([], max_budget=4096).items == ()


# Strategies are built once: constructing them inside a composite costs more than the test.
_running = st.lists(st.one_of(
    st.tuples(st.just("d"), st.integers(1, 200000), st.integers(1, 4)),
    st.tuples(st.just("p"), st.integers(0, 200000), st.integers(1, 100000)),
), max_size=40)
_waiting = st.lists(st.tuples(st.just("p"), st.integers(0, 50000), st.integers(1, 100000)),
                    max_size=5)
_models = st.builds(LatencyModel, a=st.floats(0, 1e-6), b=st.floats(1e-4, 0.1),
                    c=st.floats(0, 50), gamma=st.floats(0, 1e-4))
_bases = st.integers(64, 32768)
_blocks = st.sampled_from([16, 64, 128])
_budgets = st.integers(1, 65536)
_max_requests = st.one_of(st.none(), st.integers(1, 64))


@st.composite
def step_cases(draw):
    cands = [Candidate(f"r{i}", h, n, kind == "p")
             for i, (kind, h, n) in enumerate(draw(_running) + draw(_waiting))]
    base = draw(_bases)
    p = ChunkSizePredictor(draw(_models), base_chunk=base, min_chunk=draw(st.integers(0, base)),
                           block_size=draw(_blocks))
    return StepPlanner(p), cands, draw(_budgets), draw(_max_requests)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(step_cases())
def test_plan_properties(case):
    sp, cands, max_budget, max_requests = case
    plan = sp.plan(cands, max_budget=max_budget, max_requests=max_requests)
    target = sp.predictor.target_ms
    model = sp.predictor.model
    assert 1 <= plan.token_budget <= max_budget
    assert plan.items == simulate(cands, plan.token_budget, plan.prefill_cap, max_requests)
    assert plan.predicted_ms == pytest.approx(model.step_ms(plan.step_items()))
    if plan.items:
        assert plan.token_budget == plan.scheduled_tokens  # tight: nothing left to chance

    walk = cands if max_requests is None else cands[:max_requests]
    cap = plan.prefill_cap
    need = [min(c.remaining, cap) if c.is_prefill and cap > 0 else c.remaining for c in walk]
    decode_idx = [i for i, c in enumerate(walk) if not c.is_prefill]
    scheduled = {i.req_id: i.tokens for i in plan.items}
    if decode_idx and sum(need[: decode_idx[-1] + 1]) <= max_budget:
        for i in decode_idx:  # never starved
            assert scheduled.get(walk[i].req_id) == walk[i].remaining
    lead = next((i for i, c in enumerate(walk) if c.is_prefill), None)
    if lead is not None and sum(need[:lead]) < max_budget:
        assert scheduled.get(walk[lead].req_id, 0) >= 1  # the lead progresses

    # Within target unless something forced it over: the decodes, a clamp on the lead chunk
    # that may cost more than the time it was given, or another prefill ahead of a decode.
    decode_cost = sum(model.chunk_cost_ms(walk[i].history, walk[i].remaining)
                      for i in decode_idx)
    other_prefill_forced = any(c.is_prefill and i != lead and decode_idx and i < decode_idx[-1]
                               for i, c in enumerate(walk))
    lead_ok = True
    if plan.lead is not None:
        allowed = sp.predictor.solve(walk[lead].history, target - decode_cost)
        lead_ok = not plan.lead.fallback and allowed is not None and plan.lead.chunk <= allowed
    if decode_cost <= target and lead_ok and not other_prefill_forced:
        assert plan.predicted_ms - model.c <= target * (1 + 1e-9)

    # Whole units of the alignment whenever the last item is a prefill that can give up the
    # odd tokens without finishing its prompt or stopping (and the walk did not run out).
    unit = sp.predictor.alignment
    odd = plan.scheduled_tokens % unit
    if plan.items and not plan.open_end and plan.scheduled_tokens > unit:
        k = len(plan.items) - 1
        tail = plan.items[k]
        if tail.is_prefill and odd < tail.tokens < walk[k].remaining:
            assert odd == 0, (odd, plan.items)


_tails = st.lists(st.integers(1, 100000), min_size=1, max_size=6)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(step_cases(), _tails)
def test_a_plan_without_an_open_end_is_the_plan_of_any_longer_walk(case, tail):
    # What the runtime relies on to skip building a long waiting queue: unless the budget
    # walk ran out of candidates (open_end) or vLLM's walk left budget unused, whole prompts
    # queued after the candidates change nothing. Checked by planning the longer walk.
    sp, cands, max_budget, _ = case
    plan = sp.plan(cands, max_budget=max_budget)
    longer = cands + [Candidate(f"t{i}", 0, n, True) for i, n in enumerate(tail)]
    again = sp.plan(longer, max_budget=max_budget)
    reached_end = len(plan.items) == len(cands)
    if reached_end and (plan.open_end or plan.scheduled_tokens < plan.token_budget):
        return
    if any(c.is_prefill for c in cands):  # the lead is in the head, as the runtime promises
        assert (again.token_budget, again.prefill_cap, again.items) == \
            (plan.token_budget, plan.prefill_cap, plan.items)


def test_open_end_examples():
    sp = planner(base=2048)
    # The lead alone reaches the target: the walk stopped on it, not at the end of the list.
    assert not sp.plan([prefill(0, 50000)], max_budget=16384).open_end
    # A short prompt leaves target and budget to spare: more prompts would have been taken.
    short = sp.plan([prefill(0, 100)], max_budget=16384)
    assert short.open_end and short.token_budget == 100
    # ... unless the budget itself is used up.
    assert not sp.plan([prefill(0, 64)], max_budget=64).open_end
