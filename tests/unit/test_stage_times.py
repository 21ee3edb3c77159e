"""Per-stage step times: fetched from every worker, planned on the slowest stage."""

from __future__ import annotations

from concurrent.futures import Future

from vllm_ascend_cpp import compat
from vllm_ascend_cpp.stage_times import StageTimes


class FakeExecutor:
    """collective_rpc(name, non_block=True) -> a Future the test completes, as vLLM's
    multiprocessing executor completes it while the engine collects a later step."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[str] = []
        self.futures: list[Future] = []
        self.fail = fail

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, non_block=False):
        if self.fail:
            raise RuntimeError("no RPC here")
        assert non_block, "the engine must never wait for stage times"
        self.calls.append(method)
        future: Future = Future()
        self.futures.append(future)
        return future


def collect(resolved):
    return lambda payload, last, stages: resolved.append((payload, last, stages))


def test_fetches_every_eight_timed_steps_and_pairs_stage_times_by_step():
    ex = FakeExecutor()
    st = StageTimes(ex, workers=2)
    resolved: list = []
    for step in range(1, 8):
        st.submit(step, f"p{step}", last_stage_ms=10.0)
        st.poll(collect(resolved))
    assert ex.calls == [] and resolved == []
    st.submit(8, "p8", 10.0)
    st.poll(collect(resolved))
    assert ex.calls == [compat.WORKER_STAGE_TIMES]
    st.submit(9, "p9", 10.0)  # after the fetch: waits for the next one
    ex.futures[0].set_result([
        {"pp_rank": 0, "tp_rank": 0, "times": [[s, 14.0 + s] for s in range(1, 9)]},
        {"pp_rank": 1, "tp_rank": 0, "times": [[s, 10.0] for s in range(1, 9)]},
    ])
    st.poll(collect(resolved))
    assert [p for p, _, _ in resolved] == [f"p{s}" for s in range(1, 9)]
    assert resolved[2] == ("p3", 10.0, [17.0, 10.0])  # stage 0 first; stage 0 slower here


def test_tensor_parallel_ranks_of_a_stage_count_as_their_slowest():
    ex = FakeExecutor()
    st = StageTimes(ex, workers=4, fetch_every=1)
    resolved: list = []
    st.submit(1, "p", 5.0)
    st.poll(collect(resolved))
    ex.futures[0].set_result([
        {"pp_rank": 0, "tp_rank": 0, "times": [[1, 6.0]]},
        {"pp_rank": 0, "tp_rank": 1, "times": [[1, 7.5]]},
        {"pp_rank": 1, "tp_rank": 0, "times": [[1, 5.0]]},
        {"pp_rank": 1, "tp_rank": 1, "times": [[1, 4.0]]},
    ])
    st.poll(collect(resolved))
    assert resolved == [("p", 5.0, [7.5, 5.0])]


def test_an_executor_that_cannot_fetch_falls_back_to_the_last_stage():
    st = StageTimes(FakeExecutor(fail=True), workers=2, fetch_every=1)
    resolved: list = []
    st.submit(1, "p", 5.0)
    st.poll(collect(resolved))
    assert not st.enabled and "no RPC here" in st.disabled_reason
    st.poll(collect(resolved))
    assert resolved == [("p", 5.0, None)]


def test_a_failed_fetch_resolves_with_the_last_stage_and_stops_fetching():
    ex = FakeExecutor()
    st = StageTimes(ex, workers=2, fetch_every=1)
    resolved: list = []
    st.submit(1, "p", 5.0)
    st.poll(collect(resolved))
    ex.futures[0].set_exception(RuntimeError("worker died"))
    st.poll(collect(resolved))
    assert resolved == [("p", 5.0, None)] and not st.enabled


def test_one_worker_resolves_at_once_and_flush_never_waits():
    st = StageTimes(FakeExecutor(), workers=1)
    resolved: list = []
    st.submit(1, "p", 5.0)
    st.poll(collect(resolved))
    assert resolved == [("p", 5.0, None)]
    ex = FakeExecutor()
    st = StageTimes(ex, workers=2)
    st.submit(1, "q", 3.0)
    st.flush(collect(resolved))
    assert resolved[-1] == ("q", 3.0, None) and ex.calls == []


def test_times_of_steps_the_engine_has_not_finished_yet_are_kept_for_later():
    # The workers run ahead of the engine: a reply holds steps still in the pipeline.
    ex = FakeExecutor()
    st = StageTimes(ex, workers=2, fetch_every=2)
    resolved: list = []
    for step in (1, 2):
        st.submit(step, f"p{step}", 1.0)
    st.poll(collect(resolved))
    ex.futures[0].set_result([
        {"pp_rank": 0, "tp_rank": 0, "times": [[1, 2.0], [2, 2.0], [3, 3.0]]},
        {"pp_rank": 1, "tp_rank": 0, "times": [[1, 1.0], [2, 1.0], [3, 1.0]]},
    ])
    st.poll(collect(resolved))
    assert [p for p, _, _ in resolved] == ["p1", "p2"]
    st.submit(3, "p3", 1.0)
    st.poll(collect(resolved))  # no new fetch needed: step 3's times came with the last one
    assert resolved[-1] == ("p3", 1.0, [3.0, 1.0])


def test_sparse_timing_is_fetched_once_the_oldest_step_is_eight_steps_old():
    ex = FakeExecutor()
    st = StageTimes(ex, workers=2)
    resolved: list = []
    st.submit(3, "p3", 1.0)
    st.poll(collect(resolved), step=10)
    assert ex.calls == []
    st.poll(collect(resolved), step=11)
    assert ex.calls == [compat.WORKER_STAGE_TIMES]
