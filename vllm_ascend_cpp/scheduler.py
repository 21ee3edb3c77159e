"""The vLLM scheduler with CPP: a thin subclass that never copies `schedule()`.

Before delegating to vLLM's `schedule()`, it sets the step's token budget and prefill cap from
the core step planner (which walks the queues in the order vLLM will); afterwards it records
what vLLM actually scheduled. `update_from_output` feeds the measured step time back. Every
decision lives in `core/`, every vLLM detail in `compat`.

Every call into CPP's per-step code goes through a `HotPathGuard` (see guard.py): a failure
there costs that step its dynamic sizing (vLLM's own limits apply), never a request; vLLM's own
`schedule()` and `update_from_output()` run outside the guard, so their exceptions reach the
engine unchanged.
"""

from __future__ import annotations

import contextlib
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from vllm_ascend_cpp import compat
from vllm_ascend_cpp.config import cpp_config_from_additional, validate_for_engine
from vllm_ascend_cpp.guard import HotPathGuard
from vllm_ascend_cpp.patch.executor import before_shutdown, executor_for
from vllm_ascend_cpp.runtime import CppRuntime
from vllm_ascend_cpp.startup import run_startup


class _CppSchedulerMixin:
    cpp: CppRuntime
    cpp_guard: HotPathGuard

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        vllm_config = self.vllm_config  # type: ignore[attr-defined]
        cfg = cpp_config_from_additional(vllm_config.additional_config)
        if cfg is None:
            raise RuntimeError("[CPP] scheduler selected without a cpp_config")
        resolved, facts = validate_for_engine(cfg, vllm_config)
        self.cpp = CppRuntime(resolved, facts)
        self.cpp.max_budget = compat.step_token_limit(self)
        self.cpp.attach_prefix_cache(compat.prefix_cache_lookup(self),
                                     compat.prefix_cache_probe(self),
                                     compat.prefix_cache_in_step(self))
        self.cpp_guard = HotPathGuard()
        self.start_cpp(vllm_config)

    def start_cpp(self, vllm_config: Any) -> None:
        """Profile the workers, or load the cached profile.

        The engine is built (model loaded, KV cache allocated) by the time vLLM constructs its
        scheduler, so this is where the workers can be profiled. The scheduler harness
        (tests/sched_harness), which has no workers, overrides this to load a given profile.
        """
        executor = executor_for(vllm_config)
        self.cpp.use_executor(executor)
        before_shutdown(executor, self._close_cpp)
        run_startup(executor, self.cpp, vllm_config)

    def _close_cpp(self) -> None:
        self.cpp_guard.run("the shutdown summary", self.cpp.close)

    # *args/**kwargs: vLLM versions differ in what they pass (throttle_prefills, ...).
    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        guard = self.cpp_guard
        if guard.disabled:
            return super().schedule(*args, **kwargs)  # type: ignore[misc]
        _, plan = guard.run("planning", self.cpp.plan, self)
        with contextlib.ExitStack() as limits:
            if plan is not None:
                # Setting the limits is ours; step_limits undoes a half-made change itself.
                ok, _ = guard.run("setting the step limits", _enter, limits,
                                  compat.step_limits(self, plan.token_budget, plan.prefill_cap))
                if not ok:
                    plan = None
            output = super().schedule(*args, **kwargs)  # type: ignore[misc]
        guard.run("recording the step", self.cpp.scheduled, self, output, plan)
        return output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        guard = self.cpp_guard
        if not guard.disabled:
            guard.run("recording the step result", self.cpp.finished,
                      scheduler_output, model_runner_output)
        return super().update_from_output(  # type: ignore[misc]
            scheduler_output, model_runner_output
        )

    def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> Any:
        done = super().reset_prefix_cache(*args, **kwargs)  # type: ignore[misc]
        # Also on a failed reset: part of what was cached may be gone; looking up again is
        # always right.
        self.cpp.prefix_cache_reset()
        return done

    def shutdown(self) -> None:
        self._close_cpp()  # a no-op when the executor's shutdown already ran it
        super().shutdown()  # type: ignore[misc]


def _enter(stack: contextlib.ExitStack, limits: Any) -> bool:
    stack.enter_context(limits)
    return True


class CppScheduler(_CppSchedulerMixin, Scheduler):
    """vLLM's Scheduler with CPP step sizing."""


class CppAsyncScheduler(_CppSchedulerMixin, AsyncScheduler):
    """vLLM's AsyncScheduler with CPP step sizing (async scheduling on)."""
