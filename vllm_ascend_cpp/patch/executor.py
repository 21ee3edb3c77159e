"""Wrap the base `Executor.__init__`: choose our scheduler and worker extension in time.

Why here and not `EngineCore.__init__`: in a spawned engine-core process vLLM loads plugins
(and so calls `register()`) at the top of `EngineCore.__init__`, too late to wrap that very
call. The executor is the first thing that constructor builds afterwards, before any worker
starts and before the scheduler class is resolved. The executor is remembered per VllmConfig
so our scheduler, built later in the same constructor, can run the startup profiling through
it. With CPP disabled or absent, the original runs untouched.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

from vllm_ascend_cpp import compat
from vllm_ascend_cpp.config import cpp_config_from_additional, validate_for_engine

_MARK = "_cpp_wrapped"
_executors: dict[int, weakref.ref] = {}
# Called before an executor shuts its workers down (by id of the executor).
_before_shutdown: dict[int, Callable[[], None]] = {}


def select_classes(vllm_config: Any) -> None:
    """Point vLLM at our scheduler and worker extension (validated as not user-set)."""
    sched = vllm_config.scheduler_config
    sched.scheduler_cls = (
        compat.ASYNC_SCHEDULER_CLS if compat.async_scheduling(sched) else compat.SCHEDULER_CLS
    )
    vllm_config.parallel_config.worker_extension_cls = compat.WORKER_EXTENSION_CLS


def executor_for(vllm_config: Any) -> Any | None:
    ref = _executors.get(id(vllm_config))
    return ref() if ref is not None else None


def before_shutdown(executor: Any, callback: Callable[[], None]) -> None:
    """Run `callback` when `executor` starts shutting down, before its workers stop.

    vLLM's EngineCore shuts the executor down before the scheduler, and a worker that is slow
    to exit gets the engine-core process force-killed within seconds: the scheduler's own
    shutdown (our summary line, the held trace lines) may then never run.
    """
    if executor is not None:
        _before_shutdown[id(executor)] = callback
        _wrap_shutdown(type(executor))


def _wrap_shutdown(cls: type) -> None:
    original = cls.shutdown
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def shutdown(self: Any, *args: Any, **kwargs: Any) -> Any:
        callback = _before_shutdown.pop(id(self), None)
        if callback is not None:
            callback()  # guarded by the caller: never raises
        return original(self, *args, **kwargs)

    setattr(shutdown, _MARK, True)
    cls.shutdown = shutdown  # type: ignore[method-assign]


def install() -> None:
    from vllm.v1.executor.abstract import Executor

    original = Executor.__init__
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def __init__(self: Any, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        cfg = cpp_config_from_additional(getattr(vllm_config, "additional_config", None))
        if cfg is not None and cfg.enabled:
            validate_for_engine(cfg, vllm_config)
            select_classes(vllm_config)
            _executors[id(vllm_config)] = weakref.ref(self)
        original(self, vllm_config, *args, **kwargs)

    setattr(__init__, _MARK, True)
    Executor.__init__ = __init__
