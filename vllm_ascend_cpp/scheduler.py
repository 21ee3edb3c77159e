"""The vLLM scheduler with CPP: a thin subclass that never copies `schedule()`.

Before delegating to vLLM's `schedule()`, it sets the step's token budget and prefill cap from
the core step planner (which walks the queues in the order vLLM will); afterwards it records
what vLLM actually scheduled. `update_from_output` feeds the measured step time back. Every
decision lives in `core/`, every vLLM detail in `compat`.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from vllm_ascend_cpp import compat
from vllm_ascend_cpp.config import cpp_config_from_additional, validate_for_engine
from vllm_ascend_cpp.patch.executor import executor_for
from vllm_ascend_cpp.runtime import CppRuntime
from vllm_ascend_cpp.startup import run_startup


class _CppSchedulerMixin:
    cpp: CppRuntime

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        vllm_config = self.vllm_config  # type: ignore[attr-defined]
        cfg = cpp_config_from_additional(vllm_config.additional_config)
        if cfg is None:
            raise RuntimeError("[CPP] scheduler selected without a cpp_config")
        resolved, facts = validate_for_engine(cfg, vllm_config)
        self.cpp = CppRuntime(resolved, facts)
        self.cpp.max_budget = compat.step_token_limit(self)
        self.start_cpp(vllm_config)

    def start_cpp(self, vllm_config: Any) -> None:
        """Profile the workers, or load the cached profile.

        The engine is built (model loaded, KV cache allocated) by the time vLLM constructs its
        scheduler, so this is where the workers can be profiled. The scheduler harness
        (tests/sched_harness), which has no workers, overrides this to load a given profile.
        """
        executor = executor_for(vllm_config)
        self.cpp.use_executor(executor)
        run_startup(executor, self.cpp, vllm_config)

    # *args/**kwargs: vLLM versions differ in what they pass (throttle_prefills, ...).
    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        plan = self.cpp.plan(self)
        if plan is None:
            output = super().schedule(*args, **kwargs)  # type: ignore[misc]
        else:
            with compat.step_limits(self, plan.token_budget, plan.prefill_cap):
                output = super().schedule(*args, **kwargs)  # type: ignore[misc]
        self.cpp.scheduled(self, output, plan)
        return output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        self.cpp.finished(scheduler_output, model_runner_output)
        return super().update_from_output(  # type: ignore[misc]
            scheduler_output, model_runner_output
        )

    def shutdown(self) -> None:
        self.cpp.close()
        super().shutdown()  # type: ignore[misc]


class CppScheduler(_CppSchedulerMixin, Scheduler):
    """vLLM's Scheduler with CPP step sizing."""


class CppAsyncScheduler(_CppSchedulerMixin, AsyncScheduler):
    """vLLM's AsyncScheduler with CPP step sizing (async scheduling on)."""
