"""Chunk sizing: the closed-form root, the clamp order, and properties of whole plans."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from vllm_ascend_cpp.core.latency_model import LatencyModel
from vllm_ascend_cpp.core.predictor import TAIL_FOLD_TOLERANCE, ChunkSizePredictor

MANY = settings(max_examples=10_000, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

REFERENCE = LatencyModel(a=1e-7, b=0.02, c=30.0)


def cost(model: LatencyModel, history: int, chunk: int) -> float:
    return model.chunk_cost_ms(history, chunk)


# -- solve ------------------------------------------------------------------------------------

def test_target_defaults_to_base_chunk_cost_without_c():
    p = ChunkSizePredictor(REFERENCE, base_chunk=16384)
    assert p.target_ms == pytest.approx(0.02 * 16384 + 1e-7 * 16384**2)
    assert p.ready and p.alignment == 64


def test_solve_at_zero_history_returns_base_chunk():
    p = ChunkSizePredictor(REFERENCE, base_chunk=16384)
    assert p.solve(0) == pytest.approx(16384, rel=1e-12)


def test_solve_matches_the_cost_equation():
    model = LatencyModel(a=3e-7, b=0.01, c=5.0, gamma=1e-4)
    p = ChunkSizePredictor(model, base_chunk=8192)
    for history in (0, 1000, 50_000, 400_000):
        x = p.solve(history)
        assert x is not None
        assert cost(model, history, x) == pytest.approx(p.target_ms, rel=1e-9)


def test_solve_linear_model_and_gamma_exhaustion():
    model = LatencyModel(a=0.0, b=0.02, c=1.0, gamma=0.001)
    p = ChunkSizePredictor(model, base_chunk=4096)
    target = p.target_ms
    assert p.solve(0) == pytest.approx(4096)
    assert p.solve(1000) == pytest.approx((target - 1.0) / 0.02)
    # gamma*L reaches the target: no size can meet it.
    assert p.solve(int(target / 0.001) + 1) is None
    assert p.solve(0, time_ms=0.0) is None
    assert p.solve(0, time_ms=-1.0) is None


def test_solve_without_growth_is_unbounded():
    p = ChunkSizePredictor(LatencyModel(a=0.0, b=0.0, c=1.0), base_chunk=64, target_ms=10.0)
    assert p.solve(0) == math.inf
    assert p.next_chunk(0, 5000, budget=1000).chunk == 960  # budget, aligned down


def test_solve_is_stable_for_tiny_a_and_long_prefix():
    # The textbook root (-B + sqrt(B^2 + 4aR)) / 2a loses every digit here.
    model = LatencyModel(a=1e-15, b=0.02, c=0.0)
    p = ChunkSizePredictor(model, base_chunk=4096)
    x = p.solve(10**9)
    assert x is not None
    assert cost(model, 10**9, x) == pytest.approx(p.target_ms, rel=1e-9)


def test_no_model_means_not_ready_and_fixed_chunks():
    p = ChunkSizePredictor(None, base_chunk=8192)
    assert not p.ready and p.target_ms is None and p.solve(0) is None
    d = p.next_chunk(0, 100_000, budget=6000)
    assert d.fallback and d.chunk == 6000 and "no latency model" in d.reason
    assert [c.chunk for c in p.plan(20000, budget=8192)] == [8192, 8192, 3616]
    assert all(math.isnan(c.predicted_ms) for c in p.plan(20000, budget=8192))


def test_negative_coefficients_are_not_used():
    p = ChunkSizePredictor(LatencyModel(a=-1e-7, b=0.02, c=1.0), base_chunk=4096)
    assert not p.ready and "negative" in p.not_ready_reason
    assert p.next_chunk(0, 10_000).fallback


def test_invalid_settings_raise():
    with pytest.raises(ValueError):
        ChunkSizePredictor(REFERENCE, base_chunk=0)
    with pytest.raises(ValueError):
        ChunkSizePredictor(REFERENCE, base_chunk=64, smooth_factor=0.0)
    with pytest.raises(ValueError):
        ChunkSizePredictor(REFERENCE, base_chunk=64, smooth_factor=1.5)
    with pytest.raises(ValueError):
        ChunkSizePredictor(REFERENCE, base_chunk=64, block_size=0)
    with pytest.raises(ValueError):
        ChunkSizePredictor(REFERENCE, base_chunk=64).next_chunk(-1, 10)


def test_min_chunk_is_clamped_to_base_and_alignment_to_64():
    p = ChunkSizePredictor(REFERENCE, base_chunk=2048, min_chunk=4096, block_size=128)
    assert p.min_chunk == 2048 and p.alignment == 128
    assert ChunkSizePredictor(REFERENCE, base_chunk=2048, block_size=16).alignment == 64


def test_with_model_keeps_settings():
    p = ChunkSizePredictor(None, base_chunk=8192, smooth_factor=0.5, min_chunk=1024,
                           block_size=128)
    q = p.with_model(REFERENCE)
    assert (q.base_chunk, q.smooth_factor, q.min_chunk, q.block_size) == (8192, 0.5, 1024, 128)
    assert q.ready and q.target_ms == pytest.approx(REFERENCE.chunk_cost_ms(0, 8192))
    assert q.with_model(REFERENCE, target_ms=50.0).target_ms == 50.0


# -- next_chunk: order of clamps -------------------------------------------------------------

def test_smoothing_pulls_toward_base():
    p1 = ChunkSizePredictor(REFERENCE, base_chunk=16384, min_chunk=0)
    p5 = ChunkSizePredictor(REFERENCE, base_chunk=16384, min_chunk=0, smooth_factor=0.5)
    raw = p1.solve(100_000)
    expected = 16384 + 0.5 * (raw - 16384)
    assert p5.next_chunk(100_000, 10**6).chunk == int(expected) // 64 * 64


def test_min_chunk_floor_then_budget_then_alignment():
    p = ChunkSizePredictor(REFERENCE, base_chunk=16384, min_chunk=4000)
    # Solved size is far below min_chunk at a 2M-token prefix.
    d = p.next_chunk(2_000_000, 10**6)
    assert d.chunk == 3968 and d.clamp == "min_chunk"
    d = p.next_chunk(0, 10**6, budget=10_000)
    assert d.chunk == 9984 and d.clamp == "budget"
    # A budget below the alignment is used as is: the request must progress.
    d = p.next_chunk(0, 10**6, budget=50)
    assert d.chunk == 50 and d.clamp == "alignment"


def test_alignment_never_rounds_to_zero():
    model = LatencyModel(a=1e-3, b=1.0, c=0.0)
    p = ChunkSizePredictor(model, base_chunk=64, min_chunk=0, target_ms=0.5)
    d = p.next_chunk(10_000, 1000)
    assert d.chunk == 64 and d.clamp == "alignment"
    assert p.next_chunk(10_000, 10).chunk == 10


def test_the_smallest_chunk_when_gamma_eats_the_target():
    model = LatencyModel(a=1e-8, b=0.01, c=1.0, gamma=0.01)
    p = ChunkSizePredictor(model, base_chunk=4096, min_chunk=1000)
    exhausted = int(p.target_ms / 0.01) + 10
    d = p.next_chunk(exhausted, 100_000, budget=3000)
    assert not d.fallback and d.clamp == "over_target" and "gamma" in d.reason
    assert d.chunk == 960  # min_chunk aligned down to 64
    assert model.chunk_cost_ms(exhausted, d.chunk) > p.target_ms
    # Continuous at the exhaustion point: just before it the root is tiny and the floor
    # decides too, so a prompt's chunks do not jump back up when gamma*L crosses the target.
    assert p.next_chunk(exhausted - 20, 100_000, budget=3000).chunk == d.chunk
    # Without a floor one aligned unit still moves the prompt on.
    bare = ChunkSizePredictor(model, base_chunk=4096, min_chunk=0)
    assert bare.next_chunk(exhausted, 100_000, budget=3000).chunk == 64
    assert bare.next_chunk(exhausted, 30, budget=3000).chunk == 30


def test_tail_is_folded_when_cheap():
    # 16384 + 500 tokens at L=0: the merged chunk costs < 1.1 T, so one chunk.
    model = LatencyModel(a=0.0, b=0.02, c=1.0)
    p = ChunkSizePredictor(model, base_chunk=16384)
    d = p.next_chunk(0, 16884)
    assert d.chunk == 16884 and d.clamp == "tail_fold"


def test_tail_is_split_in_two_when_folding_costs_too_much():
    model = LatencyModel(a=0.0, b=0.02, c=1.0)
    p = ChunkSizePredictor(model, base_chunk=16384)
    d = p.next_chunk(0, 16384 + 4000)
    assert d.clamp == "tail_split"
    assert d.chunk == 10240 and 20384 - d.chunk <= d.chunk


def test_tail_fold_never_makes_chunks_grow():
    # Chunks of 4992 (5000 aligned down); folding 4995 would exceed the previous one.
    p = ChunkSizePredictor(LatencyModel(a=0.0, b=0.02, c=1.0), base_chunk=5000, min_chunk=4096)
    chunks = [c.chunk for c in p.plan(14995, budget=16384)]
    assert sum(chunks) == 14995
    assert all(x >= y for x, y in zip(chunks, chunks[1:], strict=False))


def test_plan_shrinks_with_history():
    p = ChunkSizePredictor(REFERENCE, base_chunk=16384)
    plan = p.plan(131072, budget=16384)
    chunks = [c.chunk for c in plan]
    assert sum(chunks) == 131072
    assert chunks[0] == 16384 and chunks[-1] < chunks[1] < chunks[0]
    for c in plan[:-2]:
        assert c.predicted_ms == pytest.approx(REFERENCE.request_ms(c.history, c.chunk))
        assert c.predicted_ms - REFERENCE.c <= p.target_ms * (1 + 1e-9)
        assert c.predicted_ms - REFERENCE.c >= 0.95 * p.target_ms


def test_plan_handles_prefix_cache_history_and_empty_prompt():
    p = ChunkSizePredictor(REFERENCE, base_chunk=16384)
    assert p.plan(0, budget=100) == []
    plan = p.plan(50_000, budget=16384, history=100_000)
    assert plan[0].history == 100_000 and sum(c.chunk for c in plan) == 50_000
    with pytest.raises(ValueError):
        p.plan(10, budget=0)


# -- properties of whole plans ----------------------------------------------------------------

def log_uniform(lo: float, hi: float) -> st.SearchStrategy[float]:
    return st.floats(math.log10(lo), math.log10(hi)).map(lambda e: 10.0**e)


physical_models = st.builds(
    LatencyModel,
    a=st.one_of(st.just(0.0), log_uniform(1e-12, 1e-5)),
    b=st.one_of(st.just(0.0), log_uniform(1e-5, 1.0)),
    c=st.floats(0.0, 100.0),
    gamma=st.one_of(st.just(0.0), log_uniform(1e-9, 1e-3)),
)


_bases = st.one_of(st.integers(1, 256), st.integers(256, 65536))
_min_chunks = st.one_of(st.just(4096), st.integers(0, 1024), st.integers(0, 65536))
_blocks = st.sampled_from([1, 16, 32, 64, 128, 256, 512])
_smooths = st.one_of(st.just(1.0), st.floats(0.01, 1.0))
_targets = st.one_of(st.none(), st.none(), st.none(), log_uniform(1e-3, 1e4))
_histories = st.one_of(st.just(0), st.integers(0, 10**5), st.integers(0, 10**7))


@st.composite
def plan_cases(draw):
    model = draw(physical_models)
    base = draw(_bases)
    min_chunk = draw(_min_chunks)
    block = draw(_blocks)
    smooth = draw(_smooths)
    budget = draw(st.one_of(st.just(base), st.integers(base, 4 * base), st.integers(1, 131072)))
    explicit = draw(_targets)
    p = ChunkSizePredictor(model, base_chunk=base, smooth_factor=smooth, min_chunk=min_chunk,
                           block_size=block, target_ms=explicit)
    prompt = draw(st.one_of(st.integers(1, 12 * min(base, budget) + 64),
                            st.integers(4 * min(base, budget), 16 * min(base, budget) + 64)))
    history = draw(_histories)
    return p, prompt, budget, history


MAX_CHUNKS = 300


@MANY
@given(plan_cases())
def test_plan_properties(case):
    p, prompt, budget, history0 = case
    a = p.alignment
    history, remaining = history0, prompt
    decisions = []
    while remaining > 0:
        d = p.next_chunk(history, remaining, budget)
        # Progress and bounds.
        assert 1 <= d.chunk <= min(remaining, budget)
        decisions.append((history, remaining, d))
        history += d.chunk
        remaining -= d.chunk
        # Long plans of tiny chunks are valid but slow; they add nothing the short ones miss.
        assume(len(decisions) <= MAX_CHUNKS)
    plan = p.plan(prompt, budget=budget, history=history0)
    assert [c.chunk for c in plan] == [d.chunk for _, _, d in decisions]
    assert sum(c.chunk for c in plan) == prompt
    assert [c.history for c in plan] == [h for h, _, _ in decisions]

    previous = None
    for i, (hist, rem, d) in enumerate(decisions):
        last = i == len(decisions) - 1
        if d.fallback:
            # Only without a usable model (a target of 0): the fixed chunk every time.
            assert not p.ready and d.chunk == min(p.base_chunk, rem, budget), d
            continue
        if not last:
            # Aligned, unless the budget is below one aligned unit.
            assert d.chunk % a == 0 or (budget < a and d.chunk == budget)
        if previous is not None:
            # Chunks never grow with history for a fixed target.
            assert d.chunk <= previous
        previous = d.chunk
        if (not last and p.smooth_factor == 1.0 and d.clamp == "" and p.ready
                and d.chunk >= 40 * a and p.solve(hist) != math.inf):
            # No clamp bound: the aligned root costs within 5% of the target.
            spent = cost(p.model, hist, d.chunk)
            assert spent <= p.target_ms * (1 + 1e-6)
            assert spent >= 0.95 * p.target_ms
        if d.clamp == "tail_fold":
            assert last and cost(p.model, hist, d.chunk) <= TAIL_FOLD_TOLERANCE * p.target_ms * (
                1 + 1e-9)


# Strategies are built once: constructing them inside a composite costs more than the test.
_wide = st.one_of(st.just(0.0), st.floats(5e-324, 1e300), st.floats(-1e300, -5e-324))
_any_float = st.floats(allow_nan=True, allow_infinity=True)
_extreme_predictors = st.builds(
    ChunkSizePredictor,
    st.one_of(st.none(), st.builds(LatencyModel, a=_wide, b=_wide, c=_wide, gamma=_wide)),
    base_chunk=st.integers(1, 2**40),
    smooth_factor=st.floats(1e-9, 1.0),
    min_chunk=st.integers(0, 2**40),
    block_size=st.integers(1, 2**20),
    target_ms=st.one_of(st.none(), _any_float),
)
extreme_cases = st.tuples(
    _extreme_predictors,
    st.integers(0, 2**62),
    st.integers(0, 2**40),
    st.one_of(st.none(), st.integers(-5, 2**40)),
    st.one_of(st.none(), _any_float),
)


@MANY
@given(extreme_cases)
def test_next_chunk_always_progresses_and_never_raises(case):
    p, history, remaining, budget, time_ms = case
    d = p.next_chunk(history, remaining, budget, time_ms)
    cap = remaining if budget is None else min(remaining, max(budget, 0))
    if cap >= 1:
        assert 1 <= d.chunk <= cap
    else:
        assert d.chunk == 0
    assert isinstance(d.chunk, int)
    x = p.solve(history, time_ms)
    assert x is None or x >= 0


@settings(max_examples=2000, deadline=None)
@given(physical_models, st.integers(64, 65536), st.integers(0, 10**6), st.integers(1, 10**6),
       st.floats(0.01, 1.0))
def test_next_chunk_never_grows_with_history_for_fixed_remaining(model, base, h1, dh, smooth):
    # Within the non-tail regime the decision is a non-increasing function of history.
    p = ChunkSizePredictor(model, base_chunk=base, smooth_factor=smooth, min_chunk=0)
    assume(p.ready)
    remaining = 10**9
    d1 = p.next_chunk(h1, remaining, 10**7)
    d2 = p.next_chunk(h1 + dh, remaining, 10**7)
    # Past gamma exhaustion too: no jump back up to the fixed chunk.
    assert not d1.fallback and not d2.fallback
    assert d2.chunk <= d1.chunk
