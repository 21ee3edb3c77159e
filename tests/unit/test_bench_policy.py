"""CppRuntime.set_bench_policy (benchmark only): one engine planning as another would.

The runtime under test is the plugin's own, built as the simulator builds it (from a real
CppConfig through validate_for_engine); the reference is a second runtime configured the
ordinary way with the smaller budget. The scheduling side (vLLM with a fixed budget of N) is
checked on the real engine in tests/integration/test_bench_emulation.py.
"""

from __future__ import annotations

import pytest

from vllm_ascend_cpp.core import LatencyModel
from vllm_ascend_cpp.sim import EngineSpec, Policy
from vllm_ascend_cpp.sim.engine import SimRequest, SimScheduler, build_runtime

MODEL = LatencyModel(a=2.6e-6, b=0.021, c=0.65, gamma=3.6e-4, d=2.5e-6)
ENGINE = EngineSpec(stages=2, model=MODEL)


def _plan_sizes(rt, prompt: int, budget: int) -> list[int]:
    return [c.chunk for c in rt.manager.predictor.plan(prompt, budget=budget)]


@pytest.mark.parametrize("kind,mode", [("cpp-base", "base"), ("cpp-auto", "auto")])
def test_switched_runtime_plans_like_an_engine_with_that_budget(kind: str, mode: str) -> None:
    big = build_runtime(ENGINE, Policy(kind, 8192))
    ref = build_runtime(ENGINE, Policy(kind, 2048))
    assert _plan_sizes(big, 16384, 8192) != _plan_sizes(ref, 16384, 2048)
    big.set_bench_policy(mode, 2048)
    assert big.max_budget == 2048
    for field in ("base_chunk", "min_chunk", "target_mode"):
        assert getattr(big.manager.settings, field) == getattr(ref.manager.settings, field)
    assert big.manager.predictor.target_ms == pytest.approx(ref.manager.predictor.target_ms)
    assert _plan_sizes(big, 16384, 2048) == _plan_sizes(ref, 16384, 2048)
    assert (big.manager.auto is not None) == (mode == "auto")


def test_a_base_chunk_below_the_budget_plans_like_cpp_config_with_it() -> None:
    big = build_runtime(ENGINE, Policy("cpp-base", 8192))
    ref = build_runtime(ENGINE, Policy("cpp-auto", 8192, base_chunk=2048))
    big.set_bench_policy("auto", 8192, base_chunk=2048)
    assert big.max_budget == 8192
    for field in ("base_chunk", "min_chunk", "target_mode"):
        assert getattr(big.manager.settings, field) == getattr(ref.manager.settings, field)
    assert big.manager.settings.base_chunk == 2048
    assert big.manager.predictor.target_ms == pytest.approx(ref.manager.predictor.target_ms)
    with pytest.raises(ValueError, match="base_chunk"):
        big.set_bench_policy("auto", 4096, base_chunk=8192)


def test_a_smallest_chunk_plans_like_cpp_config_with_it() -> None:
    big = build_runtime(ENGINE, Policy("cpp-base", 8192))
    ref = build_runtime(ENGINE, Policy("cpp-base", 8192, base_chunk=2048, min_chunk=256))
    big.set_bench_policy("base", 8192, base_chunk=2048, min_chunk=256)
    assert big.manager.settings.min_chunk == ref.manager.settings.min_chunk == 256
    sched = SimScheduler(8192, 16)
    req = SimRequest("r0", 16000, 4, 0.0)
    req.num_computed_tokens = 14000  # deep in the prompt: the floor can decide the chunk
    sched.running.append(req)
    sched.requests[req.request_id] = req
    assert big.plan(sched).items == ref.plan(sched).items
    big.set_bench_policy("base", 8192, base_chunk=2048)
    assert big.manager.settings.min_chunk == 512  # the mode's default again
    with pytest.raises(ValueError, match="min_chunk"):
        big.set_bench_policy("base", 8192, base_chunk=2048, min_chunk=4096)


def test_fixed_sets_the_budget_on_every_step_and_none_restores() -> None:
    rt = build_runtime(ENGINE, Policy("cpp-base", 8192))
    sched = SimScheduler(8192, 16)
    req = SimRequest("r0", 12000, 4, 0.0)
    sched.waiting.append(req)
    sched.requests[req.request_id] = req
    assert rt.plan(sched).token_budget == 8192  # CPP base: the first chunk is the base chunk
    rt.set_bench_policy("fixed", 512)
    plan = rt.plan(sched)
    assert plan.token_budget == 512 and plan.prefill_cap == 0
    assert [i.tokens for i in plan.items] == [512]
    req.num_computed_tokens = 12000  # decode only: still the fixed budget, as vLLM's own
    assert rt.plan(sched).token_budget == 512
    rt.set_bench_policy(None)
    assert rt.bench_policy is None and rt.max_budget == 8192
    assert rt.plan(sched) is None  # decode-only, operator's settings: vLLM's own budget


def test_each_policy_learns_its_own_host_time() -> None:
    # Fixed chunks that grow with the prefix come back late by the rise (about 32 ms per step
    # at 16k prompts); an auto engine of its own never sees those gaps.
    rt = build_runtime(ENGINE, Policy("cpp-base", 8192))
    rt.set_bench_policy("fixed", 1024)
    for _ in range(16):
        rt.manager.record_host_gap(32.0)
    rt.set_bench_policy("auto", 8192)
    assert rt.manager.host_ms == 0.0  # nothing learnt from its own steps yet, as a new engine
    for _ in range(16):
        rt.manager.record_host_gap(5.0)
    assert rt.manager.host_ms == pytest.approx(5.0)
    rt.set_bench_policy("fixed", 1024)
    rt.manager.record_host_gap(40.0)
    rt.set_bench_policy("auto", 8192)
    assert rt.manager.host_ms == pytest.approx(5.0)
    assert rt.manager.auto.auto.host_ms == pytest.approx(5.0)  # what its forecast charges
    rt.set_bench_policy("auto", 8192, min_chunk=512)  # another policy: a history of its own
    assert rt.manager.host_ms == 0.0
    rt.set_bench_policy(None)  # the operator's settings (base here) keep theirs
    assert rt.manager.host_ms == 0.0


def test_bad_bench_policies_are_refused() -> None:
    rt = build_runtime(ENGINE, Policy("cpp-base", 4096))
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        rt.set_bench_policy("fixed", 8192)
    with pytest.raises(ValueError, match="bench mode"):
        rt.set_bench_policy("turbo", 1024)
    with pytest.raises(ValueError):
        rt.set_bench_policy("base", 0)
    assert rt.bench_policy is None
