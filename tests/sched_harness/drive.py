"""Drive vLLM's real scheduler with the CPP hook through one traffic pattern and check it.

The loop is the engine's (`EngineCore.step_with_batch_queue`): schedule while fewer than
`in_flight` batches are out and there is work, otherwise take the oldest batch's output and
feed it back with `update_from_output`. The model's output is made up here, as vLLM's own
`tests/v1/core` do: every scheduled request that reached the end of its known tokens samples
one token (partial prefill chunks sample nothing); steps the plugin marks for timing get a
step time from the latency model (with noise), so online calibration runs too. Aborts arrive
while batches are in flight, between `schedule()` and `update_from_output()`.

Checked on every `schedule()` call:
- vLLM scheduled exactly the planned items (request, history, tokens) unless it had a reason
  the plan could not see; each mismatch is named by the first reason that applies, and
  "unexplained" is a failure:
    kv_preemption     vLLM preempted a request this step (KV cache full)
    kv_blocks         vLLM's KV cache manager refused to allocate a request's slots
    prefix_evicted    a request admitted this step started at a shorter cached prefix than
                      planned because vLLM evicted the missing blocks during this very step
                      (to place requests before it in a full pool); the plan had the prefix
                      vLLM's own `get_computed_blocks` gave just before the step
    prefix_hit_unseen a request admitted this step started at a cached prefix the plan did
                      not carry
- the scheduler's budgets and caps are the same after the step as before it;
- no request got more than the operator's `long_prefill_token_threshold` when vLLM applies it
  (more than one request eligible; floored at max_num_batched_tokens // eligible when
  adaptive), nor the step more than vLLM's own token limits;
- decodes are never starved: a running request past its prompt is scheduled at least once
  in every `in_flight + 1` consecutive steps;
- when the plugin takes every waiting request for a prompt vLLM never scheduled
  (`compat.ScheduledBefore`, which spares it reading a long queue every step), each is a
  whole prompt, read afresh.
At the end every request finished with its exact token count (or was aborted), nothing is
left in the scheduler and every KV block is back in the pool.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from vllm_ascend_cpp import compat

from .build import MODELS, build_scheduler
from .traffic import Pattern, block_hasher, make_request

REASONS = ("kv_preemption", "kv_blocks", "prefix_evicted", "prefix_hit_unseen", "unexplained")
# Engine iterations a pattern may take per request-token before the harness calls it stuck.
_ITERATION_SLACK = 64


class HarnessFailure(AssertionError):
    pass


@dataclass
class Tally:
    """What the harness saw, summed over patterns."""

    patterns: int = 0
    requests: int = 0
    finished: int = 0
    aborted: int = 0
    steps: int = 0
    planned_steps: int = 0
    matched_steps: int = 0
    mismatches: Counter = field(default_factory=Counter)
    preemptions: int = 0
    prefix_hits: int = 0
    async_patterns: int = 0
    patterns_by_policy: Counter = field(default_factory=Counter)
    max_requests_per_pattern: int = 0
    # Planned steps of patterns whose KV cache cannot hold all their requests at once.
    kv_short_planned_steps: int = 0
    # Running requests with output in flight (async) that vLLM left out of a step.
    async_skips: int = 0
    # Planned steps under an operator cap where the smaller cap was CPP's / the operator's.
    cap_ours: int = 0
    cap_operator: int = 0
    # Steps whose waiting queue the plugin took for whole prompts without reading it, and
    # steps whose queue held a request that is not one (preempted with output, ...).
    fresh_verdicts: int = 0
    unwhole_queue_steps: int = 0

    def add(self, other: Tally) -> None:
        for name in ("patterns", "requests", "finished", "aborted", "steps", "planned_steps",
                     "matched_steps", "preemptions", "prefix_hits", "async_patterns",
                     "kv_short_planned_steps", "async_skips", "cap_ours", "cap_operator",
                     "fresh_verdicts", "unwhole_queue_steps"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.mismatches.update(other.mismatches)
        self.patterns_by_policy.update(other.patterns_by_policy)
        self.max_requests_per_pattern = max(self.max_requests_per_pattern,
                                            other.max_requests_per_pattern)

    @property
    def mismatched_steps(self) -> int:
        return sum(self.mismatches.values())

    def report(self) -> str:
        reasons = ", ".join(f"{r}={self.mismatches.get(r, 0)}" for r in REASONS)
        per = self.requests / self.patterns if self.patterns else 0.0
        return (
            f"[sched-harness] patterns={self.patterns} (async {self.async_patterns}; "
            f"{dict(sorted(self.patterns_by_policy.items()))}) requests={self.requests} "
            f"({per:.1f}/pattern, max {self.max_requests_per_pattern}) "
            f"finished={self.finished} aborted={self.aborted} steps={self.steps} "
            f"planned={self.planned_steps} matched={self.matched_steps} "
            f"mismatched={self.mismatched_steps} [{reasons}] "
            f"planned_in_kv_short_patterns={self.kv_short_planned_steps} "
            f"preemptions={self.preemptions} prefix_hits={self.prefix_hits} "
            f"fresh_queue_verdicts={self.fresh_verdicts} "
            f"steps_with_unwhole_waiting={self.unwhole_queue_steps}"
        )


def _limits(sched: Any) -> tuple:
    cfg = sched.scheduler_config
    return (sched.max_num_scheduled_tokens, cfg.long_prefill_token_threshold,
            getattr(sched, "adaptive_long_prefill_threshold", None),
            cfg.max_num_batched_tokens, sched.max_num_running_reqs,
            getattr(sched, "max_num_active_reqs", None))


def _past_prompt(req: Any) -> bool:
    return req.num_computed_tokens >= max(req.num_prompt_tokens, req.num_tokens - 1)


class _Observed:
    """Hooks on one scheduler: the plan each schedule() used, KV allocations refused and
    cached blocks evicted.

    They wrap bound methods on the instance (the plugin's runtime, vLLM's KV cache manager
    and block pool) without changing what they return.
    """

    def __init__(self, sched: Any) -> None:
        self.plan: Any = None
        self.refused: list[str] = []
        self.evicted: set[int] = set()
        runtime = getattr(sched, "cpp", None)
        if runtime is not None:
            plan = runtime.plan

            def record_plan(scheduler: Any) -> Any:
                self.plan = plan(scheduler)
                return self.plan

            runtime.plan = record_plan
        kv = sched.kv_cache_manager
        allocate = kv.allocate_slots

        def record_allocate(request: Any, *args: Any, **kwargs: Any) -> Any:
            blocks = allocate(request, *args, **kwargs)
            if blocks is None:
                self.refused.append(request.request_id)
            return blocks

        kv.allocate_slots = record_allocate
        pool = kv.block_pool
        evict = pool._maybe_evict_cached_block

        def record_evict(block: Any) -> bool:
            gone = evict(block)
            if gone:
                self.evicted.add(block.block_id)
            return gone

        pool._maybe_evict_cached_block = record_evict

    def reset(self) -> None:
        self.plan = None
        self.refused.clear()
        self.evicted.clear()


class PatternRun:
    def __init__(self, pattern: Pattern) -> None:
        self.pattern = pattern
        self.shape = pattern.shape
        self.sched = build_scheduler(self.shape)
        self.obs = _Observed(self.sched)
        self.model = MODELS[self.shape.model]
        self.rng = random.Random(pattern.seed)
        self.hasher = block_hasher(self.shape.block_size) if self.shape.prefix_caching else None
        self.tally = Tally(patterns=1, requests=len(pattern.requests),
                           async_patterns=int(self.shape.async_scheduling),
                           max_requests_per_pattern=len(pattern.requests))
        self.tally.patterns_by_policy[self.shape.policy] += 1
        self.tokens: dict[str, list[int]] = {}
        self.finish: dict[str, str] = {}
        self.aborted: set[str] = set()
        self.misses: Counter = Counter()
        self.samplers: dict[int, set[str]] = {}

    def fail(self, what: str) -> None:
        raise HarnessFailure(f"{what}\n  pattern: {self.pattern}")

    # ----- one schedule() call, checked ----------------------------------------------------

    def schedule(self) -> Any:
        sched = self.sched
        before = _limits(sched)
        running, waiting = sched.get_request_counts()
        waiting_ids = {r.request_id for r in sched.waiting} | {
            r.request_id for r in sched.kv_holding_waiting}
        in_flight = [r.request_id for r in sched.running if r.num_output_placeholders > 0]
        # What vLLM's own lookup finds for each fresh waiting request before the step.
        kv = sched.kv_cache_manager
        before_hits = {}
        for r in (*sched.waiting, *sched.kv_holding_waiting):
            if r.num_computed_tokens == 0:
                blocks, hit = kv.get_computed_blocks(r)[:2]
                before_hits[r.request_id] = (hit, [b.block_id for b in blocks.blocks[0]])
        self._check_fresh_queue()
        self.obs.reset()
        out = sched.schedule()
        if _limits(sched) != before:
            self.fail(f"limits not restored: {before} -> {_limits(sched)}")
        self.tally.steps += 1
        actual = {}
        for rid, n in out.num_scheduled_tokens.items():
            req = sched.requests[rid]
            actual[rid] = (req.num_computed_tokens - n, n)
        self._check_limits(actual, running + waiting)
        hits = [rid for rid in actual if rid in waiting_ids and actual[rid][0] > 0]
        self.tally.prefix_hits += len(hits)
        preempted = compat.preempted_request_ids(out)
        self.tally.preemptions += len(preempted)
        self.tally.async_skips += sum(
            1 for rid in in_flight if rid not in actual and rid not in preempted)
        plan = self.obs.plan
        if plan is not None:
            self._count_caps(plan, running + waiting)
            self._compare(plan, actual, hits, preempted, before_hits)
        self._check_decodes(actual)
        self.samplers[id(out)] = {
            rid for rid in actual if not sched.requests[rid].is_prefill_chunk}
        return out

    def _check_fresh_queue(self) -> None:
        """The plugin's "every waiting request is one vLLM never scheduled" verdict
        (`compat.ScheduledBefore`), which lets it skip reading a long queue, against the
        queue read afresh."""
        runtime = getattr(self.sched, "cpp", None)
        if runtime is None:
            return
        waiting = [*self.sched.waiting, *self.sched.kv_holding_waiting]
        whole = all(compat.whole_prefills([r]) and not r.num_stale_output_tokens
                    for r in waiting)
        if not whole:
            self.tally.unwhole_queue_steps += 1
        if runtime.scheduled_before.none_waiting(self.sched):
            self.tally.fresh_verdicts += 1
            if not whole:
                self.fail("the waiting queue was taken for whole prompts but holds "
                          + ", ".join(f"{r.request_id} ({r.num_computed_tokens} computed, "
                                      f"{r.num_output_tokens} output)" for r in waiting
                                      if not compat.whole_prefills([r])))

    def _check_limits(self, actual: dict, eligible: int) -> None:
        shape = self.shape
        total = sum(n for _, n in actual.values())
        own = min(self.sched.max_num_scheduled_tokens, shape.max_num_batched_tokens)
        if total > own:
            self.fail(f"step of {total} tokens over vLLM's own limit {own}")
        cap = self._operator_cap(eligible)
        if cap > 0:
            over = {rid: n for rid, (_, n) in actual.items() if n > cap}
            if over:
                self.fail(f"operator cap {cap} exceeded ({eligible} eligible): {over}")

    def _operator_cap(self, eligible: int) -> int:
        """The cap vLLM's own schedule() applies (the option's documented meaning)."""
        shape = self.shape
        cap = shape.long_prefill_token_threshold
        if cap <= 0 or eligible <= 1:
            return 0
        if shape.adaptive_threshold:
            cap = max(cap, shape.max_num_batched_tokens // eligible)
        return cap

    def _count_caps(self, plan: Any, eligible: int) -> None:
        operator = self._operator_cap(eligible)
        if operator > 0:
            if 0 < plan.prefill_cap < operator:
                self.tally.cap_ours += 1
            else:
                self.tally.cap_operator += 1

    def _compare(self, plan: Any, actual: dict, hits: list[str],
                 preempted: tuple[str, ...], before_hits: dict) -> None:
        """Match, or name vLLM's reason; the reason must account for the first difference."""
        self.tally.planned_steps += 1
        planned = {i.req_id: (i.history, i.tokens) for i in plan.items}
        if planned == actual:
            self.tally.matched_steps += 1
            return
        # Both are in walk order: running requests first, then admitted waiting ones.
        p, a = list(planned.items()), list(actual.items())
        k = 0
        while k < len(p) and k < len(a) and p[k] == a[k]:
            k += 1
        reason = "unexplained"
        if preempted:
            # Victims leave the step (and the waiting queue is not served); under the
            # priority policy a victim scheduled earlier gives its tokens back, which a later
            # item may take: one the plan had, or one after them all that the plan's budget
            # had no room for.
            rids = [rid for rid, _ in p]
            at = [rids.index(rid) if rid in planned else -1 for rid, _ in a]
            priority = self.shape.policy == "priority"
            same = all(planned[rid][0] == h and (planned[rid][1] == n or (
                priority and n > planned[rid][1]))
                for rid, (h, n) in a if rid in planned)
            extra = at.count(-1)
            tail_only = -1 not in at[:len(at) - extra]
            freed = sum(planned[rid][1] for rid in preempted if rid in planned)
            taken = sum(n - planned[rid][1] if rid in planned else n for rid, (_, n) in a)
            known = [i for i in at if i >= 0]
            if known == sorted(known) and same and (
                    extra == 0 or (priority and tail_only and 0 < taken <= freed)):
                reason = "kv_preemption"
        elif self.obs.refused and k == len(a) and k < len(p) and p[k][0] in self.obs.refused:
            reason = "kv_blocks"  # admission stopped at the request it could not place
        elif k < len(a) and k < len(p) and a[k][0] == p[k][0] \
                and self._evicted_in_step(a[k][0], a[k][1][0], p[k][1][0], before_hits):
            reason = "prefix_evicted"  # what follows shifts with the budget it took
        elif k < len(a) and k < len(p) and a[k][0] == p[k][0] and a[k][0] in hits \
                and a[k][1][0] != p[k][1][0]:
            reason = "prefix_hit_unseen"  # what follows shifts with the budget it freed
        self.tally.mismatches[reason] += 1
        if reason == "unexplained":
            self.fail(f"step {self.tally.steps}: vLLM scheduled {actual}, the plan said "
                      f"{planned} (budget {plan.token_budget}, cap {plan.prefill_cap}, "
                      f"refused {self.obs.refused}, preempted {preempted})")

    def _evicted_in_step(self, rid: str, ran_from: int, planned_from: int,
                         before_hits: dict) -> bool:
        """The plan carried vLLM's own pre-step hit, and vLLM evicted part of it in this step."""
        hit, block_ids = before_hits.get(rid, (0, []))
        if not ran_from < planned_from == hit:
            return False
        size = self.shape.block_size
        return any(b in self.obs.evicted for b in block_ids[ran_from // size:hit // size])

    def _check_decodes(self, actual: dict) -> None:
        bound = self.shape.in_flight + 1
        for req in self.sched.running:
            rid = req.request_id
            if rid in actual or not _past_prompt(req):
                self.misses.pop(rid, None)
                continue
            self.misses[rid] += 1
            if self.misses[rid] > bound:
                self.fail(f"decode {rid} not scheduled for {self.misses[rid]} steps")

    # ----- the model's side ------------------------------------------------------------------

    def model_output(self, out: Any) -> Any:
        from vllm.v1.outputs import ModelRunnerOutput

        samplers = self.samplers.pop(id(out), set())
        req_ids = list(out.num_scheduled_tokens)
        sampled = [[self.rng.randrange(3, 2000)] if rid in samplers else [] for rid in req_ids]
        result = ModelRunnerOutput(req_ids=req_ids,
                                   req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                   sampled_token_ids=sampled)
        if getattr(out, compat.TIME_STEP_ATTR, False):
            items = []
            for rid, n in out.num_scheduled_tokens.items():
                req = self.sched.requests.get(rid)
                history = 0 if req is None else max(req.num_computed_tokens - n, 0)
                items.append((history, n))
            ms = self.model.step_ms(items) * (1.0 + self.rng.uniform(-0.05, 0.05))
            result = compat.attach_step_ms(result, ms)
        return result

    def update(self, out: Any) -> None:
        engine_outputs = self.sched.update_from_output(out, self.model_output(out))
        for outputs in engine_outputs.values():
            for o in outputs.outputs:
                self.tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
                if o.finish_reason is not None:
                    self.finish[o.request_id] = str(o.finish_reason)

    # ----- the engine loop ----------------------------------------------------------------

    def run(self) -> Tally:
        specs = self.pattern.requests
        order = sorted(range(len(specs)), key=lambda i: (specs[i].arrive, i))
        arrivals = deque(order)
        aborts: dict[int, list[str]] = {}
        sched = self.sched
        batches: deque = deque()
        depth = self.shape.in_flight
        work = sum(s.prompt_len + s.max_tokens for s in specs)
        limit = max(s.arrive for s in specs) + _ITERATION_SLACK * (len(specs) + work // 16 + 8)
        it = 0
        while arrivals or batches or sched.has_requests():
            while arrivals and specs[arrivals[0]].arrive <= it:
                i = arrivals.popleft()
                sched.add_request(make_request(self.pattern, i, it + i * 1e-6, self.hasher))
                if specs[i].abort_after is not None:
                    aborts.setdefault(it + specs[i].abort_after, []).append(f"r{i}")
            # With batches in flight this is between their schedule() and update_from_output().
            self._abort(aborts.pop(it, ()))
            if sched.has_requests() and len(batches) < depth:
                out = self.schedule()
                batches.append(out)
                executed = out.total_num_scheduled_tokens > 0
                if len(batches) < depth and (executed or sched.has_requests()):
                    it += 1
                    continue
            if batches:
                self.update(batches.popleft())
            it += 1
            if it > limit:
                self.fail(f"no end after {it} iterations: {len(sched.running)} running, "
                          f"{len(sched.waiting)} waiting")
        self._abort([rid for ids in aborts.values() for rid in ids])
        self._check_end()
        self.sched.shutdown()
        return self.tally

    def _abort(self, ids: Any) -> None:
        from vllm.v1.request import RequestStatus

        if not ids:
            return
        done = self.sched.finish_requests(list(ids), RequestStatus.FINISHED_ABORTED)
        self.aborted.update(r.request_id for r in done)

    def _check_end(self) -> None:
        sched = self.sched
        max_len = self.shape.max_model_len
        for i, spec in enumerate(self.pattern.requests):
            rid = f"r{i}"
            if rid in self.aborted:
                self.tally.aborted += 1
                continue
            got = len(self.tokens.get(rid, []))
            want = spec.expected_tokens(max_len)
            if rid not in self.finish or got != want:
                self.fail(f"{rid} finished={self.finish.get(rid)} with {got} tokens, "
                          f"expected {want}")
            self.tally.finished += 1
        if sched.requests or sched.running or sched.waiting or sched.kv_holding_waiting:
            self.fail(f"left in the scheduler: {list(sched.requests)}")
        pool = sched.kv_cache_manager.block_pool
        # One block is vLLM's null block, never handed out.
        if pool.get_num_free_blocks() != self.shape.num_blocks - 1:
            self.fail(f"KV blocks not returned: {pool.get_num_free_blocks()} free of "
                      f"{self.shape.num_blocks - 1}")


def run_pattern(pattern: Pattern) -> Tally:
    return PatternRun(pattern).run()
