"""Every vLLM / vllm-ascend version difference and every name we put on their objects.

Nothing here imports vllm, torch, torch_npu or vllm_ascend at module import time, so
`import vllm_ascend_cpp` works where they are absent. Functions that need them import lazily
and say what they fall back to.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Mapping
from typing import Any

# Oldest vLLM whose surfaces we use (see tools/check_vllm_compat.py and docs/compatibility.md).
MIN_VLLM_VERSION = (0, 23, 0)

# Our classes, by qualified name, as vLLM's config fields expect.
SCHEDULER_CLS = "vllm_ascend_cpp.scheduler.CppScheduler"
ASYNC_SCHEDULER_CLS = "vllm_ascend_cpp.scheduler.CppAsyncScheduler"
WORKER_EXTENSION_CLS = "vllm_ascend_cpp.worker.extension.CppWorkerExtension"
OUR_SCHEDULERS = (SCHEDULER_CLS, ASYNC_SCHEDULER_CLS)

# Names we add to vLLM objects that cross process boundaries (both are pickled with their
# instance __dict__, so a plain attribute travels with them; neither class uses __slots__).
TIME_STEP_ATTR = "cpp_time_step"  # on SchedulerOutput: "time this step" for the workers
STEP_MS_ATTR = "cpp_step_ms"  # on ModelRunnerOutput: measured forward ms of the last stage

# Worker methods reached through collective_rpc (added by the worker extension class).
WORKER_PREPARE = "cpp_prepare_worker"
WORKER_SWEEP = "cpp_profile_sweep"

# vllm-ascend's own switches that must not be on together with ours.
ASCEND_BALANCE_ENV = "VLLM_ASCEND_BALANCE_SCHEDULING"
ASCEND_PROFILING_KEY = "profiling_chunk_config"


# ----- vLLM presence and version ------------------------------------------------------------


def vllm_version() -> tuple[int, ...] | None:
    """The installed vLLM version as a tuple, or None when vLLM is not importable."""
    try:
        import vllm  # noqa: F401
        from vllm import __version__ as v
    except Exception:
        return None
    return parse_version(v)


def parse_version(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in text.split("+")[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
        if not piece.isdigit():
            break
    return tuple(parts)


def check_vllm() -> str | None:
    """None when vLLM is importable and new enough, else the reason CPP stays off."""
    v = vllm_version()
    if v is None:
        return "vLLM is not importable"
    if v[:3] < MIN_VLLM_VERSION:
        want = ".".join(map(str, MIN_VLLM_VERSION))
        return f"vLLM {'.'.join(map(str, v))} is older than {want}"
    return None


# ----- config fields that moved or that other projects own ------------------------------


def user_scheduler_cls(scheduler_config: Any) -> str | None:
    """The operator's own scheduler class, if any (ours and vLLM's defaults do not count)."""
    cls = getattr(scheduler_config, "scheduler_cls", None)
    if cls is None:
        return None
    name = cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}"
    if name in OUR_SCHEDULERS:
        return None
    # Older vLLM filled the field with its default class instead of leaving it None.
    if name in (
        "vllm.v1.core.sched.scheduler.Scheduler",
        "vllm.v1.core.sched.async_scheduler.AsyncScheduler",
    ):
        return None
    return name


def user_worker_extension_cls(parallel_config: Any) -> str | None:
    ext = getattr(parallel_config, "worker_extension_cls", None) or None
    if ext in (None, "", WORKER_EXTENSION_CLS):
        return None
    return str(ext)


def async_scheduling(scheduler_config: Any) -> bool:
    return bool(getattr(scheduler_config, "async_scheduling", False))


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def ascend_balance_scheduling(
    additional: Mapping[str, Any], environ: Mapping[str, str]
) -> str | None:
    """Describe vllm-ascend's balance scheduling switch when it is on, else None.

    vllm-ascend reads `additional_config.scheduler_config.enable_balance_scheduling` (and, in
    older releases, the top-level key) or the env var VLLM_ASCEND_BALANCE_SCHEDULING.
    """
    sched = additional.get("scheduler_config") if isinstance(additional, Mapping) else None
    if isinstance(sched, Mapping) and _truthy(sched.get("enable_balance_scheduling")):
        return "additional_config.scheduler_config.enable_balance_scheduling = true"
    if isinstance(additional, Mapping) and _truthy(additional.get("enable_balance_scheduling")):
        return "additional_config.enable_balance_scheduling = true"
    if _truthy(environ.get(ASCEND_BALANCE_ENV, "")):
        return f"{ASCEND_BALANCE_ENV}={environ.get(ASCEND_BALANCE_ENV)}"
    return None


def ascend_profiling_chunk_enabled(additional: Mapping[str, Any]) -> str | None:
    """Where vllm-ascend's own profiling chunk is enabled, else None.

    Since v0.25.1rc1 it lives under `scheduler_config`; the older top-level key still works
    there with a deprecation warning, so both are checked.
    """
    if not isinstance(additional, Mapping):
        return None
    sched = additional.get("scheduler_config")
    nested = sched.get(ASCEND_PROFILING_KEY) if isinstance(sched, Mapping) else None
    if isinstance(nested, Mapping) and _truthy(nested.get("enabled")):
        return f"scheduler_config.{ASCEND_PROFILING_KEY}"
    top = additional.get(ASCEND_PROFILING_KEY)
    if isinstance(top, Mapping) and _truthy(top.get("enabled")):
        return ASCEND_PROFILING_KEY
    return None


# ----- scheduler surfaces -------------------------------------------------------------------


@contextlib.contextmanager
def step_limits(scheduler: Any, token_budget: int, prefill_cap: int) -> Iterator[None]:
    """Set this step's token budget and per-request prefill cap around one schedule() call.

    vLLM's schedule() starts from `self.max_num_scheduled_tokens` and caps each prefill at
    `scheduler_config.long_prefill_token_threshold`; both are read per call, so setting them
    for the duration of the call steers it without copying it. The adaptive floor (newer vLLM)
    would raise our cap, so it is off for the call. Everything is restored afterwards.
    """
    sched_cfg = scheduler.scheduler_config
    old_budget = scheduler.max_num_scheduled_tokens
    old_cap = sched_cfg.long_prefill_token_threshold
    has_adaptive = hasattr(scheduler, "adaptive_long_prefill_threshold")
    old_adaptive = scheduler.adaptive_long_prefill_threshold if has_adaptive else None
    scheduler.max_num_scheduled_tokens = int(token_budget)
    if prefill_cap > 0:
        # object.__setattr__: pydantic dataclasses may validate assignment in some releases.
        object.__setattr__(sched_cfg, "long_prefill_token_threshold", int(prefill_cap))
        if has_adaptive:
            scheduler.adaptive_long_prefill_threshold = False
    try:
        yield
    finally:
        scheduler.max_num_scheduled_tokens = old_budget
        object.__setattr__(sched_cfg, "long_prefill_token_threshold", old_cap)
        if has_adaptive:
            scheduler.adaptive_long_prefill_threshold = old_adaptive


def request_progress(request: Any) -> tuple[int, int, bool]:
    """(history, tokens it still needs, is prefill) as vLLM's scheduler will see it."""
    computed = int(request.num_computed_tokens)
    placeholders = int(getattr(request, "num_output_placeholders", 0) or 0)
    with_spec = getattr(request, "num_tokens_with_spec", None)
    total = int(with_spec if with_spec is not None else request.num_tokens)
    remaining = total + placeholders - computed
    is_prefill = computed < int(request.num_prompt_tokens)
    return computed, max(remaining, 0), is_prefill


def waiting_requests(scheduler: Any, limit: int) -> list[Any]:
    """The first `limit` waiting requests in the order schedule() admits them."""
    out: list[Any] = []
    if limit <= 0:
        return out
    queues = [getattr(scheduler, "kv_holding_waiting", None), getattr(scheduler, "waiting", None)]
    for queue in queues:
        if not queue:
            continue
        try:
            ordered = sorted(queue) if _is_priority_queue(queue) else list(queue)
        except TypeError:
            ordered = list(queue)
        for req in ordered:
            out.append(req)
            if len(out) >= limit:
                return out
    return out


def _is_priority_queue(queue: Any) -> bool:
    return type(queue).__name__ == "PriorityRequestQueue"


# ----- worker surfaces ----------------------------------------------------------------------


def device_synchronize_fn() -> tuple[str, Any]:
    """(name, zero-argument sync function) for this process's accelerator.

    On the CPU a forward returns when it is done, so there is nothing to wait for. On NPUs the
    sync comes from torch_npu (it registers `torch.npu`); on CUDA/ROCm from torch.cuda.
    """
    device_type = ""
    try:
        from vllm.platforms import current_platform

        device_type = str(getattr(current_platform, "device_type", "") or "")
    except Exception:
        pass
    if device_type in ("", "cpu"):
        return "none", _no_sync
    try:
        import torch
    except Exception:
        return "none", _no_sync
    module = getattr(torch, device_type, None)
    sync = getattr(module, "synchronize", None)
    if sync is None:
        return "none", _no_sync
    return f"torch.{device_type}.synchronize", sync


def _no_sync() -> None:
    return None


def dummy_run_params(runner: Any) -> set[str]:
    try:
        return set(inspect.signature(runner._dummy_run).parameters)
    except (TypeError, ValueError, AttributeError):
        return set()


def one_request_dummy_run(runner: Any) -> tuple[str, Any]:
    """(how, run(num_tokens)) that times ONE request of num_tokens with attention computed.

    vllm-ascend's runner takes `profile_cpp=True` for exactly this. vLLM's generic
    `_dummy_run` spreads the tokens over up to `max_num_seqs` requests, so there we lower
    `max_num_seqs` to 1 for the duration of the call (it is read per call).
    """
    params = dummy_run_params(runner)
    if "profile_cpp" in params:
        kwargs = {"force_attention": True, "profile_cpp": True}
        if "is_profile" in params:
            kwargs["is_profile"] = True
        return "profile_cpp", lambda n: runner._dummy_run(n, **kwargs)
    kwargs = {}
    if "force_attention" in params:
        kwargs["force_attention"] = True
    if "is_profile" in params:
        kwargs["is_profile"] = True
    how = "max_num_seqs=1" + (", force_attention" if "force_attention" in kwargs else "")

    def run(n: int) -> Any:
        with _one_seq(runner):
            return runner._dummy_run(n, **kwargs)

    return how, run


@contextlib.contextmanager
def _one_seq(runner: Any) -> Iterator[None]:
    cfg = runner.scheduler_config
    old = cfg.max_num_seqs
    object.__setattr__(cfg, "max_num_seqs", 1)
    try:
        yield
    finally:
        object.__setattr__(cfg, "max_num_seqs", old)


def wait_for_pipeline_input(intermediate_tensors: Any) -> None:
    """Finish receiving the previous stage's activations, so a timer started after this
    measures this stage's forward and not the wait behind the stage before it."""
    wait = getattr(intermediate_tensors, "wait_for_comm", None)
    if callable(wait):
        wait()


def attach_step_ms(output: Any, step_ms: float) -> Any:
    """Put the measured forward time on a ModelRunnerOutput; return the object to send.

    vLLM returns one shared EMPTY_MODEL_RUNNER_OUTPUT for empty steps; it is copied rather than
    changed, so the timing of one step never leaks into another.
    """
    if output is None or not hasattr(output, "req_ids"):
        return output
    try:
        from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT

        if output is EMPTY_MODEL_RUNNER_OUTPUT:
            import copy

            output = copy.copy(output)
    except Exception:
        pass
    setattr(output, STEP_MS_ATTR, float(step_ms))
    return output


def read_step_ms(model_runner_output: Any) -> float | None:
    value = getattr(model_runner_output, STEP_MS_ATTR, None)
    return float(value) if value is not None else None


def is_last_pp_rank() -> bool:
    try:
        from vllm.distributed import get_pp_group

        return bool(get_pp_group().is_last_rank)
    except Exception:
        return True


def worker_ranks() -> dict[str, int]:
    out = {"pp_rank": 0, "tp_rank": 0}
    try:
        from vllm.distributed import get_pp_group, get_tp_group

        out["pp_rank"] = int(get_pp_group().rank_in_group)
        out["tp_rank"] = int(get_tp_group().rank_in_group)
    except Exception:
        pass
    return out


def platform_name() -> str:
    try:
        from vllm.platforms import current_platform

        return str(getattr(current_platform, "device_name", "") or current_platform.device_type)
    except Exception:
        return "unknown"
