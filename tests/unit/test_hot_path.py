"""The scheduler hook's per-step pieces: prefix hits in planning, the failure guard, and the
plan-versus-what-ran check (no vLLM needed; tests/unit/test_prefix_lookup_vllm.py runs the
lookup against vLLM's real KV cache manager)."""

from __future__ import annotations

import logging
from collections import deque
from types import SimpleNamespace

import pytest

from vllm_ascend_cpp import compat, faults
from vllm_ascend_cpp.core import Candidate
from vllm_ascend_cpp.core.latency_model import LatencyModel
from vllm_ascend_cpp.guard import MAX_CONSECUTIVE_FAILURES, HotPathGuard
from vllm_ascend_cpp.prefix_hits import PrefixHits
from vllm_ascend_cpp.runtime import plan_difference
from vllm_ascend_cpp.sim.engine import EngineSpec, Policy, build_runtime

MODEL = LatencyModel(a=1.93e-7, b=0.0064, c=17.6, gamma=5.1e-4)


def Req(rid: str, prompt: int, num_computed_tokens: int = 0) -> SimpleNamespace:  # noqa: N802
    """The attributes of vLLM's Request that the hook reads (no output tokens yet)."""
    return SimpleNamespace(request_id=rid, num_prompt_tokens=prompt, num_tokens=prompt,
                           num_tokens_with_spec=prompt, num_computed_tokens=num_computed_tokens,
                           num_output_placeholders=0)


class Sched:
    def __init__(self, running: list[Req], waiting: list[Req]) -> None:
        self.running = running
        self.waiting = deque(waiting)
        self.max_num_running_reqs = 16


# ----- PrefixHits ----------------------------------------------------------------------------


class CountingLookup:
    def __init__(self, hits: dict[str, int]) -> None:
        self.hits = hits
        self.calls: list[str] = []

    def __call__(self, req: SimpleNamespace) -> int:
        self.calls.append(req.request_id)
        return self.hits.get(req.request_id, 0)


def test_one_lookup_per_request_until_dropped_or_reset() -> None:
    lookup = CountingLookup({"a": 4096, "b": 0})
    hits = PrefixHits(lookup)
    a, b = Req("a", 10000), Req("b", 500)
    for _ in range(10):
        assert (hits.hit(a), hits.hit(b)) == (4096, 0)
    assert lookup.calls == ["a", "b"]
    hits.drop(["a"])  # scheduled, finished or aborted
    assert hits.hit(a) == 4096 and lookup.calls == ["a", "b", "a"]
    hits.clear()  # prefix cache reset
    lookup.hits["a"] = 0
    assert hits.hit(a) == 0 and hits.hit(b) == 0
    assert lookup.calls == ["a", "b", "a", "a", "b"]


def test_new_tokens_mean_a_new_lookup_and_the_last_token_is_never_a_hit() -> None:
    lookup = CountingLookup({"s": 800})
    hits = PrefixHits(lookup)
    s = Req("s", 800)
    assert hits.hit(s) == 799  # a broken lookup cannot claim the token that makes logits
    s.num_prompt_tokens = s.num_tokens = 1600  # a streaming session appended input
    assert hits.hit(s) == 800
    assert lookup.calls == ["s", "s"]


def test_entries_are_bounded() -> None:
    hits = PrefixHits(lambda r: 64, max_entries=8)
    for i in range(100):
        hits.hit(Req(f"r{i}", 1000))
        assert len(hits) <= 8


# ----- planning with hits ----------------------------------------------------------------------


def runtime():
    return build_runtime(EngineSpec(stages=4, model=MODEL), Policy("cpp-base", 8192))


def test_waiting_request_is_planned_at_its_cached_history() -> None:
    rt = runtime()
    rt.attach_prefix_cache(CountingLookup({"hit": 49152}))
    sched = Sched([], [Req("hit", 60000)])
    (cand,) = rt.candidates(sched)
    assert cand == Candidate("hit", 49152, 60000 - 49152, True)
    plan = rt.plan(sched)
    assert plan is not None
    # The same request already 48k in (a running one) gets the same chunk.
    same = Sched([Req("hit", 60000, num_computed_tokens=49152)], [])
    plan_running = runtime().plan(same)
    assert plan_running is not None
    assert [i.tokens for i in plan.items] == [i.tokens for i in plan_running.items]
    # And without the lookup the chunk would be sized at history 0: larger.
    blind = runtime().plan(Sched([], [Req("hit", 60000)]))
    assert blind is not None
    assert blind.items[0].tokens > plan.items[0].tokens


def test_requests_with_computed_tokens_are_not_looked_up() -> None:
    rt = runtime()
    lookup = CountingLookup({"w": 4096})
    rt.attach_prefix_cache(lookup)
    sched = Sched([], [Req("w", 10000, num_computed_tokens=2048)])  # e.g. a remote KV load
    (cand,) = rt.candidates(sched)
    assert cand.history == 2048 and lookup.calls == []


def test_scheduled_and_finished_requests_drop_their_entries() -> None:
    rt = runtime()
    lookup = CountingLookup({"a": 1024, "b": 2048})
    rt.attach_prefix_cache(lookup)
    a, b = Req("a", 5000), Req("b", 6000)
    sched = Sched([], [a, b])
    sched.requests = {"a": a, "b": b}
    rt.candidates(sched)
    assert rt.prefix_hits is not None and len(rt.prefix_hits) == 2
    a.num_computed_tokens = 1024 + 512
    out = SimpleNamespace(num_scheduled_tokens={"a": 512}, finished_req_ids={"b"})
    rt.scheduled(sched, out, None)
    assert len(rt.prefix_hits) == 0
    rt.attach_prefix_cache(None)
    assert rt.candidates(Sched([], [Req("c", 100)]))[0].history == 0


# ----- the guard ---------------------------------------------------------------------------


def boom() -> None:
    raise ValueError("renamed attribute")


def cpp_records(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == level and r.getMessage().startswith("[CPP]")]


def test_guard_warns_once_per_failure_and_turns_off_after_n_in_a_row(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="vllm.vllm_ascend_cpp")
    guard = HotPathGuard()
    assert guard.run("planning", lambda: 7) == (True, 7)
    for _ in range(MAX_CONSECUTIVE_FAILURES):
        assert not guard.disabled
        assert guard.run("planning", boom) == (False, None)
    assert guard.disabled
    warnings = cpp_records(caplog, logging.WARNING)
    assert len(warnings) == MAX_CONSECUTIVE_FAILURES
    assert all("planning failed (ValueError: renamed attribute)" in w for w in warnings)
    errors = cpp_records(caplog, logging.ERROR)
    assert len(errors) == 1 and "turned off for the life of this engine" in errors[0]
    # The traceback went to DEBUG, and nothing runs once off.
    assert any(r.exc_info for r in caplog.records if r.levelno == logging.DEBUG)
    assert guard.run("planning", lambda: 7) == (False, None)
    assert len(cpp_records(caplog, logging.WARNING)) == MAX_CONSECUTIVE_FAILURES


def test_a_success_resets_the_count_but_an_empty_step_does_not() -> None:
    guard = HotPathGuard(max_failures=2)
    for _ in range(10):
        guard.run("trace", boom)
        guard.run("trace", lambda: True)  # a step whose work was done
    assert not guard.disabled and guard.failures == 10
    # Under PP, vLLM also schedules empty steps; their calls return None (nothing to do)
    # and must not hide a failure on every real step.
    guard.run("trace", boom)
    guard.run("trace", lambda: None)
    guard.run("trace", boom)
    assert guard.disabled


def test_vllm_exceptions_are_not_the_guards_business() -> None:
    # BaseException subclasses that are not Exception (KeyboardInterrupt, SystemExit) pass.
    guard = HotPathGuard()

    def interrupt() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        guard.run("planning", interrupt)


def test_step_limits_restore_vllm_budget_when_setting_them_fails() -> None:
    class Cfg:
        long_prefill_token_threshold = 0

    class Refusing:
        # A scheduler whose adaptive flag cannot be set: the failure comes after the budget
        # and the cap were already changed.
        max_num_scheduled_tokens = 8192
        scheduler_config = Cfg()

        @property
        def adaptive_long_prefill_threshold(self) -> bool:
            return True

    s = Refusing()
    with pytest.raises(AttributeError):
        with compat.step_limits(s, 1024, 512):
            pass
    assert s.max_num_scheduled_tokens == 8192
    assert s.scheduler_config.long_prefill_token_threshold == 0


def test_hot_path_faults_respect_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.ENV, "hot_trace")
    monkeypatch.setenv(faults.LIMIT_ENV, "2")
    monkeypatch.setattr(faults, "_hot_raised", {})
    faults.active.cache_clear()  # read once per process
    faults.hot_path("plan")  # another point: nothing
    for _ in range(2):
        with pytest.raises(faults.InjectedFault):
            faults.hot_path("trace")
    faults.hot_path("trace")
    monkeypatch.delenv(faults.ENV)
    faults.active.cache_clear()
    assert all(f in faults.KNOWN for f in ("hot_plan", "hot_record", "hot_calibration",
                                           "hot_trace", "hot_summary"))


# ----- plan versus what ran ------------------------------------------------------------------


def test_plan_difference_names_the_reason() -> None:
    rt = runtime()
    plan = rt.plan(Sched([Req("d", 100, num_computed_tokens=99)], [Req("p", 30000)]))
    assert plan is not None
    planned = {i.req_id: i.tokens for i in plan.items}
    ran = [(rid, 0, n, rid == "p") for rid, n in planned.items()]
    assert plan_difference(plan, ran, ()) is None
    fewer = [(rid, 0, n - (rid == "p"), rid == "p") for rid, n in planned.items()]
    assert plan_difference(plan, fewer, ()) == "fewer tokens than planned"
    assert plan_difference(plan, fewer, ("x",)) == "preempted"
    assert plan_difference(plan, ran[:1], ()) == "planned request not scheduled"
    assert plan_difference(plan, ran + [("z", 0, 5, True)], ()) == "unplanned request scheduled"


def test_trace_predicts_what_ran_on_a_mismatch(tmp_path) -> None:
    from vllm_ascend_cpp.trace import TraceWriter, read_trace

    rt = runtime()
    rt.trace = TraceWriter(str(tmp_path / "t.jsonl"))
    p = Req("p", 30000)
    sched = Sched([], [p])
    sched.requests = {"p": p}
    for ran_tokens in (None, 1024):  # first as planned, then vLLM ran fewer tokens
        plan = rt.plan(sched)
        assert plan is not None
        n = plan.items[0].tokens if ran_tokens is None else ran_tokens
        p.num_computed_tokens += n
        out = SimpleNamespace(num_scheduled_tokens={"p": n}, finished_req_ids=set())
        rt.scheduled(sched, out, plan)
        rt.finished(out, SimpleNamespace())
    first, second = read_trace(str(tmp_path / "t.jsonl"))
    assert first["plan_matched"] is True and "mismatch" not in first
    assert second["plan_matched"] is False
    assert second["mismatch"] == "fewer tokens than planned"
    assert second["predicted_ms"] == pytest.approx(
        MODEL.step_ms([(second["requests"][0]["history"], 1024)]), abs=1e-3)
    assert second["plan_predicted_ms"] != second["predicted_ms"]
    assert rt.plan_mismatches == 1


# ----- the scheduler boundary ----------------------------------------------------------------


class FakeVllmScheduler:
    """Stands in for vLLM's Scheduler under the mixin: records the limits schedule() saw, and
    raises when told to (as a vLLM bug would)."""

    def __init__(self) -> None:
        self.max_num_scheduled_tokens = 8192
        self.scheduler_config = SimpleNamespace(long_prefill_token_threshold=0)
        self.seen: list[tuple[int, int]] = []
        self.raise_in: Exception | None = None

    def schedule(self) -> SimpleNamespace:
        self.seen.append((self.max_num_scheduled_tokens,
                          self.scheduler_config.long_prefill_token_threshold))
        if self.raise_in is not None:
            raise self.raise_in
        return SimpleNamespace(num_scheduled_tokens={})

    def update_from_output(self, out: object, model_out: object) -> str:
        if self.raise_in is not None:
            raise self.raise_in
        return "vllm-result"


class FakeCpp:
    def __init__(self) -> None:
        self.fail: set[str] = set()
        self.plan_value = SimpleNamespace(token_budget=1024, prefill_cap=512)

    def _maybe(self, name: str) -> None:
        if name in self.fail:
            raise KeyError(f"{name} broke")

    def plan(self, sched: object) -> object:
        self._maybe("plan")
        return self.plan_value

    def scheduled(self, sched: object, out: object, plan: object) -> bool:
        self._maybe("scheduled")
        return True

    def finished(self, out: object, model_out: object) -> bool:
        self._maybe("finished")
        return True


def boundary():
    mixin = pytest.importorskip("vllm_ascend_cpp.scheduler")._CppSchedulerMixin

    class Sched(mixin, FakeVllmScheduler):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:  # the mixin's __init__ profiles workers: not here
            FakeVllmScheduler.__init__(self)
            self.cpp = FakeCpp()
            self.cpp_guard = HotPathGuard()

    return Sched()


def test_vllm_exceptions_propagate_unchanged_and_limits_are_restored() -> None:
    s = boundary()
    bug = RuntimeError("vLLM's own bug")
    s.raise_in = bug
    with pytest.raises(RuntimeError) as info:
        s.schedule()
    assert info.value is bug
    assert s.seen == [(1024, 512)]  # it ran under the plan's limits...
    assert (s.max_num_scheduled_tokens, s.scheduler_config.long_prefill_token_threshold) == \
        (8192, 0)  # ...and vLLM's own are back
    with pytest.raises(RuntimeError) as info:
        s.update_from_output(object(), object())
    assert info.value is bug
    assert s.cpp_guard.failures == 0


def test_our_failures_leave_the_step_to_vllm(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="vllm.vllm_ascend_cpp")
    s = boundary()
    s.cpp.fail = {"plan"}
    s.schedule()
    assert s.seen[-1] == (8192, 0)  # vLLM's own limits
    s.cpp.fail = {"scheduled", "finished"}
    assert s.schedule() is not None
    assert s.update_from_output(object(), object()) == "vllm-result"
    assert len(cpp_records(caplog, logging.WARNING)) == 3
    # A plan with a value the limits cannot take: vLLM's limits stay, one more warning.
    s.cpp.fail = set()
    s.cpp.plan_value = SimpleNamespace(token_budget="not a number", prefill_cap=512)
    s.schedule()
    assert s.seen[-1] == (8192, 0)
    assert "setting the step limits failed" in cpp_records(caplog, logging.WARNING)[-1]
    for _ in range(MAX_CONSECUTIVE_FAILURES):
        s.cpp.fail = {"plan"}
        s.schedule()
    assert s.cpp_guard.disabled
    s.cpp.fail = set()
    s.cpp.plan_value = SimpleNamespace(token_budget=1024, prefill_cap=512)
    s.schedule()
    assert s.seen[-1] == (8192, 0)  # off for good: no more plans


def test_only_requests_the_step_can_reach_are_looked_up() -> None:
    rt = runtime()  # budget 8192
    least = rt.manager.predictor.alignment  # the fewest tokens a capped prefill can take
    n = 8192 // least + 20
    lookup = CountingLookup({f"w{i}": 2048 for i in range(n)})
    rt.attach_prefix_cache(lookup)
    waiting = [Req(f"w{i}", 5120) for i in range(n)]

    def sched(reqs: list[Req]) -> Sched:
        out = Sched([], reqs)
        out.max_num_running_reqs = 4 * n  # every one admissible: only the budget limits
        return out

    cands = rt.candidates(sched(waiting))
    # Each prompt may be capped down to `least` tokens, so the walk may reach 8192 // least
    # of them (it could not pass the third uncapped one): those are looked up, no further.
    reach = 8192 // least
    assert lookup.calls == [f"w{i}" for i in range(reach)]
    assert [c.history for c in cands] == [2048] * reach + [0] * 20
    # As the queue drains, the next ones are looked up, each once.
    rt.candidates(sched(waiting[1:]))
    assert lookup.calls == [f"w{i}" for i in range(reach + 1)]


# ----- per-stage times under the guard -------------------------------------------------------


class DoneFuture:
    def __init__(self, value: object) -> None:
        self.value = value

    def done(self) -> bool:
        return True

    def result(self) -> object:
        return self.value


class StageExecutor:
    """vLLM's executor as stage_times.py uses it: a non-blocking collective_rpc that answers
    every worker's (step, ms) ring buffer."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def collective_rpc(self, method: str, non_block: bool = False) -> DoneFuture:
        assert method == compat.WORKER_STAGE_TIMES and non_block
        times = [(s, 5.0) for s in self.steps]
        return DoneFuture([{"pp_rank": 0, "times": times}, {"pp_rank": 1, "times": times}])


def test_a_failure_pairing_stage_times_costs_the_step_never_the_trace(tmp_path) -> None:
    """Calibration failing inside the stage-time resolution (called from the engine's result
    path) is caught by the guard, and the held trace lines are still written in order."""
    from vllm_ascend_cpp.trace import TraceWriter, read_trace

    rt = runtime()
    ex = StageExecutor()
    rt.use_executor(ex)
    rt.stages.fetch_every = 1
    assert rt.stages.enabled
    rt.trace = TraceWriter(str(tmp_path / "t.jsonl"))
    guard = HotPathGuard()
    record = rt.manager.record_step
    broken = {"on": True}

    def flaky(*args: object, **kwargs: object) -> object:
        if broken["on"]:
            raise ZeroDivisionError("calibration broke")
        return record(*args, **kwargs)

    rt.manager.record_step = flaky  # type: ignore[method-assign]
    rt.manager.should_time_step = lambda *_: True  # type: ignore[method-assign]
    p = Req("p", 30000)
    sched = Sched([], [p])
    sched.requests = {"p": p}
    results = []
    for i in range(6):
        broken["on"] = i < 2
        plan = rt.plan(sched)
        n = plan.items[0].tokens
        p.num_computed_tokens += n
        out = SimpleNamespace(num_scheduled_tokens={"p": n}, finished_req_ids=set())
        rt.scheduled(sched, out, plan)
        ex.steps.append(rt._step)
        results.append(guard.run("recording the step result", rt.finished, out,
                                 SimpleNamespace())[0])
    rt.close()
    # The two broken steps may resolve in one poll (the first failure ends it) or in two.
    assert False in results and not guard.disabled
    assert 1 <= guard.failures <= 2
    lines = read_trace(str(tmp_path / "t.jsonl"))
    assert [ln["step"] for ln in lines] == list(range(1, 7))
    assert any(ln.get("stage_ms") == [5.0, 5.0] for ln in lines)
