"""The lifecycle manager: states, fallbacks, reports, profiles, timing policy."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from vllm_ascend_cpp.core.latency_model import LatencyModel
from vllm_ascend_cpp.core.manager import CppState, ProfilingChunkManager
from vllm_ascend_cpp.core.report import REPORT_HEADER, format_report
from vllm_ascend_cpp.core.settings import CoreSettings
from vllm_ascend_cpp.core.step_planner import Candidate

TRUE = LatencyModel(a=1e-7, b=0.02, c=30.0)


def settings(**kw) -> CoreSettings:
    return CoreSettings(**{"base_chunk": 8192, "pp_size": 4, **kw})


def profiled(online: bool = True, **kw) -> ProfilingChunkManager:
    m = ProfilingChunkManager(settings(online_calibration=online, **kw))
    m.begin_profiling()
    sizes = m.sample_sizes()
    rng = np.random.default_rng(0)
    lat = [TRUE.request_ms(0, s) * (1 + 0.01 * rng.standard_normal()) for s in sizes]
    fit = m.finish_profiling(sizes, lat)
    assert fit.ok, fit.reason
    return m


def test_sample_sizes_descend_from_base():
    m = ProfilingChunkManager(settings())
    sizes = m.sample_sizes()
    assert len(sizes) == 64 and sizes[0] == 8192 and sizes[-1] == 128
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == 64
    tiny = ProfilingChunkManager(CoreSettings(base_chunk=10, num_samples=64)).sample_sizes()
    assert len(tiny) == 64 and min(tiny) >= 1 and tiny == sorted(tiny, reverse=True)


def test_happy_path_states():
    m = ProfilingChunkManager(settings())
    assert m.state is CppState.UNPROFILED and m.model is None and not m.predictor.ready
    m.begin_profiling()
    assert m.state is CppState.PROFILING
    m = profiled(online=True)
    assert m.state is CppState.CALIBRATING and m.calibrator is not None
    assert m.predictor.ready and m.planner.predictor is m.predictor
    m = profiled(online=False)
    assert m.state is CppState.READY and m.calibrator is None


def test_illegal_transitions_raise():
    m = ProfilingChunkManager(settings())
    with pytest.raises(RuntimeError):
        m.finish_profiling([1], [1.0])
    m.begin_profiling()
    with pytest.raises(RuntimeError):
        m.begin_profiling()
    with pytest.raises(RuntimeError):
        m.load_profile({"model": TRUE.to_dict()})
    m = profiled()
    with pytest.raises(RuntimeError):
        m.begin_profiling()
    with pytest.raises(RuntimeError):
        m.finish_profiling([1], [1.0])


def test_rejected_sweep_falls_back_with_the_reason():
    m = ProfilingChunkManager(settings())
    m.begin_profiling()
    sizes = m.sample_sizes()
    fit = m.finish_profiling(sizes[:5], [10.0, 11.0, 12.0, 13.0, 14.0])
    assert not fit.ok
    assert m.state is CppState.FIXED_FALLBACK
    assert "only 5 usable samples" in m.fallback_reason
    assert m.report is not None and m.report["state"] == "fixed-fallback"
    plan = m.plan_step([Candidate("p", 0, 100000, True)], max_budget=8192)
    assert plan.fallback and plan.token_budget == 8192 and plan.prefill_cap == 0


def test_fail_is_final():
    m = profiled()
    m.fail("scheduler output did not match the plan")
    assert m.state is CppState.FIXED_FALLBACK
    assert m.fallback_reason == "scheduler output did not match the plan"
    assert m.plan_step([Candidate("p", 0, 100000, True)], max_budget=8192).fallback
    assert m.record_step([(0, 4096)], 100.0) is None
    assert not m.should_time_step()


def test_plan_step_before_profiling_is_fallback():
    m = ProfilingChunkManager(settings())
    plan = m.plan_step([Candidate("d", 10, 1, False)], max_budget=512)
    assert plan.fallback and math.isnan(plan.predicted_ms) and len(plan.items) == 1


def test_plan_step_uses_the_planner_when_ready():
    m = profiled()
    plan = m.plan_step([Candidate("p", 40000, 100000, True)], max_budget=8192)
    assert not plan.fallback
    assert plan.token_budget == m.predictor.next_chunk(40000, 100000, 8192).chunk < 8192
    assert m.summary()["steps_planned"] == 1


@pytest.mark.parametrize("pp", [2, 3, 4])
def test_the_next_phase_is_the_decodes_planned_pp_minus_one_steps_ago(pp, monkeypatch):
    m = profiled(pp_size=pp)
    seen = []
    real = m.planner.plan

    def spy(cands, **kw):
        seen.append(kw.get("next_phase_decodes"))
        return real(cands, **kw)

    monkeypatch.setattr(m.planner, "plan", spy)
    # Step k carries k decodes (and a long prefill that never finishes); planning it again
    # (as a step is for prefixes cached within it) must not count it twice.
    for k in range(8):
        decodes = [Candidate(f"d{i}", 100, 1, False) for i in range(k)]
        for _ in range(2):
            m.plan_step([*decodes, Candidate("p", 0, 10**7, True)], max_budget=8192)
        m.record_decodes([(100, 1)] * k)
    assert seen[::2] == seen[1::2]
    assert seen[::2] == [None] * (pp - 1) + list(range(8 - (pp - 1)))


def test_one_stage_has_no_phases(monkeypatch):
    m = profiled(pp_size=1)
    seen = []
    real = m.planner.plan
    monkeypatch.setattr(m.planner, "plan",
                        lambda cands, **kw: seen.append(kw.get("next_phase_decodes"))
                        or real(cands, **kw))
    for _ in range(3):
        m.plan_step([Candidate("d", 100, 1, False), Candidate("p", 0, 50, True)],
                    max_budget=8192)
        m.record_decodes([(100, 1)])
    assert seen == [None] * 3


def test_steps_without_prefill_are_timed_one_in_sixteen_while_prefill_steps_all_are():
    m = profiled()
    assert m.state is CppState.CALIBRATING and m.calibrator.n_rows < m.calibrator.window
    # A window still filling times every step with prefill work, a decode-only one in 16.
    assert all(m.should_time_step(True) for _ in range(40))
    assert sum(m.should_time_step(False) for _ in range(160)) == 10
    assert all(m.should_time_step(True) for _ in range(40))


def test_report_contents():
    m = profiled()
    r = m.report
    assert r["source"] == "sweep" and len(r["samples"]) == 64
    assert set(r["coefficients"]) == {"a", "b", "c", "gamma", "d"}
    assert r["coefficients"]["d"] == 0.0  # a sweep at L = 0 cannot tell d from a
    assert r["fit"]["ok"] and r["fit"]["r2"] > 0.99
    assert r["target_ms"] == pytest.approx(m.predictor.target_ms)
    assert r["reference_prompt_len"] == 8 * 8192
    assert sum(c["chunk"] for c in r["dynamic_plan"]) == 8 * 8192
    assert [c["chunk"] for c in r["fixed_plan"]] == [8192] * 8
    assert r["ttft_dynamic_ms"] < r["ttft_fixed_ms"]
    assert r["ttft_ratio"] == pytest.approx(r["ttft_dynamic_ms"] / r["ttft_fixed_ms"])
    json.dumps(r, allow_nan=False)
    text = format_report(r)
    assert text.startswith(REPORT_HEADER)
    assert "R^2" in text and "predicted TTFT" in text and "dynamic" in text


def test_profile_round_trip_skips_the_sweep():
    m = profiled()
    saved = json.loads(json.dumps(m.profile_dict(), allow_nan=False))
    assert saved["settings"]["base_chunk"] == 8192 and len(saved["samples"]["sizes"]) == 64
    m2 = ProfilingChunkManager(settings())
    m2.load_profile(saved)
    assert m2.state is CppState.CALIBRATING
    assert m2.model == m.model
    assert m2.predictor.target_ms == pytest.approx(m.predictor.target_ms)
    assert m2.report["source"] == "cache"
    assert m2.report["fit"]["r2"] == pytest.approx(m.report["fit"]["r2"])
    assert m2.report["dynamic_plan"] == m.report["dynamic_plan"]


@pytest.mark.parametrize("bad", [{}, {"model": None}, {"model": {"a": 1}},
                                 {"model": {"a": -1.0, "b": 0.1, "c": 1.0}},
                                 {"version": 99, "model": {"a": 1e-7, "b": 0.1, "c": 1.0}}, []])
def test_bad_profiles_raise_and_leave_the_manager_unprofiled(bad):
    m = ProfilingChunkManager(settings())
    with pytest.raises(ValueError):
        m.load_profile(bad)
    assert m.state is CppState.UNPROFILED
    m.begin_profiling()  # the caller can still sweep


def test_calibrator_give_up_and_reenable_drive_the_state():
    m = profiled(calibration_window=32, max_failed_fits=2)
    rng = np.random.default_rng(1)
    events = []
    for _ in range(200):  # timings that have nothing to do with the work
        items = [(int(rng.integers(0, 100000)), int(rng.integers(256, 8192)))]
        ev = m.record_step(items, float(rng.uniform(10, 2000)))
        if ev is not None:
            events.append(ev.kind)
    assert events.count("gave_up") == 1
    assert m.state is CppState.FIXED_FALLBACK and "gave up" in m.fallback_reason
    assert m.plan_step([Candidate("p", 0, 100000, True)], max_budget=8192).fallback
    # Rows are needed to recover, but after a give-up only one step in 16 is timed.
    assert sum(m.should_time_step() for _ in range(64)) == 4
    # Timings agree with a model again: calibration comes back.
    for _ in range(100):
        items = [(int(rng.integers(0, 100000)), int(rng.integers(256, 8192)))]
        ev = m.record_step(items, TRUE.step_ms(items) * (1 + 0.01 * rng.standard_normal()))
        if ev is not None:
            events.append(ev.kind)
    assert "reenabled" in events
    assert m.state is CppState.CALIBRATING and m.fallback_reason == ""
    assert not m.plan_step([Candidate("p", 0, 100000, True)], max_budget=8192).fallback
    s = m.summary()
    assert s["state"] == "calibrating" and s["steps_timed"] == 300 and s["accepted_fits"] >= 1


def test_should_time_step_policy():
    m = ProfilingChunkManager(settings(online_calibration=False))
    assert not m.should_time_step()  # no model: nothing to learn from timings
    m = profiled(online=False)
    timed = [m.should_time_step() for _ in range(64)]
    assert sum(timed) == 4  # one in 16 while predictions are good
    for _ in range(10):
        m.record_step([(0, 4096)], TRUE.request_ms(0, 4096) * 1.5)  # 33% off
    assert all(m.should_time_step() for _ in range(20))
    m = profiled(online=True, calibration_window=64)
    assert all(m.should_time_step() for _ in range(20))  # window not yet full


def test_summary_fields():
    m = profiled()
    m.record_step([(0, 4096)], TRUE.request_ms(0, 4096) * 1.02)
    s = m.summary()
    assert s["median_prediction_error"] == pytest.approx(0.02 / 1.02, rel=0.2)
    for key in ("state", "steps_planned", "steps_timed", "failed_fits", "fallback_reason"):
        assert key in s


@pytest.mark.parametrize("kw", [{"base_chunk": 0}, {"smooth_factor": 0.0},
                                {"smooth_factor": 1.5}, {"min_chunk": -1}, {"pp_size": 0},
                                {"block_size": 0}, {"reference_prompt_len": 0}])
def test_settings_are_validated(kw):
    with pytest.raises(ValueError):
        CoreSettings(**{"base_chunk": 8192, **kw})

