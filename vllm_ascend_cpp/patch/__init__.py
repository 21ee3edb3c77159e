"""The two places CPP enters vLLM, installed once per process by `register()`.

- `EngineArgs.create_engine_config`: validates `cpp_config` in the front end, before any
  process is spawned or model built, so a bad key fails `vllm serve` in seconds.
- `Executor.__init__`: selects our scheduler and worker extension before any worker starts;
  our scheduler, built once the engine is up, then runs the startup profiling through it.
"""

from __future__ import annotations

from vllm_ascend_cpp.patch.engine_args import install as _install_engine_args
from vllm_ascend_cpp.patch.executor import install as _install_executor


def install() -> None:
    _install_engine_args()
    _install_executor()
