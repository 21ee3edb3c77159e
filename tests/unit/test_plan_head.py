"""Planning on the head of a long waiting queue gives the plan of the whole queue.

`CppRuntime` builds waiting requests only up to what a step can reach and hands the rest to
`ProfilingChunkManager.plan_step` as a function (``rest``). These tests plan the same random
traffic twice, on twins built alike: once that way and once on the whole walk, and require
equal plans, step after step (the auto target keeps state between steps, so a difference
would also show later). Both branches are exercised: plans the head decides, and plans whose
walk took the whole head and were made again on the whole walk. tests/integration/
test_real_scheduler.py checks the same path against vLLM's own scheduler.
"""

from __future__ import annotations

import random
from collections import deque
from types import SimpleNamespace

import pytest

from vllm_ascend_cpp.core.latency_model import LatencyModel
from vllm_ascend_cpp.core.manager import ProfilingChunkManager
from vllm_ascend_cpp.core.settings import CoreSettings
from vllm_ascend_cpp.core.step_planner import Candidate
from vllm_ascend_cpp.sim.engine import EngineSpec, Policy, build_runtime

MODEL = LatencyModel(a=1.93e-7, b=0.0064, c=17.6, gamma=5.1e-4)


def _manager(mode: str, base: int, min_chunk: int) -> ProfilingChunkManager:
    m = ProfilingChunkManager(CoreSettings(base_chunk=base, min_chunk=min_chunk, pp_size=4,
                                           target_mode=mode, online_calibration=False))
    m.load_profile({"model": MODEL.to_dict()})
    return m


def _walk(rng: random.Random) -> tuple[list[Candidate], int]:
    """Running requests (decodes and partial prefills, any order), then a waiting queue of
    prefills (some at a cached history), then a tail of whole prompts; and how many of them
    come before the tail."""
    out: list[Candidate] = []
    # Short prompts let a walk take the whole head and go on into the tail.
    longest = rng.choice([64, 20000])
    for i in range(rng.choice([0, 0, 1, 3, 30])):
        if rng.random() < 0.7:
            out.append(Candidate(f"d{i}", rng.randint(1, 40000), rng.choice([1, 1, 2]), False))
        else:
            out.append(Candidate(f"p{i}", rng.randint(0, 40000), rng.randint(1, 30000), True))
    for i in range(rng.choice([0, 1, 4, 20])):
        out.append(Candidate(f"w{i}", rng.choice([0, rng.randint(1, 20000)]),
                             rng.randint(1, longest), True))
    before_tail = len(out)
    out += [Candidate(f"t{i}", 0, rng.randint(1, longest), True)
            for i in range(rng.choice([0, 1, 5, 200]))]
    return out, before_tail


@pytest.mark.parametrize("mode", ["base", "auto"])
def test_a_head_with_rest_plans_as_the_whole_walk(mode: str) -> None:
    rng = random.Random(12)
    decided_by_head = replanned = 0
    for _ in range(150):
        base = rng.choice([256, 2048, 8192])
        min_chunk = rng.choice([1, 64, base])
        budget = rng.choice([base, 2 * base, 16384])
        whole_m, head_m = _manager(mode, base, min_chunk), _manager(mode, base, min_chunk)
        for _ in range(6):  # the auto target keeps state between steps
            walk, before_tail = _walk(rng)
            # The shortest head the runtime may give: everything before the tail and enough
            # of the tail for the prefills the manager asks for; sometimes a longer one.
            prefills = sum(c.is_prefill for c in walk[:before_tail])
            cut = before_tail + max(0, head_m.head_prefills - prefills)
            cut = min(len(walk), cut + rng.choice([0, 0, 1, 7]))
            calls: list[int] = []

            def rest(walk: list[Candidate] = walk, calls: list[int] = calls) -> list[Candidate]:
                calls.append(1)
                return walk

            want = whole_m.plan_step(walk, max_budget=budget)
            got = head_m.plan_step(walk[:cut], max_budget=budget,
                                   rest=rest if cut < len(walk) else None)
            assert got == want, (walk[:cut + 2], cut, budget)
            if cut < len(walk):
                replanned += bool(calls)
                decided_by_head += not calls
    assert decided_by_head > 50 and replanned > 5, (decided_by_head, replanned)


def _req(rid: str, prompt: int, computed: int = 0, outputs: int = 0,
         doc: int | None = None) -> SimpleNamespace:
    """The attributes of vLLM's Request that the hook reads, and which shared document (a
    system prompt of 2000 tokens) the prompt starts with."""
    return SimpleNamespace(request_id=rid, num_prompt_tokens=prompt,
                           num_tokens=prompt + outputs, num_tokens_with_spec=prompt + outputs,
                           num_computed_tokens=computed, num_output_placeholders=0, doc=doc,
                           _output_token_ids=[7] * outputs)


def _in_step(chunks) -> dict[int, int]:
    """What each waiting request finds once the chunks scheduled before it in the step cached
    their blocks: the shared document, as far as they computed it."""
    out = {}
    for k, (req, hit, _) in enumerate(chunks):
        if req.num_computed_tokens:
            continue
        best = hit
        for j, (other, other_hit, tokens) in enumerate(chunks[:k]):
            if req.doc is not None and other.doc == req.doc:
                # An earlier request computes from the prefix it found itself.
                start = out.get(j, other_hit)
                best = max(best, min(2000, start + tokens, req.num_tokens - 1))
        if best > hit:
            out[k] = best
    return out


def _planned_on_the_whole_walk(rt) -> None:
    walk = rt._walk

    def whole(sched):
        head, rest = walk(sched)
        return (head if rest is None else rest()), None

    rt._walk = whole


@pytest.mark.parametrize("kind", ["cpp-base", "cpp-auto"])
def test_the_runtime_plans_a_long_queue_as_the_whole_queue(kind: str) -> None:
    """Random queues up to 300 waiting requests, some found in the prefix cache, some
    resumed with computed tokens (those make the runtime build the whole queue) or with
    output tokens to replay, some sharing a document that requests before them in the step
    cache (the runtime then plans again), an operator cap now and then; the queue drains by
    the plans and new requests arrive."""
    rng = random.Random(5)
    with_tail = 0
    replans = [0]  # plans made again for prefixes cached within the step
    for seed in range(40):
        budget = rng.choice([64, 2048, 16384])
        pair = [build_runtime(EngineSpec(stages=4, model=MODEL), Policy(kind, budget))
                for _ in range(2)]
        hit_of = {}

        def lookup(req: SimpleNamespace, hit_of: dict = hit_of, seed: int = seed) -> int:
            r = random.Random(f"{seed}/{req.request_id}")
            # vLLM always recomputes the last prompt token: a hit leaves work to do.
            return hit_of.setdefault(req.request_id, r.choice([0, req.num_tokens // 2,
                                                                req.num_tokens - 1]))

        for rt in pair:
            rt.attach_prefix_cache(lookup, lambda req, hit: lambda: True, in_step=_in_step)
        _planned_on_the_whole_walk(pair[1])
        head_rt, whole_rt = pair
        walks = []
        walk = head_rt._walk

        def seen(sched, walks: list = walks, walk=walk):
            head, rest = walk(sched)
            walks.append(rest is not None)
            return head, rest

        head_rt._walk = seen
        hits = head_rt.prefix_hits
        grown_in_step = hits.grown_in_step

        def grew(requests, items, grown_in_step=grown_in_step) -> dict:
            grown = grown_in_step(requests, items)
            replans[0] += bool(grown)
            return grown

        hits.grown_in_step = grew
        n = rng.choice([5, 60, 300])
        longest = rng.choice([50, 3000, 40000])
        waiting = deque()

        # Queues holding preempted requests with output to replay: the runtime builds the
        # whole walk for those (a hit may cover such a prompt and leave a decode).
        replays = 0.05 if rng.random() < 0.3 else 0.0

        def arrival(i: int, computed: int = 0, longest: int = longest,
                    replays: float = replays) -> SimpleNamespace:
            outputs = rng.randint(1, 9) if rng.random() < replays else 0
            return _req(f"w{i}", rng.randint(computed + 1, longest + computed), computed,
                        outputs, rng.choice([None, 0, 1]))

        for i in range(n):
            waiting.append(arrival(i, rng.randint(1, 30) if rng.random() < 0.01 else 0))
        sched = SimpleNamespace(running=[], waiting=waiting, max_num_running_reqs=256,
                                requests={r.request_id: r for r in waiting})
        if rng.random() < 0.3:
            sched.scheduler_config = SimpleNamespace(
                long_prefill_token_threshold=rng.choice([16, 700]))
        for step in range(12):
            got, want = head_rt.plan(sched), whole_rt.plan(sched)
            assert got == want, (seed, step)
            if got is None:
                break
            _run(sched, got, pair)
            for _ in range(rng.choice([0, 2])):
                n += 1
                waiting.append(arrival(n))
                sched.requests[waiting[-1].request_id] = waiting[-1]
        with_tail += sum(walks)
    assert with_tail > 20 and replans[0] > 10, (with_tail, replans)


def _run(sched: SimpleNamespace, plan, runtimes) -> None:
    """The planned items run: waiting ones move to running, finished prompts leave."""
    planned = {i.req_id: i for i in plan.items}
    for req in list(sched.waiting):
        item = planned.get(req.request_id)
        if item is not None:
            sched.waiting.remove(req)
            req.num_computed_tokens = item.history
            sched.running.append(req)
            for rt in runtimes:
                rt.prefix_hits.drop([req.request_id])
    for req in list(sched.running):
        item = planned.get(req.request_id)
        if item is not None:
            req.num_computed_tokens += item.tokens
        if req.num_computed_tokens >= req.num_tokens:
            sched.running.remove(req)
            del sched.requests[req.request_id]
