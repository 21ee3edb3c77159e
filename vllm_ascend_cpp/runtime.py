"""The per-engine CPP state the scheduler hook talks to.

It turns vLLM's request queues into core `Candidate`s, hands the step's plan back, and turns
each finished step (what was scheduled, what it measured) into calibration rows, trace lines
and the once-a-minute summary. Every decision is made in `core/`; this module only translates.
It reads vLLM objects by attribute through `compat`, and imports nothing from vLLM.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from vllm_ascend_cpp import compat, faults
from vllm_ascend_cpp.config import CppConfig, EngineFacts, default_min_chunk
from vllm_ascend_cpp.core import (
    Candidate,
    CoreSettings,
    CppState,
    ProfilingChunkManager,
    StepPlan,
    simulate,
)
from vllm_ascend_cpp.log import logger
from vllm_ascend_cpp.prefix_hits import PrefixHits
from vllm_ascend_cpp.stage_times import StageTimes
from vllm_ascend_cpp.trace import TraceWriter

ACTIVE_STATES = (CppState.READY, CppState.CALIBRATING)
# Builds every candidate of a step's walk, for the rare plan that needs more than the head.
WholeWalk = Callable[[], list[Candidate]]
# Steps scheduled and not yet back: at most the pipeline's depth of batches are in flight, so
# a record older than a few depths belongs to a step whose result never came back (an aborted
# or failed step); it goes, oldest first, instead of keeping its output's id alive forever.
PENDING_DEPTHS = 4
# Trace lines held back while earlier timed steps wait for their stage times; beyond this the
# oldest is written with what is known, so memory stays bounded.
_MAX_HELD_LINES = 512
# Plans a step may take when waiting requests share prefixes cached within the step.
_SHARED_PREFIX_REPLANS = 2
# Policies a benchmark may switch one engine between (set_bench_policy); never operator input.
BENCH_MODES = ("fixed", "base", "auto")


@dataclass(frozen=True)
class BenchPolicy:
    """A benchmark's per-round override of the target mode: "fixed" N schedules every step with
    a budget of N tokens (what vLLM does with max_num_batched_tokens = N); "base"/"auto" N plan
    as an engine with max_num_batched_tokens = N and that target would."""

    mode: str
    budget: int


def plan_difference(
    plan: StepPlan, items: list[tuple[str, int, int, bool]], preempted: tuple[str, ...]
) -> str | None:
    """None when vLLM scheduled exactly the planned requests and tokens, else why not (as far
    as the step shows it): it preempted requests (KV cache full), left a planned request out,
    scheduled one the plan did not have, or gave a request other tokens than planned."""
    planned = {i.req_id: i.tokens for i in plan.items}
    actual = {rid: n for rid, _, n, _ in items}
    if planned == actual:
        return None
    if preempted:
        return "preempted"
    if any(rid not in actual for rid in planned):
        return "planned request not scheduled"
    if any(rid not in planned for rid in actual):
        return "unplanned request scheduled"
    if any(actual[rid] < n for rid, n in planned.items()):
        return "fewer tokens than planned"
    return "more tokens than planned"


@dataclass
class StepRecord:
    step: int
    items: list[tuple[str, int, int, bool]]  # (req_id, history, tokens, is_prefill)
    plan: StepPlan | None
    timed: bool
    state: str
    preempted: tuple[str, ...] = ()  # requests vLLM preempted (KV cache full) for this step
    scheduled_at: float = 0.0  # time.monotonic() when vLLM's schedule() returned it
    # None without a plan; else whether vLLM scheduled exactly the plan, and if not, why.
    matched: bool | None = None
    mismatch: str | None = None


def scheduled_items(requests: Mapping[str, Any],
                    num_scheduled_tokens: Mapping[str, int]) -> list[tuple[str, int, int, bool]]:
    """(req_id, history, tokens, is_prefill) of each scheduled request still known.

    vLLM advances `num_computed_tokens` when it schedules, so the step's history is that count
    less the tokens scheduled now.
    """
    items = []
    for req_id, n in num_scheduled_tokens.items():
        req = requests.get(req_id)
        if req is None:
            continue
        history = int(req.num_computed_tokens) - int(n)
        items.append((req_id, history, int(n), history < int(req.num_prompt_tokens)))
    return items


def _after_cached_prefix(hits: PrefixHits, request: Any,
                         item: tuple[str, int, int, bool]) -> tuple[str, int, int, bool]:
    """A waiting request's work item, starting after the prefix vLLM will find cached (vLLM
    looks the cache up only for a request with nothing computed yet)."""
    if item[1]:
        return item
    hit = hits.hit(request, True)
    if not hit:
        return item
    return (item[0], hit, item[2] - hit, hit < request.num_prompt_tokens)


def _as_candidates(work: list[tuple[str, int, int, bool]], cap: int) -> list[Candidate]:
    if cap > 0:
        # vLLM holds every request to the operator's cap whatever we plan: seen through it,
        # the plan sizes chunks under it and schedules what vLLM will.
        return [Candidate(r, h, n if n <= cap else cap, p) for r, h, n, p in work]
    make = Candidate._make
    return [make(t) for t in work]


def core_settings(cfg: CppConfig, facts: EngineFacts) -> CoreSettings:
    base = int(cfg.base_chunk or facts.max_num_batched_tokens)
    return CoreSettings(
        base_chunk=base,
        smooth_factor=float(cfg.smooth_factor),
        min_chunk=min(int(cfg.min_chunk or base), base),
        block_size=facts.block_size,
        num_samples=int(cfg.num_samples),
        online_calibration=bool(cfg.online_calibration),
        calibration_window=int(cfg.calibration_window),
        max_failed_fits=int(cfg.max_failed_fits),
        fallback_timing_period=int(cfg.fallback_timing_period),
        pp_size=facts.pp_size,
        reference_prompt_len=min(8 * base, max(facts.max_model_len - 1, base)),
        # "fixed" never reaches the planner (see plan()); its report shows the base target.
        target_mode="auto" if cfg.target == "auto" else "base",
        step_budget=max(base, int(facts.max_num_batched_tokens)),
    )


class _ReadTail:
    """The part of the waiting queue `CppRuntime._walk` has read, served as
    `compat.WaitingOrder` serves the part not read yet."""

    def __init__(self, requests: list[Any]) -> None:
        self._requests = requests

    def take(self, n: int) -> list[Any]:
        taken = self._requests[:n]
        del self._requests[:n]
        return taken

    def more(self) -> bool:
        return bool(self._requests)

    def rest(self) -> list[Any]:
        return self._requests


def _bench_int(name: str, value: Any, top: int, what: str) -> None:
    """Refuse a benchmark policy's ``value`` unless it is an integer in ``1..top``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= top:
        raise ValueError(f"bench {name} must be an integer in 1..{top} ({what}), got {value!r}")


class CppRuntime:
    def __init__(self, cfg: CppConfig, facts: EngineFacts) -> None:
        self.cfg = cfg
        self.facts = facts
        self.manager = ProfilingChunkManager(core_settings(cfg, facts))
        self.trace = TraceWriter(cfg.trace_file) if cfg.trace_file else None
        self.max_budget: int = facts.max_num_batched_tokens
        self._step = 0
        self._pending: dict[int, StepRecord] = {}  # by id(scheduler output), oldest first
        self._pending_cap = PENDING_DEPTHS * max(2, facts.pp_size)
        self._last_summary = time.monotonic()
        self.plan_mismatches = 0
        self.steps_planned = 0
        self.steps_timed = 0
        self._last_finish: float | None = None
        self._last_had_prefill = False
        # Benchmark-only policy override (set_bench_policy); None for every served engine.
        self.bench_policy: BenchPolicy | None = None
        # The prefix lookup while a benchmark switched it off (set_bench_prefix_lookup).
        self._bench_parked_hits: Any = None
        self._operator_max_budget: int | None = None
        self.stages = StageTimes(None, 1)
        # Trace lines in step order: [line, ready]; a timed step's line waits for its stages.
        self._held: deque[list] = deque()
        self.prefix_hits: PrefixHits | None = None
        self.scheduled_before = compat.ScheduledBefore()
        self._step_fault = faults.step_hook()  # test-only (faults.py); None when served
        self._closed = False

    def use_executor(self, executor: Any) -> None:
        """Fetch every stage's step times through this executor (see stage_times.py)."""
        self.stages = StageTimes(executor, self.facts.pp_size * self.facts.tp_size)

    def attach_prefix_cache(self, lookup: Any, probe: Any = None, in_step: Any = None) -> None:
        """Use vLLM's prefix cache when planning (`compat.prefix_cache_lookup`,
        `compat.prefix_cache_probe` and `compat.prefix_cache_in_step` functions)."""
        self.prefix_hits = PrefixHits(lookup, probe, in_step=in_step) \
            if lookup is not None else None

    def prefix_cache_reset(self) -> None:
        if self.prefix_hits is not None:
            self.prefix_hits.clear()

    # ----- before and after vLLM's schedule() --------------------------------------------

    @property
    def active(self) -> bool:
        return self.manager.state in ACTIVE_STATES

    def plan(self, scheduler: Any) -> StepPlan | None:
        """This step's budget and prefill cap, or None to leave vLLM's own limits alone."""
        # Called before every schedule(), planned or not; `scheduled` records what ran.
        self.scheduled_before.begin(scheduler)
        bench = self.bench_policy
        if bench is None:
            return self._cpp_plan(scheduler)
        plan = None if bench.mode == "fixed" else self._cpp_plan(scheduler)
        # Where a separate engine would use vLLM's own budget, so does the emulation.
        return plan if plan is not None else self._budget_plan(scheduler, bench.budget)

    def _budget_plan(self, scheduler: Any, budget: int) -> StepPlan:
        items = simulate(self.candidates(scheduler), budget, 0)
        model = self.manager.predictor.model  # at the host's current speed
        ms = model.step_ms([(i.history, i.tokens) for i in items]) if model and items \
            else math.nan
        # A fixed budget of N aims, in effect, at what an N-token chunk costs from an empty
        # history: the target CPP base with that budget plans to.
        target = model.request_ms(0, budget) if model else math.nan
        return StepPlan(budget, 0, items, ms, fallback=False, reason="bench fixed budget",
                        target_ms=target)

    def set_bench_policy(self, mode: str | None, budget: int | None = None,
                         base_chunk: int | None = None, min_chunk: int | None = None) -> None:
        """BENCHMARK ONLY: serve the next requests as policy ``mode`` with ``budget`` tokens
        (and ``base_chunk``, default the budget, and ``min_chunk``, default the mode's, as
        cpp_config's keys of those names).

        benchmarks/bench_engine.py --one-engine calls this between rounds on an in-process
        engine so that one engine instance serves every policy (engine instances differ in
        speed by more than the gaps being measured). Nothing reads it from cpp_config and it
        is off (None) unless a benchmark sets it; ``mode=None`` restores the operator's
        settings. ``budget`` must not exceed the engine's max_num_batched_tokens.
        """
        if mode is None:
            self.bench_policy = None
            self.manager.use_gap_history(None)
            self.manager.reconfigure(core_settings(self.cfg, self.facts))
            self.max_budget = self._engine_budget
            return
        if mode not in BENCH_MODES:
            raise ValueError(f"bench mode must be one of {BENCH_MODES}, got {mode!r}")
        _bench_int("budget", budget, self._engine_budget, "the engine's max_num_batched_tokens")
        base = budget if base_chunk is None else base_chunk
        _bench_int("base_chunk", base, budget, "the policy's budget")
        floor = default_min_chunk(base, mode) if min_chunk is None else min_chunk
        _bench_int("min_chunk", floor, base, "the base chunk")
        self.bench_policy = BenchPolicy(mode, budget)
        # Each policy learns its host time from its own steps, as a separate engine would.
        self.manager.use_gap_history((mode, budget, base, floor))
        if mode != "fixed":
            cfg = replace(self.cfg, base_chunk=base, target=mode, min_chunk=floor)
            facts = replace(self.facts, max_num_batched_tokens=budget)
            self.manager.reconfigure(core_settings(cfg, facts))
        self.max_budget = budget
        logger.info("[CPP] benchmark policy: %s with budget %d", mode, budget)

    def set_bench_prefix_lookup(self, enabled: bool) -> None:
        """BENCHMARK ONLY: plan with (True, the default) or without vLLM's prefix-cache lookup.

        benchmarks/bench_engine.py --multiturn switches the lookup off for its ``-nolookup``
        policies to measure what the lookup buys: without it a waiting request's cached prefix
        is invisible to the planner and its first chunk is sized as if nothing were cached.
        Nothing reads it from cpp_config and a served engine never calls it. Switching back on
        forgets every kept answer (requests scheduled meanwhile were not dropped from it).
        """
        if not isinstance(enabled, bool):
            raise ValueError(f"enabled must be True or False, got {enabled!r}")
        hits = getattr(self, "prefix_hits", None)
        if enabled:
            parked = self._bench_parked_hits
            if parked is not None:
                self.prefix_hits = hits = parked
                self._bench_parked_hits = None
            if hits is not None:
                hits.clear()
        elif hits is not None:
            hits.clear()
            self._bench_parked_hits = hits
            self.prefix_hits = None
        logger.info("[CPP] benchmark prefix lookup: %s", "on" if enabled else "off")

    @property
    def _engine_budget(self) -> int:
        if self._operator_max_budget is None:
            self._operator_max_budget = self.max_budget
        return self._operator_max_budget

    def _in_flight_ms(self) -> list[float]:
        """The planned cost of each step dispatched and not yet back, oldest first (only the
        auto target's forecast reads them)."""
        if self.manager.auto is None:
            return []
        out = []
        for rec in self._pending.values():
            ms = rec.plan.predicted_ms if rec.plan is not None else math.nan
            if not math.isfinite(ms):
                ms = self.manager.predict_ms([(h, n) for _, h, n, _ in rec.items])
            out.append(ms)
        return out

    def _cpp_plan(self, scheduler: Any) -> StepPlan | None:
        fixed = self.cfg.target == "fixed" and self.bench_policy is None
        if not self.active or fixed:
            return None
        faults.hot_path("plan")
        head, rest = self._walk(scheduler)
        # The head holds the walk's first prefill whenever there is one (see _walk).
        if not any(c.is_prefill for c in head):
            return None  # decode-only steps: nothing to size, keep vLLM's budget
        plan = self.manager.plan_step(head, max_budget=self.max_budget, rest=rest,
                                      in_flight=self._in_flight_ms())
        hits = self.prefix_hits
        if hits is not None and hits.sees_in_step and not plan.fallback:
            plan = self._replan_for_shared_prefixes(hits, scheduler, head, rest, plan)
        if plan.fallback:
            return None
        self.steps_planned += 1
        return plan

    def _replan_for_shared_prefixes(self, hits: PrefixHits, scheduler: Any,
                                    head: list[Candidate], rest: WholeWalk | None,
                                    plan: StepPlan) -> StepPlan:
        """Plan again while a waiting request of the plan will find another prefix than the
        plan gave it, cached by requests before it in this step (prefix_hits.py). A plan
        rarely holds more than one such request and two rounds usually settle it; but a new
        plan may also give the request before it a chunk a block shorter (its cost at the
        longer prefix moved the lead's share), and the rounds can go back and forth. What
        vLLM does under the last plan's budget and cap is then walked out: each request's
        prefix depends only on the chunks before it, so one pass per request settles it."""
        requests = scheduler.requests
        cap = compat.operator_prefill_cap(scheduler)
        for _ in range(_SHARED_PREFIX_REPLANS):
            grown = hits.grown_in_step(requests, plan.items)
            if not grown:
                return plan

            def grow(walk: list[Candidate], grown: dict[str, int] = grown,
                     cap: int = cap) -> list[Candidate]:
                return [c if c.req_id not in grown
                        else _at_history(c, requests[c.req_id], grown[c.req_id], cap)
                        for c in walk]

            longer = grow(head)
            if rest is not None and (len(plan.items) > len(head) or sum(
                    c.is_prefill for c in longer) < self.manager.head_prefills):
                # The plan reached past the head, or a longer history made a head request a
                # decode (a resumed one): plan_step's promise about the head may no longer
                # hold, so the whole walk is planned.
                head, rest = grow(rest()), None
            else:
                head = longer
                if rest is not None:
                    def longer_walk(whole: WholeWalk = rest, grow=grow) -> list[Candidate]:
                        return grow(whole())

                    rest = longer_walk
            plan = self.manager.plan_step(head, max_budget=self.max_budget, rest=rest,
                                          in_flight=self._in_flight_ms())
            if plan.fallback:
                return plan
        grown = hits.grown_in_step(requests, plan.items)
        if not grown:
            return plan
        walk = rest() if rest is not None else head
        items = plan.items
        for _ in range(len(items)):
            walk = [c if c.req_id not in grown
                    else _at_history(c, requests[c.req_id], grown[c.req_id], cap) for c in walk]
            items = simulate(walk, plan.token_budget, plan.prefill_cap)
            grown = hits.grown_in_step(requests, items)
            if not grown:
                break
        return replace(plan, items=items,
                       predicted_ms=self.manager.predict_ms([(i.history, i.tokens)
                                                             for i in items]))

    def candidates(self, scheduler: Any) -> list[Candidate]:
        """Every request vLLM's walk may take this step, in walk order."""
        head, rest = self._walk(scheduler)
        return head if rest is None else rest()

    def _walk(self, scheduler: Any) -> tuple[list[Candidate], WholeWalk | None]:
        """The candidates a step can reach, and, when the waiting queue goes on past them, a
        function that builds the whole walk (for `ProfilingChunkManager.plan_step`'s
        ``rest``).

        Waiting requests are built, and looked up in the prefix cache, only up to the step's
        reach: once the work of those before covers the largest budget, vLLM's walk cannot get
        further this step, and a request further back is looked up when it moves up. A burst
        of arrivals thus costs lookups only as the queue drains. Of the requests past the
        reach the plan needs only to know that each is a whole prompt not yet started with no
        output to replay (a prefill from history 0, and still one after any prefix hit): when
        no request vLLM scheduled before is waiting (`compat.ScheduledBefore`) that is known
        without reading them, else each is read (a few attribute reads). Where one is not (a
        resumed or remote-KV request with computed tokens, a preempted one with output) the
        whole walk is built.

        A prefill cap (CPP's or the operator's) can cut a long prompt's share of the step, and
        the walk then reaches further than the work counted here: `plan_step` sees that (the
        plan took the whole head with budget to spare) and asks for the whole walk, whose
        requests are looked up as far as the smallest cap could let the walk reach (each
        counted at its work or at the fewest tokens a cap can leave it).
        """
        work = compat.running_work(scheduler)
        order = compat.WaitingOrder(scheduler, compat.admission_slots(scheduler))
        hits = self.prefix_hits
        cap = compat.operator_prefill_cap(scheduler)
        least = self._least_share(cap)
        reach = self.max_budget
        covered = capped = 0
        work_item = compat.work_item
        append = work.append
        for req in order:
            item = work_item(req)
            if item is None:
                continue
            if hits is not None:
                item = _after_cached_prefix(hits, req, item)
            append(item)
            covered += item[2]
            capped += item[2] if item[2] < least else least
            if covered >= reach:
                break
        tail: compat.WaitingOrder | _ReadTail
        if self.scheduled_before.none_waiting(scheduler):
            # Every waiting request is a prompt vLLM never scheduled (compat.ScheduledBefore):
            # the admissible requests the step cannot reach are whole prompts, read only when
            # the plan asks for them, so a long queue costs nothing a step.
            tail = order
        else:
            read, whole = order.tail()
            if not whole:
                work += self._looked_up(read, capped, least)
                return _as_candidates(work, cap), None
            tail = _ReadTail(read)
        # The plan reads the lead (the first prefill) and, with the auto target, the first
        # few queued prefills: those come from the tail when the head has too few.
        short = self.manager.head_prefills - sum(1 for item in work if item[3])
        if short > 0:
            work += self._looked_up(tail.take(short), 0, None)
        head = _as_candidates(work, cap)
        if not tail.more():
            return head, None
        rest: list[list[Any]] = []  # read once, whatever number of times the plan asks

        def whole() -> list[Candidate]:
            if not rest:
                rest.append(tail.rest())
            return head + _as_candidates(self._looked_up(rest[0], capped, least), cap)

        return head, whole

    def _least_share(self, cap: int) -> int:
        """The fewest tokens a capped prefill can take in a step (CPP's cap is at least one
        alignment unit, the operator's is what it is): what a waiting request's work may
        shrink to in vLLM's walk, so what counts towards how far the walk can reach."""
        least = self.manager.predictor.alignment
        return cap if 0 < cap < least else least

    def _looked_up(self, requests: list[Any], covered: int,
                   least: int | None) -> list[tuple[str, int, int, bool]]:
        """`work_item`s of waiting requests, each after the prefix it will find cached, looked
        up while a capped walk can still reach it: the waiting requests before them count
        ``covered`` tokens, and each of these its work or ``least`` tokens, whichever is
        smaller (``least`` None: look every one up)."""
        work = compat.pending_work(requests)
        hits = self.prefix_hits
        if hits is None or not work:
            return work
        reach = self.max_budget
        by_id = {r.request_id: r for r in requests}
        out = []
        for item in work:
            if least is None or covered < reach:
                item = _after_cached_prefix(hits, by_id[item[0]], item)
                if least is not None:
                    covered += item[2] if item[2] < least else least
            out.append(item)
        return out

    def left_waiting(self, scheduled: Collection[str], finished: Collection[str]) -> None:
        """Forget what is kept about waiting requests that vLLM scheduled or finished."""
        self.scheduled_before.record(scheduled, finished)
        hits = self.prefix_hits
        if hits is not None:
            hits.drop(scheduled)
            hits.drop(finished)

    def scheduled(self, scheduler: Any, output: Any, plan: StepPlan | None) -> StepRecord | None:
        """Record what vLLM actually scheduled; mark the step for timing when sampled.

        Returns the step's record (None for a step without requests: the guard's sign that
        there was no work to do)."""
        # First, before anything that may fail: what is kept about waiting requests must not
        # outlive their scheduling (ScheduledBefore, PrefixHits).
        self.left_waiting(output.num_scheduled_tokens, compat.finished_request_ids(output))
        faults.hot_path("record")
        self._step += 1
        if self._step_fault is not None:
            self._step_fault()
        items = scheduled_items(scheduler.requests, output.num_scheduled_tokens)
        self.manager.record_decodes([(h, n) for _, h, n, pre in items if not pre])
        if not items:
            return None
        preempted = compat.preempted_request_ids(output)
        matched: bool | None = None
        mismatch: str | None = None
        if plan is not None:
            mismatch = plan_difference(plan, items, preempted)
            matched = mismatch is None
            if not matched:
                # vLLM had its reasons (KV blocks, encoder budget, ...); the trace shows both.
                self.plan_mismatches += 1
        timed = self.manager.should_time_step(any(item[3] for item in items))
        if timed:
            # The step number tells every worker's timer which step it timed.
            setattr(output, compat.TIME_STEP_ATTR, self._step)
        rec = StepRecord(
            self._step, items, plan, timed, self.manager.state.value,
            preempted, time.monotonic(), matched, mismatch,
        )
        self._pending[id(output)] = rec
        while len(self._pending) > self._pending_cap:
            del self._pending[next(iter(self._pending))]
        return rec

    def finished(self, output: Any, model_output: Any) -> bool | None:
        """The step's result is back: feed calibration, write the trace, maybe log.
        True when there was a recorded step to finish."""
        rec = self._pending.pop(id(output), None)
        if rec is None:
            return None
        last_ms = compat.read_step_ms(model_output) if rec.timed else None
        self._host_gap(rec, last_ms)
        line = self.trace.line_for(rec, last_ms, self.manager) if self.trace is not None \
            else None
        entry = [line, not rec.timed]
        if line is not None:
            self._held.append(entry)
        if rec.timed:
            self.stages.submit(rec.step, (rec, entry), last_ms)
        faults.hot_path("stages")
        self.stages.poll(self._resolve, self._step)
        self._write_ready()
        self._maybe_summary()
        return True

    def _resolve(self, payload: Any, last_ms: float | None,
                 stage_ms: list[float] | None) -> None:
        """A timed step with its stage times (or the last stage's alone): plan on the slowest."""
        rec, entry = payload
        try:
            self._resolve_step(rec, entry[0], last_ms, stage_ms)
        finally:
            # Also when calibration failed (the guard above counts it): the line is written
            # with what is known instead of holding back every later line.
            entry[1] = True

    def _resolve_step(self, rec: StepRecord, line: dict | None, last_ms: float | None,
                      stage_ms: list[float] | None) -> None:
        known = [t for t in (stage_ms or []) if t is not None]
        if last_ms is not None:
            known.append(last_ms)
        measured = max(known) if known else None
        if line is not None:
            line["measured_ms"] = _round(measured)
            line["stage_ms"] = [_round(t) for t in stage_ms] if stage_ms else None
        event = None
        if measured is not None:
            self.steps_timed += 1
            pairs = [(h, n) for _, h, n, _ in rec.items]
            # The plan's prediction only when vLLM ran the plan; otherwise None makes the
            # manager predict the items that actually ran with its current model.
            predicted = rec.plan.predicted_ms if rec.matched else None
            faults.hot_path("calibration")
            event = self.manager.record_step(pairs, measured, predicted)
            if event is not None:
                self._log_event(event)
        if line is not None:
            cal = self.manager.calibrator
            if cal is not None and measured is not None:
                # The counts right after this step's row went in, not when its line was built.
                line["fit_attempts"] = cal.attempts
                line["failed_fits"] = cal.failed_fits
            if event is not None:
                line["event"] = {"kind": event.kind, "reason": event.reason}
                line["state"] = rec.state
                line["state_after"] = self.manager.state.value

    def _write_ready(self) -> None:
        held = self._held
        if self.trace is not None and held and held[0][1]:
            faults.hot_path("trace")
        while held and (held[0][1] or len(held) > _MAX_HELD_LINES):
            line, _ = held.popleft()
            if self.trace is not None and line is not None:
                self.trace.write_line(line)

    def _host_gap(self, rec: StepRecord, measured: float | None) -> None:
        # Only between prefill steps the pipeline ran back to back (this one was scheduled
        # before the previous result came in): then the wall time between the two results is
        # the step's forward plus whatever host work the pipeline did not hide.
        now = time.monotonic()
        has_prefill = any(pre for *_, pre in rec.items)
        last = self._last_finish
        if (measured is not None and has_prefill and self._last_had_prefill
                and last is not None and rec.scheduled_at < last):
            self.manager.record_host_gap((now - last) * 1000.0 - measured)
        self._last_finish = now
        self._last_had_prefill = has_prefill

    # ----- logs ----------------------------------------------------------------------------

    def _log_event(self, event: Any) -> None:
        if event.kind == "gave_up":
            logger.warning(
                "[CPP] online calibration gave up after %d failed fits (%s); "
                "using fixed chunks of %d tokens and timing one step in %d until a later "
                "window fits", event.failed_fits, event.reason,
                self.manager.settings.base_chunk, self.manager.settings.fallback_timing_period,
            )
        elif event.kind == "reenabled":
            logger.info("[CPP] online calibration recovered: dynamic chunking is back on (%s)",
                        event.reason)
        elif event.kind == "rescued":
            logger.info("[CPP] online calibration rescued the server: dynamic chunking is on "
                        "after a startup without a usable fit (%s)", event.reason)
        elif event.kind == "accepted":
            m = event.model
            logger.debug(
                "[CPP] refit accepted: a=%.3g b=%.3g c=%.3g gamma=%.3g d=%.3g "
                "(rel. residual %.1f%%)", m.a, m.b, m.c, m.gamma, m.d, 100 * event.rel_residual,
            )

    def _maybe_summary(self) -> None:
        faults.hot_path("summary")
        now = time.monotonic()
        if now - self._last_summary < self.cfg.log_interval_s:
            return
        self._last_summary = now
        logger.info("[CPP] %s", self.summary_line())

    def summary_line(self) -> str:
        s = self.manager.summary()
        err = s.get("median_prediction_error")
        err_txt = f"{100 * err:.1f}%" if isinstance(err, float) and err == err else "n/a"
        timing = "all-stages" if self.stages.enabled else "last-stage"
        return (
            f"state={self.manager.state.value} calibration={s.get('calibration')} "
            f"timing={timing} steps_planned={self.steps_planned} "
            f"steps_timed={self.steps_timed} median_pred_error={err_txt} "
            f"fit_attempts={s.get('fit_attempts', 0)} failed_fits={s.get('failed_fits', 0)} "
            f"plan_mismatches={self.plan_mismatches} "
            f"host_ms_per_step={s.get('host_ms_per_step', 0.0):.1f} "
            f"speed={s.get('speed', 1.0):.2f}"
        )

    def close(self) -> None:
        """Write what is held and the shutdown summary; once (later calls do nothing)."""
        if self._closed:
            return
        self._closed = True
        self.stages.flush(self._resolve)
        self._write_ready()
        logger.info("[CPP] at shutdown: %s", self.summary_line())
        if self.trace is not None:
            self.trace.close()


def _round(x: float | None) -> float | None:
    if x is None or x != x:
        return None
    return round(float(x), 4)


def _at_history(candidate: Candidate, request: Any, history: int, cap: int) -> Candidate:
    """A waiting request's candidate starting at ``history`` (a longer cached prefix), its
    work seen through the operator's cap as `_as_candidates` does."""
    _, full, _ = compat.request_progress(request)  # nothing computed yet: its whole work
    need = full - history
    if 0 < cap < need:
        need = cap
    return Candidate(candidate.req_id, history, need, history < request.num_prompt_tokens)
