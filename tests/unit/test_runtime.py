"""CppRuntime's record path: what vLLM scheduled -> a step record -> calibration, host gaps,
trace; with scheduler and outputs shaped like vLLM 0.32's (`Scheduler.requests`,
`SchedulerOutput.num_scheduled_tokens` / `preempted_req_ids`, a ModelRunnerOutput that carries
the measured time the step timer attached)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from tests.fakes import vllm_shapes as vs
from vllm_ascend_cpp import compat, runtime
from vllm_ascend_cpp.config import CppConfig, EngineFacts
from vllm_ascend_cpp.core import Candidate, CppState
from vllm_ascend_cpp.runtime import PENDING_DEPTHS, CppRuntime

MODEL = {"a": 1e-7, "b": 0.02, "c": 30.0}


@dataclass(eq=False)
class SchedulerOutput:
    """vllm/v1/core/sched/output.py `SchedulerOutput`: the fields the runtime reads."""

    num_scheduled_tokens: dict[str, int]
    preempted_req_ids: set[str] = field(default_factory=set)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(runtime.time, "monotonic", c)
    return c


def make_runtime(tmp_path=None, pp: int = 2, **cfg) -> CppRuntime:
    facts = EngineFacts(pp_size=pp, tp_size=1, max_num_batched_tokens=2048, max_num_seqs=8,
                        block_size=16, max_model_len=16384)
    trace = str(tmp_path / "trace.jsonl") if tmp_path is not None else None
    rt = CppRuntime(CppConfig(enabled=True, profile_cache_dir=None, trace_file=trace, **cfg),
                    facts)
    rt.manager.load_profile({"model": MODEL})
    assert rt.manager.state in (CppState.READY, CppState.CALIBRATING)
    return rt


def schedule(sched: SimpleNamespace, tokens: dict[str, int], **kw) -> SchedulerOutput:
    """What vLLM's schedule() does to the requests: num_computed_tokens advances now."""
    for rid, n in tokens.items():
        if rid in sched.requests:
            sched.requests[rid].num_computed_tokens += n
    return SchedulerOutput(dict(tokens), **kw)


def model_output(ms: float | None) -> SimpleNamespace:
    out = SimpleNamespace(req_ids=["x"])
    return out if ms is None else compat.attach_step_ms(out, ms)


def test_scheduled_records_history_before_the_step_and_prefill_by_prompt() -> None:
    rt = make_runtime()
    sched = SimpleNamespace(requests={
        "p": vs.Req("p", 5000, num_computed_tokens=1024),
        "d": vs.Req("d", 300, num_computed_tokens=305),  # 300 prompt + 5 decoded
    })
    out = schedule(sched, {"p": 2048, "d": 1, "gone": 7}, preempted_req_ids={"z", "y"})
    rec = rt.scheduled(sched, out, None)
    # "gone" finished or was aborted between schedule() and us: skipped, not a KeyError.
    assert rec.items == [("p", 1024, 2048, True), ("d", 305, 1, False)]
    assert rec.preempted == ("y", "z")
    assert rt.scheduled(sched, SchedulerOutput({}), None) is None


def test_a_plan_vllm_did_not_follow_counts_as_a_mismatch() -> None:
    rt = make_runtime()
    sched = SimpleNamespace(requests={"p": vs.Req("p", 8000)})
    plan = rt.manager.plan_step([Candidate("p", 0, 8000, True)], max_budget=2048)
    planned = plan.items[0].tokens
    rt.scheduled(sched, schedule(sched, {"p": planned}), plan)
    assert rt.plan_mismatches == 0
    rt.scheduled(sched, schedule(sched, {"p": planned - 16}), plan)
    assert rt.plan_mismatches == 1


def test_a_timed_step_is_marked_and_its_measured_time_feeds_calibration(tmp_path) -> None:
    rt = make_runtime(tmp_path)
    rt.manager.should_time_step = lambda *_: True
    fed: list[tuple] = []
    rt.manager.record_step = lambda pairs, ms, pred: fed.append((pairs, ms, pred))
    sched = SimpleNamespace(requests={"p": vs.Req("p", 8000)})
    plan = rt.manager.plan_step([Candidate("p", 0, 8000, True)], max_budget=2048)
    out = schedule(sched, {"p": plan.items[0].tokens})
    rt.scheduled(sched, out, plan)
    # The mark is the step's number: every worker's timer keys its time by it.
    assert getattr(out, compat.TIME_STEP_ATTR) == 1
    rt.finished(out, model_output(41.5))
    assert fed == [([(0, plan.items[0].tokens)], 41.5, plan.predicted_ms)]
    assert rt.steps_timed == 1
    rt.finished(out, model_output(41.5))  # a second result for the same output: ignored
    assert len(fed) == 1
    # No executor here: the last stage's time is every stage's, and the summary says so.
    assert "calibration=dynamic timing=last-stage" in rt.summary_line()
    rt.close()
    line = json.loads((tmp_path / "trace.jsonl").read_text().splitlines()[0])
    assert line["measured_ms"] == 41.5
    assert line["requests"] == [{"id": "p", "history": 0, "chunk": plan.items[0].tokens}]


def test_an_untimed_step_feeds_nothing() -> None:
    rt = make_runtime()
    rt.manager.should_time_step = lambda *_: False
    rt.manager.record_step = lambda *a: pytest.fail("an untimed step reached calibration")
    sched = SimpleNamespace(requests={"p": vs.Req("p", 8000)})
    out = schedule(sched, {"p": 1024})
    rt.scheduled(sched, out, None)
    assert not getattr(out, compat.TIME_STEP_ATTR, False)
    rt.finished(out, model_output(12.0))  # a stray time on an untimed step is not read
    assert rt.steps_timed == 0


def test_host_gap_only_between_back_to_back_timed_prefill_steps(clock: Clock) -> None:
    rt = make_runtime()
    rt.manager.should_time_step = lambda *_: True
    gaps: list[float] = []
    rt.manager.record_host_gap = gaps.append
    sched = SimpleNamespace(requests={"p": vs.Req("p", 100000), "d": vs.Req("d", 10, 12)})

    def step(tokens: dict[str, int]) -> SchedulerOutput:
        out = schedule(sched, tokens)
        rt.scheduled(sched, out, None)
        return out

    first = step({"p": 1024})
    second = step({"p": 1024})  # scheduled while the first is in flight: back to back
    clock.now += 0.050
    rt.finished(first, model_output(40.0))
    assert gaps == []  # no earlier result to measure from
    clock.now += 0.045
    rt.finished(second, model_output(40.0))
    assert gaps == [pytest.approx(45.0 - 40.0)]

    # Scheduled only after the previous result came back: the pipeline ran dry, no gap.
    third = step({"p": 1024})
    clock.now += 0.080
    rt.finished(third, model_output(40.0))
    assert len(gaps) == 1

    # Back to back again, but the later step is decode-only, or untimed: no gap either.
    a, b = step({"p": 1024}), step({"d": 1})
    clock.now += 0.040
    rt.finished(a, model_output(40.0))
    clock.now += 0.040
    rt.finished(b, model_output(5.0))
    c, d = step({"p": 1024}), step({"p": 1024})
    rt.manager.should_time_step = lambda *_: False
    clock.now += 0.040
    rt.finished(c, model_output(40.0))
    clock.now += 0.040
    rt.finished(d, model_output(None))
    assert len(gaps) == 1


@pytest.mark.parametrize("pp", [2, 4])
def test_results_that_never_come_back_are_evicted_oldest_first(pp: int) -> None:
    rt = make_runtime(pp=pp)
    rt.manager.should_time_step = lambda *_: True
    fed: list[float] = []
    rt.manager.record_step = lambda pairs, ms, pred: fed.append(ms)
    sched = SimpleNamespace(requests={"p": vs.Req("p", 10**7)})
    outputs = []
    for _ in range(10 * PENDING_DEPTHS * pp):
        out = schedule(sched, {"p": 64})
        rt.scheduled(sched, out, None)
        outputs.append(out)
        assert len(rt._pending) <= PENDING_DEPTHS * pp
    rt.finished(outputs[0], model_output(1.0))  # evicted long ago: nothing happens
    assert fed == []
    for out in outputs[-pp:]:  # the steps still in flight are all kept
        rt.finished(out, model_output(2.0))
    assert fed == [2.0] * pp


def test_steps_in_flight_reach_the_auto_target_oldest_first() -> None:
    # The auto target's forecast starts from the steps dispatched and not yet back: each at
    # its plan's predicted cost (a decode-only step, planned by nobody, at the model's), and
    # a step leaves the list when its result comes in.
    rt = make_runtime(target="auto")
    seen: list[list[float]] = []
    target_for = rt.manager.auto.target_for

    def spy(candidates, max_budget, max_requests=None, in_flight=()):
        seen.append(list(in_flight))
        return target_for(candidates, max_budget, max_requests, in_flight)

    rt.manager.auto.target_for = spy
    p, d = vs.Req("p", 9000), vs.Req("d", 300, num_computed_tokens=305)
    sched = vs.Scheduler032(vs.SchedulerConfig032(), running=[d, p])
    plan = rt.plan(sched)
    first = schedule(sched, {"p": plan.items[0].tokens, "d": 1})
    rt.scheduled(sched, first, plan)
    decode_only = schedule(sched, {"d": 1})
    rt.scheduled(sched, decode_only, None)
    rt.plan(sched)
    assert seen[0] == []
    assert seen[1] == [pytest.approx(plan.predicted_ms),
                       pytest.approx(rt.manager.predict_ms([(306, 1)]))]
    rt.finished(first, model_output(None))
    rt.plan(sched)
    assert seen[2] == [pytest.approx(rt.manager.predict_ms([(306, 1)]))]
