"""Every vLLM / vllm-ascend version difference and every name we put on their objects.

Nothing here imports vllm, torch, torch_npu or vllm_ascend at module import time, so
`import vllm_ascend_cpp` works where they are absent. Functions that need them import lazily
and say what they fall back to.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import inspect
import itertools
import operator
import sys
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
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
# On SchedulerOutput: the step's number (an int >= 1) when the workers should time it.
TIME_STEP_ATTR = "cpp_time_step"
STEP_MS_ATTR = "cpp_step_ms"  # on ModelRunnerOutput: measured forward ms of the last stage

# Worker methods reached through collective_rpc (added by the worker extension class).
WORKER_PREPARE = "cpp_prepare_worker"
WORKER_SWEEP = "cpp_profile_sweep"
WORKER_STAGE_TIMES = "cpp_stage_times"

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


def loaded_vllm_version() -> tuple[int, ...] | None:
    """The version of the vLLM this process has already imported, without importing it.

    Scheduler-side helpers run inside vLLM (so it is loaded) and in unit tests on fakes
    (where importing vLLM would cost seconds); None means "not loaded: assume the newest".
    """
    module = sys.modules.get("vllm")
    text = getattr(module, "__version__", None) if module is not None else None
    return _parsed_version(text) if isinstance(text, str) else None


@functools.lru_cache(maxsize=8)
def _parsed_version(text: str) -> tuple[int, ...]:
    # Asked on every step (admission_slots); the string never changes within a process.
    return parse_version(text)


def parse_version(text: str) -> tuple[int, ...]:
    """(0, 25, 1) for "0.25.1rc1" or "0.32.0+cpu": the leading digits of each dotted part,
    stopping at the first part that is not purely numeric (a pre-release or dev suffix)."""
    parts: list[int] = []
    for piece in text.split("+")[0].split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if digits != piece:
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


def _env_flag(value: str | None) -> bool:
    """vllm-ascend parses its flags with bool(int(value)), so "2" is on; words are accepted
    too, because refusing to start is the safe reading of an odd value here."""
    if value is None:
        return False
    try:
        return bool(int(value.strip()))
    except ValueError:
        return _truthy(value)


# ----- vllm-ascend's own switches -------------------------------------------------------------
#
# How each vllm-ascend release reads the switches that must not be on beside CPP
# (tools/ascend_surfaces.py reads these facts from every release's sources):
# - 0.23-0.26: plain Python. `_get_config_value` returns the raw value and sub-configs call
#   bool(...) on `enabled`, so any non-empty string, "false" included, is on.
# - 0.27 and later: pydantic fields with lax bool parsing ("false", "0", "off", "no" are off)
#   and `extra="forbid"` (see patch/engine_args.py for why cpp_config never reaches it).
# - Where: 0.23/0.24 read top-level keys only; from 0.25 `scheduler_config.<key>` wins when
#   present, else the deprecated top-level key. DyntraLB is read from scheduler_config only.
# - The balance env var VLLM_ASCEND_BALANCE_SCHEDULING is the fallback up to 0.26, removed in 0.27.
# When the installed release is unknown (vllm-ascend absent, as on the test bed), a switch
# counts as on if ANY release would read it as on.

ASCEND_PYDANTIC_FROM = (0, 27)
ASCEND_NESTED_FROM = (0, 25)
_LAX_TRUE = ("1", "on", "t", "true", "y", "yes")


def ascend_version() -> tuple[int, ...] | None:
    """The installed vllm-ascend release, from its distribution metadata (never imported)."""
    from importlib import metadata

    for name in ("vllm-ascend", "vllm_ascend"):
        try:
            return parse_version(metadata.version(name))
        except metadata.PackageNotFoundError:
            continue
        except Exception:
            return None
    return None


def ascend_switch_on(value: Any, version: tuple[int, ...] | None) -> bool:
    """Whether `value` turns a vllm-ascend switch on, read as `version` reads it."""
    plain = bool(value)
    if isinstance(value, str):
        lax = value.strip().lower() in _LAX_TRUE
    elif isinstance(value, (bool, int, float)):
        lax = value == 1
    else:
        lax = False
    if version is None:
        return plain or lax
    return lax if version[:2] >= ASCEND_PYDANTIC_FROM else plain


def _ascend_scheduler_section(additional: Any) -> Mapping[str, Any]:
    sched = additional.get("scheduler_config") if isinstance(additional, Mapping) else None
    return sched if isinstance(sched, Mapping) else {}


def _ascend_places(additional: Any, key: str, version: tuple[int, ...] | None,
                   nested_only: bool = False) -> list[tuple[str, Any]]:
    """(where, value) of `key` in the places `version` reads it, the one that wins first."""
    top = additional if isinstance(additional, Mapping) else {}
    nested = _ascend_scheduler_section(additional)
    places: list[tuple[str, Any]] = []
    if (version is None or version[:2] >= ASCEND_NESTED_FROM) and key in nested:
        places.append((f"additional_config.scheduler_config.{key}", nested[key]))
        if version is not None:
            return places  # a nested key hides the deprecated top-level one
    if not nested_only and key in top:
        places.append((f"additional_config.{key}", top[key]))
    return places


def _ascend_flag(additional: Any, key: str, version: tuple[int, ...] | None) -> str | None:
    for where, value in _ascend_places(additional, key, version):
        if ascend_switch_on(value, version):
            return f"{where} = {_shown(value, version)}"
    return None


def _shown(value: Any, version: tuple[int, ...] | None) -> str:
    if not isinstance(value, str):
        return "true"
    if value.strip().lower() in _LAX_TRUE:
        return repr(value)
    return (f"{value!r} (a string: vllm-ascend 0.23-0.26 read any non-empty string as on; "
            "write JSON false to turn it off)")


def _ascend_section_enabled(additional: Any, key: str, version: tuple[int, ...] | None,
                            nested_only: bool = False) -> str | None:
    for where, value in _ascend_places(additional, key, version, nested_only):
        if isinstance(value, Mapping) and ascend_switch_on(value.get("enabled", False), version):
            return f"{where}.enabled = {_shown(value.get('enabled'), version)}"
    return None


def ascend_balance_scheduling(
    additional: Mapping[str, Any], environ: Mapping[str, str],
    version: tuple[int, ...] | None = None,
) -> str | None:
    """Describe vllm-ascend's balance scheduling switch when it is on, else None: the key
    (see the release rules above) or, up to 0.26 and only where no key is given, the env var."""
    found = _ascend_flag(additional, "enable_balance_scheduling", version)
    if found is not None:
        return found
    env_read = version is None or version[:2] < ASCEND_PYDANTIC_FROM
    if env_read and not _ascend_places(additional, "enable_balance_scheduling", version) \
            and _env_flag(environ.get(ASCEND_BALANCE_ENV)):
        return f"{ASCEND_BALANCE_ENV}={environ.get(ASCEND_BALANCE_ENV)}"
    return None


def ascend_profiling_chunk_enabled(
    additional: Mapping[str, Any], version: tuple[int, ...] | None = None,
) -> str | None:
    """Where vllm-ascend's own profiling chunk (its CPP) is enabled, else None."""
    found = _ascend_section_enabled(additional, ASCEND_PROFILING_KEY, version)
    return found.removeprefix("additional_config.") if found else None


# vllm-ascend scheduler features that replace or reorder the scheduler CPP steers:
# (key, how it is read, what it is, why CPP cannot run beside it).
_REORDERS_QUEUE = ("reorders the waiting queue (short prompts first, aged long ones promoted, "
                   "queues pinned), so CPP's plan of each step would walk a different order "
                   "than the scheduler admits")
_OWN_SCHEDULER = "installs its own scheduler class (scheduler_cls), which CPP would replace"
ASCEND_SCHEDULER_FEATURES: tuple[tuple[str, str, str, str], ...] = (
    ("short_request_first_config", "section", "short-request-first scheduling", _REORDERS_QUEUE),
    ("batch_job_sched_config", "section", "batch-job-aware scheduling", _OWN_SCHEDULER),
    ("dyntra_lb_config", "nested section", "DyntraLB load balancing", _OWN_SCHEDULER),
    ("recompute_scheduler_enable", "flag", "the recompute scheduler (PD decode nodes)",
     _OWN_SCHEDULER),
    ("SLO_limits_for_dynamic_batch", "number", "dynamic batch (0.23)", _OWN_SCHEDULER),
)

# scheduler_cls values vllm-ascend's platform sets, by module, and the key that made it.
ASCEND_SCHEDULER_MODULES: dict[str, str] = {
    "vllm_ascend.core.scheduler_dynamic_batch": "additional_config.SLO_limits_for_dynamic_batch",
    "vllm_ascend.core.scheduler_profiling_chunk":
        "additional_config.scheduler_config.profiling_chunk_config.enabled",
    "vllm_ascend.core.recompute_scheduler":
        "additional_config.scheduler_config.recompute_scheduler_enable",
    "vllm_ascend.core.batch_job_aware_scheduler":
        "additional_config.scheduler_config.batch_job_sched_config.enabled",
    "vllm_ascend.core.dyntra_lb_scheduler":
        "additional_config.scheduler_config.dyntra_lb_config.enabled",
    "vllm_ascend.core.short_request_first_scheduler":
        "additional_config.scheduler_config.short_request_first_config.enabled",
}


def ascend_scheduler_feature(
    additional: Mapping[str, Any], version: tuple[int, ...] | None = None,
) -> tuple[str, str, str] | None:
    """(where it is switched on, what it is, why it conflicts) for the first vllm-ascend
    scheduler feature that is on, else None."""
    for key, kind, what, why in ASCEND_SCHEDULER_FEATURES:
        if kind == "section":
            where = _ascend_section_enabled(additional, key, version)
        elif kind == "nested section":
            where = _ascend_section_enabled(additional, key, version, nested_only=True)
        elif kind == "flag":
            where = _ascend_flag(additional, key, version)
        else:
            top = additional if isinstance(additional, Mapping) else {}
            value = top.get(key, -1)
            bad = (version is None or version[:2] < (0, 24)) and value not in (-1, None)
            where = f"additional_config.{key} = {value!r}" if bad else None
        if where is not None:
            return where, what, why
    return None


def ascend_scheduler_cls_origin(name: str) -> str | None:
    """The vllm-ascend key that makes its platform set scheduler_cls = name, or None."""
    module = name.rsplit(".", 1)[0]
    return ASCEND_SCHEDULER_MODULES.get(module)


# ----- scheduler surfaces -------------------------------------------------------------------
#
# What differs between the vLLM releases checked by tools/check_vllm_compat.py (0.23 .. 0.32):
# - schedule() takes `throttle_prefills` from 0.25 on: our subclass passes *args/**kwargs.
# - the waiting queues: `waiting` + `skipped_waiting` up to 0.30; `kv_holding_waiting` +
#   `waiting` (+ the `deferred_waiting` tag set) in 0.32: see waiting_requests().
# - the admission limit: `max_num_running_reqs` up to 0.30, `max_num_active_reqs` in 0.32,
#   and paused streaming sessions count against it from 0.25: see admission_slots().
# - the long-prefill cap: read from scheduler_config inside both loops up to 0.30; read once
#   at the top of schedule() in 0.32, only when more than one request is eligible, and floored
#   by `input_budget // num_eligible` when `long_prefill_token_threshold_adaptive` is on: see
#   step_limits().
# - 0.30 adds `input_budget` (scheduler_config.max_num_batched_tokens), a second cap beside
#   `token_budget`; lowering `max_num_scheduled_tokens` still lowers the step, which is all
#   step_limits() does (it never raises the budget above vLLM's own).
# - SchedulerConfig fields come and go (`max_num_partial_prefills` up to 0.27,
#   `max_num_active_seqs` and `long_prefill_token_threshold_adaptive` in 0.32): every read of
#   an optional field goes through getattr with vLLM's default.

SCHEDULER_CONFIG_DEFAULTS: dict[str, Any] = {
    "long_prefill_token_threshold": 0,
    "long_prefill_token_threshold_adaptive": False,
    "max_num_scheduled_tokens": None,
    "max_num_active_seqs": None,
    "max_num_partial_prefills": 1,
    "async_scheduling": False,
    "policy": "fcfs",
}


def scheduler_config_value(scheduler_config: Any, name: str) -> Any:
    """A SchedulerConfig field that not every vLLM release has, with that release's default."""
    return getattr(scheduler_config, name, SCHEDULER_CONFIG_DEFAULTS.get(name))


def operator_prefill_cap(scheduler: Any) -> int:
    """The per-request token cap vLLM's own `schedule()` applies this step (0 = none).

    It comes from the operator's `long_prefill_token_threshold` and applies to every request
    the walk reaches, prefill or not. 0.32 (the shape with `kv_holding_waiting`) reads it once
    at the top of schedule(), drops it when at most one request is eligible (running +
    waiting, `get_request_counts()`), and with `long_prefill_token_threshold_adaptive` floors
    it at `max_num_batched_tokens // eligible`. Earlier releases apply it as configured.
    """
    sched_cfg = getattr(scheduler, "scheduler_config", None)
    cap = int(scheduler_config_value(sched_cfg, "long_prefill_token_threshold") or 0)
    if cap <= 0 or not hasattr(scheduler, "kv_holding_waiting"):
        return max(cap, 0)
    counts = getattr(scheduler, "get_request_counts", None)
    if callable(counts):
        running, waiting = counts()
    else:
        running = len(scheduler.running)
        waiting = len(scheduler.waiting) + len(scheduler.kv_holding_waiting)
    eligible = int(running) + int(waiting)
    if eligible <= 1:
        return 0
    if getattr(scheduler, "adaptive_long_prefill_threshold", False):
        cap = max(cap, int(sched_cfg.max_num_batched_tokens) // eligible)
    return cap


def step_token_limit(scheduler: Any) -> int:
    """The most tokens vLLM's own `schedule()` puts in one step (no speculative decoding).

    `max_num_scheduled_tokens` everywhere; from 0.30 on schedule() also stops at its
    `input_budget` (scheduler_config.max_num_batched_tokens), the smaller of the two wins.
    """
    limit = int(scheduler.max_num_scheduled_tokens)
    version = loaded_vllm_version()
    if version is None or version[:2] >= (0, 30):
        inputs = getattr(getattr(scheduler, "scheduler_config", None),
                         "max_num_batched_tokens", None)
        if inputs is not None:
            limit = min(limit, int(inputs))
    return limit


def combined_cap(ours: int, operator: int) -> int:
    """The smaller of two per-request caps, where 0 means "no cap"."""
    if ours <= 0:
        return max(operator, 0)
    if operator <= 0:
        return ours
    return min(ours, operator)


@contextlib.contextmanager
def step_limits(scheduler: Any, token_budget: int, prefill_cap: int) -> Iterator[None]:
    """Set this step's token budget and per-request prefill cap around one schedule() call.

    vLLM's schedule() starts from `self.max_num_scheduled_tokens` and caps each request at
    `scheduler_config.long_prefill_token_threshold`; both are read during the call (0.32 reads
    the cap once at its top, earlier releases in each loop), so setting them for the duration
    of the call steers it without copying it. Neither limit is ever raised above the
    operator's: the budget is at most vLLM's own, and our cap is combined with the cap vLLM
    would apply this step (`operator_prefill_cap`) by taking the smaller. With our cap 0 the
    operator's setting is left as it is. 0.32 ignores the cap when only one request is
    eligible; the plan's budget is then that request's chunk, so the step is the same. The
    adaptive floor (0.32) would raise our cap, so it is off for the call (the operator's
    floored cap is already folded in). Everything is restored afterwards, also when
    schedule() raises.
    """
    sched_cfg = scheduler.scheduler_config
    old_budget = scheduler.max_num_scheduled_tokens
    old_cap = scheduler_config_value(sched_cfg, "long_prefill_token_threshold")
    has_adaptive = hasattr(scheduler, "adaptive_long_prefill_threshold")
    old_adaptive = scheduler.adaptive_long_prefill_threshold if has_adaptive else None
    # Every change is made inside the try: if one of them fails (a bad value, a renamed
    # field), the ones already made are undone before the error leaves, so vLLM's own
    # limits are intact for the step the caller then runs without us.
    try:
        cap = (combined_cap(int(prefill_cap), operator_prefill_cap(scheduler))
               if prefill_cap > 0 else 0)
        scheduler.max_num_scheduled_tokens = min(int(token_budget), int(old_budget))
        if cap > 0:
            # object.__setattr__: pydantic dataclasses may validate assignment in some
            # releases.
            object.__setattr__(sched_cfg, "long_prefill_token_threshold", cap)
            if has_adaptive:
                scheduler.adaptive_long_prefill_threshold = False
        yield
    finally:
        scheduler.max_num_scheduled_tokens = old_budget
        object.__setattr__(sched_cfg, "long_prefill_token_threshold", old_cap)
        if has_adaptive:
            scheduler.adaptive_long_prefill_threshold = old_adaptive


def request_progress(request: Any) -> tuple[int, int, bool]:
    """(history, tokens it still needs, is prefill) as vLLM's scheduler will see it.

    "Prefill" is every request that still has more than its next token to compute: the
    prompt, and also the output tokens a preempted request replays after it is resumed (vLLM
    chunks and caps both alike).
    """
    computed = int(request.num_computed_tokens)
    placeholders = int(getattr(request, "num_output_placeholders", 0) or 0)
    with_spec = getattr(request, "num_tokens_with_spec", None)
    total = int(with_spec if with_spec is not None else request.num_tokens)
    remaining = total + placeholders - computed
    prefill_end = max(int(request.num_prompt_tokens), int(request.num_tokens) - 1)
    return computed, max(remaining, 0), computed < prefill_end


def work_item(request: Any) -> tuple[str, int, int, bool] | None:
    """(req_id, history, tokens it still needs, is prefill) of one request, None when it needs
    nothing. The attributes are read directly (every supported vLLM has them, see
    docs/_generated/vllm_compat_table.md), `request_progress` is the fallback for objects that
    lack one."""
    try:
        computed = request.num_computed_tokens
        need = request.num_tokens_with_spec + request.num_output_placeholders - computed
        if need <= 0:
            return None
        prompt = request.num_prompt_tokens
        end = request.num_tokens - 1
        return (request.request_id, computed, need,
                computed < (end if end > prompt else prompt))
    except AttributeError:
        history, need, is_prefill = request_progress(request)
        return (request.request_id, history, need, is_prefill) if need > 0 else None


def pending_work(requests: Any) -> list[tuple[str, int, int, bool]]:
    """`work_item` of each request that needs any.

    For running requests use `running_work`, which also drops those schedule() will skip.
    """
    return [item for item in map(work_item, requests) if item is not None]


def whole_prefills(requests: list[Any]) -> bool:
    """Whether every request is a prompt with nothing computed yet and no output to replay:
    each then needs tokens and is a prefill from history 0 (`work_item` gives
    `(id, 0, n > 0, True)`), and stays a prefill after any prefix-cache hit (vLLM recomputes
    the last prompt token). A preempted request that kept output tokens is not one: a hit may
    cover its prompt and leave it a decode. A few attribute reads a request, for queues too
    long to build items for.

    Outputs are seen through the request's output list (`_output_token_ids`, a plain list
    in every release we read) because `num_tokens` is a Python property: reading it for 256
    requests costs more than the rest of this check. Where the list is missing, `num_tokens`
    against `num_prompt_tokens` says the same."""
    try:
        return _whole_prompts(requests)
    except AttributeError:
        pass
    if any(map(_COMPUTED, requests)) or not all(map(_PROMPT_TOKENS, requests)):
        return False
    return not any(map(operator.ne, map(_TOKENS, requests), map(_PROMPT_TOKENS, requests)))


def _whole_prompts(requests: list[Any]) -> bool:
    # A plain loop, not `map(attrgetter)`: on CPython 3.11 the loop's attribute reads are
    # specialised (inline caches), attrgetter's are not, and this runs over hundreds of
    # requests every step (measured: about half the time of four attrgetter passes).
    for r in requests:
        if r.num_computed_tokens or r._output_token_ids or not r.num_prompt_tokens:
            return False
    return True


_COMPUTED = operator.attrgetter("num_computed_tokens")
_PROMPT_TOKENS = operator.attrgetter("num_prompt_tokens")
_TOKENS = operator.attrgetter("num_tokens")


def running_work(scheduler: Any) -> list[tuple[str, int, int, bool]]:
    """`pending_work` of the running requests, less those vLLM's running loop will skip.

    Besides requests that need nothing (a prefill's last chunk or a decode still in flight
    under synchronous scheduling), schedule() skips, in every release we support:
    - async scheduling, a request whose tokens in flight already reach its `max_tokens`
      (`num_output_placeholders > 0` and `num_computed_tokens + 2 - placeholders >=
      num_prompt_tokens + max_tokens`);
    - a request at the model length: its tokens are capped at `max_model_len -
      num_computed_tokens - 1` (with async scheduling the in-flight token can reach it);
    and in 0.32, with the V2 model runner under PP and async scheduling, a decode before its
    `next_decode_eligible_step` (schedule() first advances `current_step`, so the step it
    compares is `current_step + 1`).
    """
    max_len = int(getattr(scheduler, "max_model_len", 0) or 0) or (1 << 62)
    sampled = int(getattr(scheduler, "num_sampled_tokens_per_step", 1))
    step = getattr(scheduler, "current_step", None)
    next_step = None if step is None else int(step) + 1
    out: list[tuple[str, int, int, bool]] = []
    append = out.append
    try:
        # The hot path (hundreds of running decodes): attributes read directly.
        for r in scheduler.running:
            computed = r.num_computed_tokens
            placeholders = r.num_output_placeholders
            need = r.num_tokens_with_spec + placeholders - computed
            if need <= 0:
                continue
            prompt = r.num_prompt_tokens
            if placeholders and computed + 2 - placeholders >= prompt + r.max_tokens:
                continue
            if next_step is not None and next_step < r.next_decode_eligible_step:
                continue
            room = max_len - computed - sampled
            if room <= 0:
                continue
            end = r.num_tokens - 1
            append((r.request_id, computed, need if need <= room else room,
                    computed < (end if end > prompt else prompt)))
        return out
    except AttributeError:
        pass
    out = []
    for r in scheduler.running:
        computed, need, is_prefill = request_progress(r)
        if need <= 0:
            continue
        placeholders = getattr(r, "num_output_placeholders", 0) or 0
        if placeholders > 0 and (computed + 2 - placeholders
                                 >= r.num_prompt_tokens + getattr(r, "max_tokens", max_len)):
            continue
        if next_step is not None and next_step < getattr(r, "next_decode_eligible_step", 0):
            continue
        room = max_len - computed - sampled
        if room > 0:
            out.append((r.request_id, computed, min(need, room), is_prefill))
    return out


def prefix_cache_lookup(scheduler: Any) -> Callable[[Any], int] | None:
    """A function giving the prefix a waiting request will find in the local prefix cache, in
    tokens, exactly as vLLM's schedule() will count it; None when there is nothing to find
    (prefix caching off) or this vLLM has no surface we know.

    Why it asks the coordinator (`kv_cache_manager.coordinator.find_longest_cache_hit`) and
    not `KVCacheManager.get_computed_blocks` (as read in vLLM 0.32):
    - the coordinator's lookup only reads: each single-type manager walks the request's block
      hashes through `BlockPool.get_cached_block`, a dict lookup. It never calls
      `BlockPool.touch` (the call that raises reference counts and takes blocks off the free
      queue, i.e. changes eviction order) nor the metrics collector; the block lists it
      returns are new lists it alone holds.
    - prefix-cache hit statistics are recorded by schedule() itself
      (`record_prefix_cache_stats` in 0.32; older releases counted them inside
      `get_computed_blocks`), never by the coordinator.
    - `get_computed_blocks` may emit `BlockStored` KV events for the hit (0.32, when KV events
      are on and the request's `kv_cache_report_mode` is "full"): asking it would announce a
      hit twice. The coordinator emits nothing.
    vLLM's own rules are kept by calling the same coordinator with the same limit: the last
    prompt token is always recomputed (limit `num_tokens - 1`); EAGLE/MTP drop the last matched
    block, hybrid models reconcile their groups, DCP/PCP widen the block, all inside the
    coordinator. A request that opts out of reading the cache (`skip_reading_prefix_cache`:
    prompt logprobs, all-token pooling) finds nothing. A hit no longer than a sliding-window
    replay window (0.32, DSV4-style SWA replay) is dropped and a longer one rewound by it, as
    schedule() does.
    KV-connector hits (`connector.get_num_new_matched_tokens`) are not seen: connectors may
    start a remote lookup or reserve a transfer when asked, so asking before schedule() is
    not free of side effects; such a request is planned at its local hit.

    In the plain layout of `_plain_block_table` (the common dense model) the answer is found
    by bisection over the request's block hashes, reading the same `get_cached_block` dict:
    about log2(blocks) reads where the coordinator reads every cached block (a 512-block hit
    costs it some 400 us, and schedule() makes that walk again when it admits the request).
    Bisection is exact because in that layout a chain's cached blocks always form a run from
    its start: a block is cached only with every block before it (the hash covers them, and
    they were allocated together), vLLM frees a request's blocks tail first, and a request
    that holds or touches block i holds blocks 0..i too, so block i never reaches the free
    queue's head before block i + 1 (the probe below relies on the same, and vLLM's own walk
    stops at the first missing block for the same reason).
    """
    manager = getattr(scheduler, "kv_cache_manager", None)
    coordinator = getattr(manager, "coordinator", None)
    find = getattr(coordinator, "find_longest_cache_hit", None)
    if manager is None or find is None or not getattr(manager, "enable_caching", False):
        return None
    enabled = getattr(manager, "prefix_cache_lookup_enabled", None)
    replay = int(getattr(scheduler, "prefix_replay_tokens", 0) or 0)
    plain = _plain_block_table(scheduler)

    def opted_out(request: Any) -> bool:
        if enabled is not None:
            return not enabled(request)
        return bool(getattr(request, "skip_reading_prefix_cache", False))

    if plain is not None:
        key, present, block = plain

        def bisect(request: Any) -> int:
            if opted_out(request):
                return 0
            hashes = request.block_hashes
            # The last prompt token is always recomputed: at most (num_tokens - 1) // block.
            lo, hi = 0, min((int(request.num_tokens) - 1) // block, len(hashes))
            while lo < hi:  # blocks [0, lo) cached, blocks [hi, ...) not
                mid = (lo + hi) // 2
                if present(key(hashes[mid])):
                    lo = mid + 1
                else:
                    hi = mid
            return lo * block

        return bisect

    def lookup(request: Any) -> int:
        if opted_out(request):
            return 0
        # 0.32 returns (blocks, hit, uncached shared prefix); older releases (blocks, hit).
        hit = int(find(request.block_hashes, int(request.num_tokens) - 1)[1])
        if replay:
            hit = 0 if hit <= replay else hit - replay
        return hit

    return lookup


def prefix_cache_probe(scheduler: Any) -> Callable[[Any, int], Callable[[], bool]] | None:
    """A function that, given a request and the prefix its lookup found, makes a check that
    the answer still holds, in at most two hash-table reads per call; None where no such
    check is known (then the earlier answer is kept until the request is scheduled).

    Only for the plain layout of `_plain_block_table` (the common dense model), where vLLM's
    hit is a run of whole cached blocks from the start: the answer is stale when the run's
    last block left the cache (evicted) or the block after it arrived (another request cached
    more of a shared prefix). vLLM frees a request's blocks tail first, so eviction shortens
    a run from its end. `BlockPool.get_cached_block` only reads, as in `prefix_cache_lookup`.
    The two blocks' table keys are made once, when the check is made: the check runs every
    step for every waiting request within reach, the lookup once.
    """
    layout = _plain_block_table(scheduler)
    if layout is None:
        return None
    key, present, block = layout

    def watch(request: Any, hit: int) -> Callable[[], bool]:
        n = hit // block
        hashes = request.block_hashes
        limit = min((int(request.num_tokens) - 1) // block, len(hashes))
        last = key(hashes[n - 1]) if n else None
        after = key(hashes[n]) if n < limit else None

        def still() -> bool:
            return (last is None or present(last)) and (after is None or not present(after))

        return still

    return watch


def _plain_block_table(scheduler: Any) -> tuple[Callable[[Any], Any], Callable[[Any], bool],
                                                int] | None:
    """(a block hash's key in the cached-block table, is a key there, block size) for a model
    with one full-attention KV cache group, no EAGLE/MTP drop, no context parallelism and no
    replay window (the common dense model), where vLLM's prefix hit is a run of whole cached
    blocks from the start; None otherwise."""
    manager = getattr(scheduler, "kv_cache_manager", None)
    coordinator = getattr(manager, "coordinator", None)
    if type(coordinator).__name__ != "UnitaryKVCacheCoordinator":
        return None
    managers = getattr(coordinator, "single_type_managers", ())
    if len(managers) != 1 or type(managers[0]).__name__ != "FullAttentionManager":
        return None
    if getattr(coordinator, "eagle_group_ids", None) or getattr(scheduler,
                                                                "prefix_replay_tokens", 0):
        return None
    pool = coordinator.block_pool
    block = int(coordinator.block_size)
    if int(getattr(pool, "hash_block_size", block)) != block:
        return None
    fast = _cached_block_table(pool)
    if fast is not None:
        return (*fast, block)
    get = pool.get_cached_block
    group = [0]

    def cached(block_hash: Any) -> bool:
        return get(block_hash, group) is not None

    return _same, cached, block


def _same(value: Any) -> Any:
    return value


def _cached_block_table(pool: Any) -> tuple[Callable[[Any], Any],
                                            Callable[[Any], bool]] | None:
    """`pool.get_cached_block(h, [0]) is not None` as one dict membership test of the key
    of `h` (key, then test), or None where the table is not the one read in 0.32.

    The planner asks this for every waiting request within reach, every step (the probe of
    kept answers), and `get_cached_block` builds a key and a list per call. In 0.32 the table
    (`BlockPool.cached_block_hash_to_block`, a `BlockHashToBlockMap`) keeps a plain dict
    `_cache` keyed by `make_block_hash_with_group_id(h, group)`, the hash bytes followed by the
    group id in 4 big-endian bytes, and drops a key when its last block goes, so a key is
    present exactly when `get_one_block` finds a block. Both facts are checked here before
    the table is trusted; otherwise vLLM's own call is used. The table is read from the pool
    at every call: `reset_prefix_cache` replaces it with a new one."""
    table = getattr(getattr(pool, "cached_block_hash_to_block", None), "_cache", None)
    if type(table) is not dict:
        return None
    try:
        from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id
    except ImportError:
        return None
    suffix = (0).to_bytes(4, "big")
    try:
        if make_block_hash_with_group_id(b"probe", 0) != b"probe" + suffix:
            return None
    except Exception:  # noqa: BLE001 - another key layout: use vLLM's call
        return None

    def key(block_hash: Any) -> Any:
        return block_hash + suffix

    def present(block_key: Any) -> bool:
        return block_key in pool.cached_block_hash_to_block._cache

    return key, present


# (request, hit, tokens) of a prefill chunk of a step, in the order vLLM's walk takes it: hit
# is the history before the step (a waiting request's own lookup), tokens those planned.
ScheduledChunk = tuple[Any, int, int]


def prefix_cache_in_step(scheduler: Any) -> Callable[[Sequence[ScheduledChunk]],
                                                     dict[int, int]] | None:
    """A function that, given a step's prefill chunks in walk order, finds the waiting
    requests among them (nothing computed yet) that will find a longer prefix than their
    chunk's history once the chunks before them have cached their blocks: {position in the
    sequence: that prefix in tokens}. None where the layout is not the plain one of
    `prefix_cache_probe`.

    vLLM caches a request's full blocks when it allocates them (`allocate_slots` caches up to
    `num_computed_tokens + num_new_tokens`, as read in 0.32), before the walk reaches the next
    waiting request, whose own lookup then finds them: two requests that share a system prompt
    and are admitted in one step compute it once. The hashes are chained (a block's hash covers
    every token before it), so block i of one request equals block i of another exactly when
    their first (i + 1) blocks match. Blocks evicted in the same step (the pool is short and an
    earlier request's new blocks take them) are not foreseen.
    """
    layout = _plain_block_table(scheduler)
    if layout is None:
        return None
    key, present, block = layout

    def cached(block_hash: Any) -> bool:
        return present(key(block_hash))

    def grown(chunks: Sequence[ScheduledChunk]) -> dict[int, int]:
        out: dict[int, int] = {}
        # Each earlier chunk as (its block hashes, first block it computes, block it stops at).
        spans: list[tuple[Any, int, int]] = []
        # The hash of each earlier chunk's first block, and the lowest first block: a chunk
        # can supply block i only if it starts at i (then its first hash is this request's
        # block i) or before i. Usually neither, and the request costs a set lookup.
        starts: set[Any] = set()
        lowest = 0
        for k, (request, hit, tokens) in enumerate(chunks):
            hashes = request.block_hashes
            i = hit // block
            if spans and request.num_computed_tokens == 0 and i < len(hashes) and (
                    lowest < i or hashes[i] in starts):
                longer = _extended(hashes, (int(request.num_tokens) - 1) // block, i, spans,
                                   cached)
                if longer * block > hit:
                    out[k] = longer * block
            # The chunk computes its tokens from the prefix it finds.
            start = out.get(k, hit)
            i, end = start // block, (start + tokens) // block
            if i < end and i < len(hashes):
                starts.add(hashes[i])
            lowest = i if not spans or i < lowest else lowest
            spans.append((hashes, i, end))
        return out

    return grown


def _extended(hashes: Any, limit: int, i: int, spans: list[tuple[Any, int, int]],
              cached: Callable[[Any], bool]) -> int:
    """The blocks of `hashes` found from block `i` on (the first one the lookup missed), with
    `spans` computed before it in the step: block i, then each next block, while an earlier
    chunk computes it or, once grown, it is cached."""
    limit = min(limit, len(hashes))
    if i >= limit:
        return i
    first_wanted = hashes[i]
    # Chained hashes: a chunk whose block i differs from this one's differs at every later
    # block too, so only those computing an equal block i can extend the hit (usually none:
    # requests that share a system prompt part where their own text starts).
    spans = [span for span in spans if i < len(span[0]) and span[0][i] == first_wanted]
    if not spans:
        return i
    start = i
    while i < limit:
        want = hashes[i]
        if not any(first <= i < end and i < len(theirs) and theirs[i] == want
                   for theirs, first, end in spans):
            if not (i > start and cached(want)):
                break
        i += 1
    return i


def finished_request_ids(scheduler_output: Any) -> Collection[str]:
    """Requests that finished or were aborted since the previous step."""
    return getattr(scheduler_output, "finished_req_ids", None) or ()


def admission_limit(scheduler: Any) -> int:
    """How many requests may be active once waiting ones are admitted.

    0.32 admits up to `max_num_active_reqs` (scheduler_config.max_num_active_seqs, default
    max_num_seqs); earlier releases up to `max_num_running_reqs` (max_num_seqs).
    """
    limit = getattr(scheduler, "max_num_active_reqs", None)
    if limit is None:
        limit = scheduler.max_num_running_reqs
    return int(limit)


def admission_slots(scheduler: Any) -> int:
    """How many waiting requests schedule() can still admit this step (before budgets).

    Paused streaming sessions hold a model-runner slot without being in `running`; vLLM counts
    them against the limit from 0.25 on (0.23 compares len(running) alone).
    """
    used = len(scheduler.running)
    version = loaded_vllm_version()
    if version is None or version[:2] >= (0, 25):
        used += int(getattr(scheduler, "num_waiting_for_streaming_input", 0) or 0)
    return max(0, admission_limit(scheduler) - used)


def waiting_requests(scheduler: Any, limit: int) -> list[Any]:
    """The first `limit` waiting requests in the order schedule() admits them
    (`WaitingOrder` read to the end)."""
    order = WaitingOrder(scheduler, limit)
    return [*order, *order.rest()]


class WaitingOrder:
    """The first `limit` waiting requests in the order schedule() admits them, read lazily:
    iterate for the first ones, then `rest()` gives the others in one pass.

    0.32: `kv_holding_waiting` is always drained before `waiting` (deferred requests stay in
    those queues, tagged in the `deferred_waiting` set). Up to 0.30: `skipped_waiting` comes
    first under FCFS; under the priority policy the two queue heads are compared at each pick,
    which is a merge of the two priority orders. Requests blocked on remote KV or a grammar are
    kept: schedule() may unblock them in the same call, and we cannot tell beforehand. A
    preempted request whose earlier output is still in flight (`num_stale_output_tokens`,
    0.32) is skipped by schedule() until that output is back, so it is left out here too.
    """

    __slots__ = ("_queue", "_left", "_peeked")

    def __init__(self, scheduler: Any, limit: int) -> None:
        self._left = max(0, int(limit))
        self._queue: Iterator[Any] = _admission_order(scheduler) if self._left else iter(())
        self._peeked: Any = None  # read by `more()`, not handed out yet

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self._peeked is not None:
            req, self._peeked = self._peeked, None
            return req
        while self._left > 0:
            req = next(self._queue)
            if not _stale(req):
                self._left -= 1
                return req
        raise StopIteration

    def more(self) -> bool:
        """Whether any request is left, reading at most one."""
        if self._peeked is None:
            self._peeked = next(self, None)
        return self._peeked is not None

    def take(self, n: int) -> list[Any]:
        """The next `n` requests (fewer when the rest is shorter)."""
        return list(itertools.islice(self, max(0, n)))

    def rest(self) -> list[Any]:
        """The requests not read yet (up to the limit)."""
        return self.tail()[0]

    def tail(self) -> tuple[list[Any], bool]:
        """The requests not read yet (up to the limit), and whether each is a whole prompt
        not yet started (`whole_prefills`)."""
        head = [self._peeked] if self._peeked is not None else []
        self._peeked = None
        left = self._left
        if left <= 0:
            return head, whole_prefills(head)
        window = head + list(itertools.islice(self._queue, left))
        self._left = 0
        try:
            stale = any(r.num_stale_output_tokens for r in window)
        except AttributeError:
            stale = True  # before 0.32 (no stale output) or a request without it: check each
        if not stale:
            return window, whole_prefills(window)  # nothing skipped: the window is the rest
        out = [r for r in window if not _stale(r)]
        for req in self._queue:
            if len(out) >= left + len(head):
                break
            if not _stale(req):
                out.append(req)
        return out, whole_prefills(out)


class ScheduledBefore:
    """The requests vLLM has scheduled at least once and not finished, by id, so that a step
    can tell without reading the waiting queue that every waiting request is a whole prompt
    (`whole_prefills`), which is all the plan needs of the requests past its reach.

    In the releases we read (0.32's `schedule()`, `_preempt_request`,
    `_handle_stopped_request`, `_update_request_as_session`), a waiting request gains computed
    tokens, output or stale output only by being scheduled first (it comes back preempted or
    as a streaming session's next turn), except that a KV connector sets the computed tokens
    of a waiting request whose remote KV it loads without scheduling it (no verdict then). A
    request vLLM schedules moves to `running`, and leaves it when it finishes (into the
    scheduler's `finished_req_ids` until the next `schedule()`) or is preempted or paused. So
    when the requests scheduled before and not finished are exactly as many as `running`
    holds, none of them waits, and every waiting request is one vLLM never scheduled.

    `record` takes every step's scheduled and finished ids (from `CppRuntime.scheduled`); a
    step begun and never recorded (vLLM's `schedule()` raised, or recording failed) leaves
    the set unsure, and every request vLLM then knows counts as scheduled before until it
    finishes.
    """

    __slots__ = ("_ids", "_owed")

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._owed = False  # a step was begun and its record has not come yet

    def __len__(self) -> int:
        return len(self._ids)

    def begin(self, scheduler: Any) -> None:
        """A step is about to be scheduled; `record` must follow before the next."""
        if self._owed:
            self._ids.update(getattr(scheduler, "requests", None) or ())
        self._owed = True

    def record(self, scheduled: Collection[str], finished: Collection[str]) -> None:
        self._ids.update(scheduled)
        if finished:
            self._ids.difference_update(finished)
        self._owed = False

    def none_waiting(self, scheduler: Any) -> bool:
        """True when every waiting request is one vLLM never scheduled (so a whole prompt);
        False when that is not known."""
        if getattr(scheduler, "connector", None) is not None:
            return False
        running = getattr(scheduler, "running", None)
        pending = getattr(scheduler, "finished_req_ids", None)
        if running is None or pending is None:
            return False
        ids = self._ids
        n = len(ids)
        if pending:
            n -= len(ids.intersection(pending))
        return n == len(running)


def _stale(req: Any) -> bool:
    try:
        return bool(req.num_stale_output_tokens) and not req.drop_stale_output
    except AttributeError:  # before 0.32
        return bool(getattr(req, "num_stale_output_tokens", 0)) and not getattr(
            req, "drop_stale_output", False)


def _admission_order(scheduler: Any) -> Iterator[Any]:
    kv_holding = getattr(scheduler, "kv_holding_waiting", None)
    skipped = getattr(scheduler, "skipped_waiting", None)
    waiting = getattr(scheduler, "waiting", None)
    if kv_holding is not None:
        return _chain(kv_holding, waiting)
    if skipped and waiting and _priority_policy(scheduler, waiting):
        return heapq.merge(skipped, waiting)
    return _chain(skipped, waiting)


def _chain(*queues: Any) -> Iterator[Any]:
    # vLLM's queues iterate in pop order themselves (the FCFS deque front to back, the priority
    # queue by popping a copy of its heap), and lazily: only the first `limit` are read.
    return itertools.chain.from_iterable(q for q in queues if q)


def _priority_policy(scheduler: Any, queue: Any) -> bool:
    policy = getattr(scheduler, "policy", None)
    value = getattr(policy, "value", policy)
    if isinstance(value, str):
        return value == "priority"
    return _is_priority_queue(queue)


def _is_priority_queue(queue: Any) -> bool:
    return type(queue).__name__ == "PriorityRequestQueue"


# ----- worker surfaces ----------------------------------------------------------------------


def current_platform() -> Any:
    """vLLM's `current_platform` (vllm-ascend's NPUPlatform on Ascend), or None without vLLM.
    The one place the platform is looked up, so tests can stand an NPU platform in."""
    try:
        from vllm.platforms import current_platform as platform
    except Exception:
        return None
    return platform


def device_synchronize_fn(platform: Any = None) -> tuple[str, Any]:
    """(name, zero-argument sync function) for this process's accelerator.

    On the CPU a forward returns when it is done, so there is nothing to wait for. On NPUs the
    sync is `torch.npu.synchronize`, which exists once torch_npu is imported (vllm-ascend's
    worker module imports it; if it has not been, it is imported here, and its own `npu`
    module is used if torch still has none). On CUDA/ROCm/XPU it is torch.<device>.synchronize.
    `platform` is vLLM's `current_platform` unless given (tests pass a stand-in).
    """
    if platform is None:
        platform = current_platform()
    device_type = str(getattr(platform, "device_type", "") or "")
    if device_type in ("", "cpu"):
        return "none", _no_sync
    try:
        import torch
    except Exception:
        return "none", _no_sync
    module = getattr(torch, device_type, None)
    if module is None and device_type == "npu":
        try:
            import torch_npu
        except Exception:
            torch_npu = None
        module = getattr(torch, "npu", None) or getattr(torch_npu, "npu", None)
    sync = getattr(module, "synchronize", None)
    if sync is None:
        return "none", _no_sync
    return f"torch.{device_type}.synchronize", sync


def _no_sync() -> None:
    return None


def _on_npu() -> bool:
    return str(getattr(current_platform(), "device_type", "") or "") == "npu"


def cudagraph_mode_none() -> Any:
    """vLLM's CUDAGraphMode.NONE (eager), or None where vLLM's config module is not there."""
    try:
        from vllm.config import CUDAGraphMode
    except Exception:
        return None
    return CUDAGraphMode.NONE


def dummy_run_params(runner: Any) -> set[str]:
    try:
        return set(inspect.signature(runner._dummy_run).parameters)
    except (TypeError, ValueError, AttributeError):
        return set()


def _only_known(params: set[str], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """Keep the keyword arguments `_dummy_run` names: V1 runners reject unknown ones (0.23 and
    0.25 have no `randomize_inputs`), and V2's **kwargs would swallow them without effect."""
    return {k: v for k, v in wanted.items() if k in params}


def one_request_dummy_run(runner: Any) -> tuple[str, Callable[[int], Any]]:
    """(how, run(num_tokens)) that times ONE request of num_tokens with attention computed.

    Three runner shapes (tests/unit/test_compat.py and tests/fakes/ascend.py mirror each):
    - vllm-ascend's V1 `NPUModelRunner._dummy_run(..., force_attention, ..., profile_cpp)`
      (worker/model_runner_v1.py, 0.23.0): `profile_cpp=True` makes one request of
      num_tokens; called exactly as vllm-ascend's own `NPUWorker.profile_prefill_latency`
      calls it (force_attention=True, profile_cpp=True, no is_profile: on Ascend is_profile
      sets `in_profile_run`, which forces MoE load balancing).
    - vLLM's V1 `GPUModelRunner._dummy_run(num_tokens, ..., force_attention, ..., is_profile,
      ...)` (also the CPU runner): it spreads the tokens over `scheduler_config.max_num_seqs`
      requests, so that is 1 for the call; force_attention builds attention metadata;
      is_profile keeps the dummy tokens real (not padding) and the run eager;
      randomize_inputs (0.27+) gives MoE layers varied token ids, as real text. vllm-ascend's
      310P runner has this shape without profile_cpp: on the NPU it gets what profile_cpp
      would give instead (one request, force_attention, cudagraph_runtime_mode NONE), as
      vllm-ascend 0.30's own profile_prefill_latency calls runners without profile_cpp.
    - vLLM's V2 `GPUModelRunner._dummy_run(num_tokens, *args, skip_attn=False, ..., **kwargs)`
      (worker/gpu/model_runner.py; the V2 CPU runner inherits it, vllm-ascend's V2 runner
      inherits it up to 0.26 and wraps it with the same keywords from 0.27): it spreads over
      `self.max_num_reqs`, so that is 1 for the call. It has no force_attention (its **kwargs
      would swallow one): attention metadata is built unless skip_attn=True, and we leave
      skip_attn at False, so attention runs.
    On the NPU is_profile is never passed (see below).
    """
    params = dummy_run_params(runner)
    if "profile_cpp" in params:
        kwargs = _only_known(params, {"force_attention": True, "profile_cpp": True})
        return "profile_cpp", lambda n: runner._dummy_run(n, **kwargs)
    # On Ascend, is_profile sets `in_profile_run` (forced MoE load balancing), which
    # vllm-ascend's own profiling avoids too (0.30: is_profile=False); elsewhere it keeps the
    # dummy tokens real (not padding) and the run eager.
    npu = _on_npu()
    wanted: dict[str, Any] = {"randomize_inputs": True} if npu else \
        {"is_profile": True, "randomize_inputs": True}
    if "force_attention" in params and npu:
        # vllm-ascend's 310P runner (NPUModelRunner310) has no profile_cpp. Its is_profile sets
        # `in_profile_run` (forced MoE load balancing), so it is not passed; what profile_cpp
        # would do is rebuilt from parameters it has: one request (max_num_seqs=1), attention
        # metadata (force_attention) and eager execution (cudagraph_runtime_mode NONE, which
        # its force_eager test reads exactly as it reads profile_cpp).
        eager = cudagraph_mode_none()
        kwargs = _only_known(params, {"force_attention": True})
        how = "NPU runner without profile_cpp: max_num_seqs=1, force_attention"
        if eager is not None and "cudagraph_runtime_mode" in params:
            kwargs["cudagraph_runtime_mode"] = eager
            how += ", eager"
        limit = _one_seq
    elif "force_attention" in params:
        kwargs = _only_known(params, {"force_attention": True, **wanted})
        how = "max_num_seqs=1, force_attention"
        limit = _one_seq
    elif "skip_attn" in params:
        kwargs = _only_known(params, {"skip_attn": False, **wanted})
        how = "V2 runner: max_num_reqs=1, attention built (skip_attn=False)"
        limit = _one_req
    else:
        # A shape we have not seen: limit both places a runner may read the request count,
        # and say that attention is not known to be forced.
        kwargs = _only_known(params, wanted)
        how = "unknown _dummy_run signature: max_num_seqs=1, attention not forced"
        limit = _one_seq_and_req

    def run(n: int) -> Any:
        with limit(runner):
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


@contextlib.contextmanager
def _one_req(runner: Any) -> Iterator[None]:
    old = runner.max_num_reqs
    runner.max_num_reqs = 1
    try:
        yield
    finally:
        runner.max_num_reqs = old


@contextlib.contextmanager
def _one_seq_and_req(runner: Any) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        if hasattr(getattr(runner, "scheduler_config", None), "max_num_seqs"):
            stack.enter_context(_one_seq(runner))
        if hasattr(runner, "max_num_reqs"):
            stack.enter_context(_one_req(runner))
        yield


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


def preempted_request_ids(scheduler_output: Any) -> tuple[str, ...]:
    """Requests vLLM preempted while building this step (empty where vLLM does not say)."""
    return tuple(sorted(getattr(scheduler_output, "preempted_req_ids", None) or ()))


def read_step_ms(model_runner_output: Any) -> float | None:
    value = getattr(model_runner_output, STEP_MS_ATTR, None)
    return float(value) if value is not None else None


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
    platform = current_platform()
    try:
        return str(getattr(platform, "device_name", "") or platform.device_type)
    except Exception:
        return "unknown"


def inproc_scheduler(llm: Any) -> Any | None:
    """The scheduler of an `LLM` whose engine core runs in this process
    (VLLM_ENABLE_V1_MULTIPROCESSING=0), or None when it runs elsewhere. Tests and benchmarks
    reach the CPP runtime this way; a served engine never does."""
    core = getattr(getattr(getattr(llm, "llm_engine", None), "engine_core", None),
                   "engine_core", None)
    return getattr(core, "scheduler", None)
