"""A discrete-event model of vLLM's pipeline-parallel engine, driven by the latency model.

What is modelled, and from where in vLLM (0.32) it comes:

- ``EngineCore.step_with_batch_queue``: a queue of at most ``S`` (= pipeline size) batches.
  While it has room and requests exist, the scheduler is called and its batch dispatched
  without waiting; when it is full, or nothing new was scheduled and no request is left, the
  engine blocks on the oldest batch and feeds its output back (``update_from_output``).
  Empty batches take a queue slot too, as they do there.
- ``Scheduler.schedule``: running requests first, then waiting ones (FCFS), each getting
  ``min(tokens it needs, long_prefill_token_threshold when > 0 and more than one request is
  eligible, budget left)``; a request with nothing to schedule is skipped. A prefill's next
  chunk can be scheduled while its previous chunk is in flight (``num_computed_tokens``
  advances at schedule time); a decode needs its previous token back, so a request whose last
  step is still in the pipeline needs 0 tokens.
- The CPP plugin: the real hook (:meth:`vllm_ascend_cpp.runtime.CppRuntime.plan`, which builds
  candidates through ``compat`` and calls ``ProfilingChunkManager.plan_step``) sets the
  step's budget and prefill cap before the walk, exactly as the scheduler subclass does.
- The pipeline: a step costs ``model.step_ms(items)`` on every stage (the profile is the
  per-stage cost); it occupies stage ``s`` after stage ``s-1`` finished it and after stage
  ``s`` finished the previous step.
- Closed-loop clients (``vllm bench serve --max-concurrency k``): ``k`` requests start at
  once, each completion starts the next prompt. Decodes either run on this engine
  (``decode="engine"``) or elsewhere after the first token (``decode="remote"``: a
  prefill node under PD disaggregation, as in seed 000), costing the client a fixed time.

Not modelled: KV-cache capacity and preemption, prefix caching, speculative decoding,
communication time between stages (fold it into ``c``), async scheduling.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import numpy as np

from vllm_ascend_cpp.config import CppConfig, validate_for_engine
from vllm_ascend_cpp.core.latency_model import LatencyModel
from vllm_ascend_cpp.core.step_planner import StepPlan
from vllm_ascend_cpp.runtime import CppRuntime, scheduled_items

from .timeline import StepSpan, Timeline, cv

__all__ = ["EngineSpec", "Policy", "Workload", "SimResult", "simulate_policy", "POLICY_KINDS"]

POLICY_KINDS = ("fixed", "cpp-base", "cpp-auto")


@dataclass(frozen=True)
class Policy:
    """How prefill chunks are sized: vLLM's fixed budget, or CPP with a base or auto target.

    ``budget`` is ``max_num_batched_tokens`` (the step's token budget) in every case; for CPP
    ``base_chunk`` defaults to it and ``min_chunk`` to the plugin's default.
    """

    kind: str
    budget: int
    base_chunk: int | None = None
    min_chunk: int | None = None
    smooth_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in POLICY_KINDS:
            raise ValueError(f"policy kind must be one of {', '.join(POLICY_KINDS)}, "
                             f"got {self.kind!r}")
        if int(self.budget) < 1:
            raise ValueError(f"policy budget must be >= 1, got {self.budget}")

    @property
    def name(self) -> str:
        return f"{self.kind}@{self.budget}"

    @classmethod
    def parse(cls, text: str) -> Policy:
        """``fixed:16384``, ``cpp-base:16384`` or ``cpp-auto:32768``."""
        kind, sep, budget = text.partition(":")
        if not sep or not budget.strip().isdigit():
            raise ValueError(f"policy {text!r}: expected KIND:BUDGET with KIND one of "
                             f"{', '.join(POLICY_KINDS)}")
        return cls(kind.strip(), int(budget))


@dataclass(frozen=True)
class Workload:
    """Closed-loop clients: ``concurrency`` in flight, ``num_requests`` in total.

    ``variable`` draws prompt lengths uniformly from ``[0.5, 1.5] * prompt_len`` (seeded, so
    every policy sees the same prompts). With ``decode="remote"`` the engine stops at the
    first token and the client then spends ``(output_len - 1) * (remote_tpot_ms +
    remote_tpot_per_ktok_ms * prompt_len / 1024)`` ms elsewhere before its next request.
    """

    concurrency: int = 1
    num_requests: int | None = None
    prompt_len: int = 16384
    variable: bool = False
    output_len: int = 128
    decode: str = "engine"
    remote_tpot_ms: float = 0.0
    remote_tpot_per_ktok_ms: float = 0.0
    seed: int = 0
    # An exact prompt list to replay (overrides prompt_len, num_requests and variable).
    prompts: tuple[int, ...] | None = None
    # Fixed submission times (ms), one per prompt in order: the clients no longer wait for
    # their last request, so every policy sees the same arrivals. A closed loop lets a faster
    # policy submit earlier into a busier queue, which mean TTFT alone counts against it.
    arrivals_ms: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.prompt_len < 1 or self.output_len < 1:
            raise ValueError("prompt_len and output_len must be >= 1")
        if self.decode not in ("engine", "remote"):
            raise ValueError(f"decode must be 'engine' or 'remote', got {self.decode!r}")
        if self.arrivals_ms is not None:
            times = [float(t) for t in self.arrivals_ms]
            if len(times) != self.total_requests:
                raise ValueError(f"arrivals_ms has {len(times)} times for "
                                 f"{self.total_requests} prompts")
            if any(not math.isfinite(t) or t < 0 for t in times) or times != sorted(times):
                raise ValueError("arrivals_ms must be finite, non-negative and ascending")

    @property
    def total_requests(self) -> int:
        if self.prompts:
            return len(self.prompts)
        return int(self.num_requests) if self.num_requests else max(4, 4 * self.concurrency)

    def prompt_lengths(self) -> list[int]:
        if self.prompts:
            return [max(1, int(n)) for n in self.prompts]
        n = self.total_requests
        if not self.variable:
            return [int(self.prompt_len)] * n
        rng = np.random.default_rng(self.seed)
        lo, hi = 0.5 * self.prompt_len, 1.5 * self.prompt_len
        return [max(1, int(round(x))) for x in rng.uniform(lo, hi, size=n)]

    def remote_decode_ms(self, prompt_len: int) -> float:
        if self.decode != "remote":
            return 0.0
        per_token = self.remote_tpot_ms + self.remote_tpot_per_ktok_ms * prompt_len / 1024.0
        return max(0, self.output_len - 1) * per_token


@dataclass(frozen=True)
class EngineSpec:
    """The simulated engine: ``stages`` pipeline stages, each costing ``model`` per step.

    ``plan_model`` is what CPP believes (default: ``model``), so a wrong profile can be
    simulated. ``sched_ms`` is host time per ``schedule()`` call spent before dispatch;
    ``stage_scale`` makes stages unequal; ``noise`` is the relative standard deviation of a
    step's time (seeded).
    """

    stages: int
    model: LatencyModel
    block_size: int = 16
    max_num_seqs: int = 256
    max_model_len: int = 1 << 21
    sched_ms: float = 0.0
    stage_scale: tuple[float, ...] | None = None
    noise: float = 0.0
    plan_model: LatencyModel | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.stages < 1:
            raise ValueError(f"stages must be >= 1, got {self.stages}")
        if self.stage_scale is not None and len(self.stage_scale) != self.stages:
            raise ValueError("stage_scale needs one factor per stage")


class SimRequest:
    """Shaped like vLLM's ``Request`` where the scheduler and ``compat`` read it."""

    __slots__ = ("request_id", "num_prompt_tokens", "max_tokens", "num_computed_tokens",
                 "num_output_tokens", "num_output_placeholders", "arrival_ms",
                 "first_token_ms", "finished_ms", "client_done_ms", "chunks")

    def __init__(self, request_id: str, prompt_len: int, max_tokens: int,
                 arrival_ms: float) -> None:
        self.request_id = request_id
        self.num_prompt_tokens = int(prompt_len)
        self.max_tokens = int(max_tokens)
        self.num_computed_tokens = 0
        self.num_output_tokens = 0
        self.num_output_placeholders = 0
        self.arrival_ms = arrival_ms
        self.first_token_ms = math.nan
        self.finished_ms = math.nan
        self.client_done_ms = math.nan
        self.chunks: list[tuple[int, int]] = []

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_tokens


class SimScheduler:
    """vLLM's scheduling walk (see the module docstring) over :class:`SimRequest`s."""

    def __init__(self, budget: int, max_num_seqs: int) -> None:
        self.max_num_scheduled_tokens = int(budget)
        self.max_num_running_reqs = int(max_num_seqs)
        self.long_prefill_token_threshold = 0
        self.running: list[SimRequest] = []
        self.waiting: deque[SimRequest] = deque()
        self.requests: dict[str, SimRequest] = {}

    def has_requests(self) -> bool:
        return bool(self.running or self.waiting)

    def schedule(self, token_budget: int, prefill_cap: int) -> list[tuple[SimRequest, int]]:
        eligible = len(self.running) + len(self.waiting)
        cap = prefill_cap if eligible > 1 else 0
        budget = int(token_budget)
        out: list[tuple[SimRequest, int]] = []
        for req in self.running:
            if budget <= 0:
                break
            n = req.num_tokens_with_spec + req.num_output_placeholders - req.num_computed_tokens
            if 0 < cap < n:
                n = cap
            n = min(n, budget)
            if n <= 0:
                continue
            out.append((req, n))
            budget -= n
        while budget > 0 and self.waiting and len(self.running) < self.max_num_running_reqs:
            req = self.waiting[0]
            n = req.num_tokens - req.num_computed_tokens
            if 0 < cap < n:
                n = cap
            n = min(n, budget)
            if n <= 0:
                break
            self.waiting.popleft()
            self.running.append(req)
            out.append((req, n))
            budget -= n
        for req, n in out:
            req.chunks.append((req.num_computed_tokens, n))
            req.num_computed_tokens += n
        return out


@dataclass
class _SimOutput:
    """The part of vLLM's SchedulerOutput the plugin's runtime reads."""

    num_scheduled_tokens: dict[str, int]


@dataclass
class _Batch:
    items: list[tuple[SimRequest, int, int, bool]]  # (request, history, tokens, is_prefill)
    done_ms: float
    span: StepSpan | None
    output: _SimOutput


@dataclass
class SimResult:
    policy: str
    stages: int
    concurrency: int
    prompt_lens: list[int]
    ttft_ms: list[float]
    makespan_ms: float
    throughput_tok_s: float
    request_throughput: float
    prefill_step_cv: float
    bubble_fraction: float
    steps: int
    prefill_steps: int
    plan_mismatches: int
    targets_ms: list[float] = field(default_factory=list)
    timeline: Timeline | None = None
    # Submission time of each request (ms), in prompt order: Workload.arrivals_ms replays them.
    arrival_ms: list[float] = field(default_factory=list)

    @property
    def mean_ttft_ms(self) -> float:
        return float(np.mean(self.ttft_ms)) if self.ttft_ms else math.nan

    @property
    def median_ttft_ms(self) -> float:
        return float(np.median(self.ttft_ms)) if self.ttft_ms else math.nan

    def to_dict(self, timeline_steps: int | None = 0) -> dict:
        def clean(v: float) -> float | None:
            return round(float(v), 4) if math.isfinite(v) else None

        d = {"policy": self.policy, "stages": self.stages, "concurrency": self.concurrency,
             "requests": len(self.ttft_ms), "mean_ttft_ms": clean(self.mean_ttft_ms),
             "median_ttft_ms": clean(self.median_ttft_ms),
             "throughput_tok_s": clean(self.throughput_tok_s),
             "request_throughput": clean(self.request_throughput),
             "makespan_ms": clean(self.makespan_ms), "prefill_step_cv": clean(self.prefill_step_cv),
             "bubble_fraction": clean(self.bubble_fraction), "steps": self.steps,
             "prefill_steps": self.prefill_steps, "plan_mismatches": self.plan_mismatches,
             "ttft_ms": [clean(t) for t in self.ttft_ms]}
        if self.targets_ms:
            d["target_ms"] = {"min": clean(min(self.targets_ms)),
                              "max": clean(max(self.targets_ms))}
        if self.timeline is not None and timeline_steps != 0:
            d["timeline"] = self.timeline.to_dict(limit=timeline_steps)
        return d


def _vllm_config(engine: EngineSpec, budget: int) -> Any:
    """The attributes of a VllmConfig that ``validate_for_engine`` reads."""
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_batched_tokens=int(budget),
                                         max_num_seqs=engine.max_num_seqs,
                                         enable_chunked_prefill=True, scheduler_cls=None,
                                         long_prefill_token_threshold=0),
        parallel_config=SimpleNamespace(pipeline_parallel_size=engine.stages,
                                        tensor_parallel_size=1, worker_extension_cls=None),
        cache_config=SimpleNamespace(block_size=engine.block_size),
        model_config=SimpleNamespace(max_model_len=engine.max_model_len),
        additional_config={},
    )


def build_runtime(engine: EngineSpec, policy: Policy) -> CppRuntime:
    """The plugin's own runtime, configured as ``cpp_config`` would and given the model."""
    cfg = CppConfig(enabled=True, base_chunk=policy.base_chunk, min_chunk=policy.min_chunk,
                    smooth_factor=float(policy.smooth_factor),
                    target="auto" if policy.kind == "cpp-auto" else "base",
                    online_calibration=False, profile_cache_dir=None, trace_file=None)
    if engine.stages < 2:
        raise ValueError("CPP needs pipeline parallelism: simulate at least 2 stages")
    resolved, facts = validate_for_engine(cfg, _vllm_config(engine, policy.budget))
    rt = CppRuntime(resolved, facts)
    rt.max_budget = int(policy.budget)
    model = engine.plan_model or engine.model
    rt.manager.load_profile({"model": model.to_dict()})
    # The engine learns its host time per step while serving; the simulation knows it.
    rt.manager.use_host_ms(engine.sched_ms)
    return rt


def _through_stages(stage_free: list[float], now: float, step_ms: float,
                    scale: Sequence[float]) -> tuple[list[float], list[float]]:
    """Start and end on each stage of a step dispatched at ``now``; books the stages."""
    starts, ends = [], []
    prev = now
    for s, free in enumerate(stage_free):
        start = max(prev, free)
        prev = start + step_ms * scale[s]
        starts.append(start)
        ends.append(prev)
        stage_free[s] = prev
    return starts, ends


def simulate_policy(engine: EngineSpec, policy: Policy, workload: Workload,
                    record_timeline: bool = False) -> SimResult:
    """Run ``workload`` on ``engine`` under ``policy``; see the module docstring."""
    S = engine.stages
    model = engine.model
    scale = engine.stage_scale or (1.0,) * S
    rng = np.random.default_rng(engine.seed)
    runtime = build_runtime(engine, policy) if policy.kind != "fixed" else None
    sched = SimScheduler(policy.budget, engine.max_num_seqs)
    local_tokens = workload.output_len if workload.decode == "engine" else 1
    lengths = workload.prompt_lengths()
    all_reqs: list[SimRequest] = []
    next_prompt = 0
    arrivals: list[tuple[float, int]] = []  # (time, sequence) of client submissions
    replay = workload.arrivals_ms is not None
    if replay:
        for t in workload.arrivals_ms:
            heapq.heappush(arrivals, (float(t), len(arrivals)))
    else:
        for _ in range(min(workload.concurrency, len(lengths))):
            heapq.heappush(arrivals, (0.0, len(arrivals)))
    stage_free = [0.0] * S
    batch_queue: deque[_Batch] = deque()
    timeline = Timeline(S) if record_timeline else None
    spans: list[StepSpan] = []
    step_ms_all: list[float] = []
    now = 0.0
    steps = prefill_steps = 0
    targets: list[float] = []
    done = 0
    seq = len(arrivals)

    def admit(until: float) -> None:
        nonlocal next_prompt
        while arrivals and arrivals[0][0] <= until and next_prompt < len(lengths):
            t, _ = heapq.heappop(arrivals)
            req = SimRequest(f"r{next_prompt}", lengths[next_prompt], local_tokens, t)
            next_prompt += 1
            sched.waiting.append(req)
            sched.requests[req.request_id] = req
            all_reqs.append(req)

    while done < len(lengths):
        admit(now)
        if sched.has_requests():
            plan: StepPlan | None = runtime.plan(sched) if runtime is not None else None
            if plan is not None:
                budget, cap = plan.token_budget, plan.prefill_cap
                manager = runtime.manager
                if manager.auto is not None and manager.auto.target_ms is not None:
                    targets.append(manager.auto.target_ms)
            else:
                budget, cap = policy.budget, 0
            now += engine.sched_ms
            output = _SimOutput({r.request_id: n for r, n in sched.schedule(budget, cap)})
            # What the plugin records of the step, by the plugin's own code.
            if runtime is not None:
                rec = runtime.scheduled(sched, output, plan)
                rows = rec.items if rec is not None else []
            else:
                rows = scheduled_items(sched.requests, output.num_scheduled_tokens)
            items = [(sched.requests[rid], h, n, pre) for rid, h, n, pre in rows]
            if items:
                t = model.step_ms([(h, n) for _, h, n, _ in items])
                if engine.noise > 0:
                    t *= max(0.05, 1.0 + engine.noise * float(rng.standard_normal()))
                starts, ends = _through_stages(stage_free, now, t, scale)
                steps += 1
                has_prefill = any(pre for *_, pre in items)
                prefill_steps += has_prefill
                step_ms_all.append(t)
                span = StepSpan(steps, [(r.request_id, h, n, pre) for r, h, n, pre in items],
                                t, starts, ends,
                                plan.predicted_ms if plan is not None else math.nan)
                spans.append(span)
                batch = _Batch(items, ends[-1], span, output)
            else:
                # An empty batch still takes a queue slot; it is done once the workers
                # reach it, i.e. after the batch before it.
                prior = batch_queue[0].done_ms if batch_queue else now
                batch = _Batch([], max(now, prior), None, output)
            batch_queue.appendleft(batch)
            if len(batch_queue) < S and (items or sched.has_requests()):
                continue
        elif not batch_queue:
            if not arrivals:
                break  # nothing left anywhere (should not happen before all are done)
            now = max(now, arrivals[0][0])
            continue
        batch = batch_queue.pop()
        now = max(now, batch.done_ms)
        if runtime is not None:
            runtime.finished(batch.output, None)  # no measured time: the model is the truth
        for req, h, n, _pre in batch.items:
            if h + n < req.num_prompt_tokens:
                continue  # a partial prefill chunk samples nothing
            req.num_output_tokens += 1
            if req.num_output_tokens == 1:
                req.first_token_ms = now
            if req.num_output_tokens >= req.max_tokens:
                req.finished_ms = now
                sched.running.remove(req)
                req.client_done_ms = now + workload.remote_decode_ms(req.num_prompt_tokens)
                done += 1
                if not replay:
                    heapq.heappush(arrivals, (req.client_done_ms, seq))
                    seq += 1

    ttft = [r.first_token_ms - r.arrival_ms for r in all_reqs]
    start = min((r.arrival_ms for r in all_reqs), default=0.0)
    end = max((r.client_done_ms for r in all_reqs), default=0.0)
    makespan = end - start
    tokens = sum(r.num_prompt_tokens + workload.output_len for r in all_reqs)
    windows = [(r.arrival_ms, r.first_token_ms) for r in all_reqs]
    tl = Timeline(S, spans, windows)
    result = SimResult(
        policy=policy.name, stages=S, concurrency=workload.concurrency,
        prompt_lens=[r.num_prompt_tokens for r in all_reqs], ttft_ms=ttft,
        makespan_ms=makespan,
        throughput_tok_s=tokens / (makespan / 1000.0) if makespan > 0 else math.nan,
        request_throughput=len(all_reqs) / (makespan / 1000.0) if makespan > 0 else math.nan,
        prefill_step_cv=cv([s.stage_ms for s in spans if s.has_prefill]),
        bubble_fraction=tl.bubble_fraction(), steps=steps, prefill_steps=prefill_steps,
        plan_mismatches=runtime.plan_mismatches if runtime is not None else 0,
        targets_ms=targets, arrival_ms=[r.arrival_ms for r in all_reqs])
    if timeline is not None:
        result.timeline = tl
    return result


def simulate_policies(engine: EngineSpec, policies: Sequence[Policy], workload: Workload,
                      record_timeline: bool = False) -> list[SimResult]:
    return [simulate_policy(engine, p, workload, record_timeline) for p in policies]


def with_stages(engine: EngineSpec, stages: int) -> EngineSpec:
    return replace(engine, stages=stages, stage_scale=None)
