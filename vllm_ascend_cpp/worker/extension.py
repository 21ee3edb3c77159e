"""Worker methods reached by name through `collective_rpc` (vLLM's worker_extension_cls).

vLLM mixes this class into its worker class in every worker process, so the engine can call
`cpp_prepare_worker` and `cpp_profile_sweep` without sending code over the wire (which vLLM
refuses unless VLLM_ALLOW_INSECURE_SERIALIZATION=1).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from vllm_ascend_cpp import compat, faults
from vllm_ascend_cpp.worker.step_timer import drain_stage_times, install_step_timer

# Small, so the warm-up is cheap; any size allocates the pipeline's activation buffers.
WARMUP_TOKENS = 64


class CppWorkerExtension:
    model_runner: Any

    def cpp_prepare_worker(self, timing: bool = True, probe_tokens: int = 0) -> dict:
        """One warm-up dummy run (vLLM CPU with enforce_eager and PP needs one before the
        first real step) and, when online calibration is on, the step timer. With
        ``probe_tokens``, one timed dummy run of that size too, so the engine can say how long
        the sweep will take. Never raises (see cpp_profile_sweep)."""
        try:
            how, run = compat.one_request_dummy_run(self.model_runner)
            run(WARMUP_TOKENS)
            installed = install_step_timer(self.model_runner) if timing else False
            sync_name, sync = compat.device_synchronize_fn()
            probe_ms = None
            if probe_tokens > 0:
                sync()
                start = time.perf_counter()
                run(int(probe_tokens))
                sync()
                probe_ms = (time.perf_counter() - start) * 1000.0
        except Exception as e:
            return {**compat.worker_ranks(), "error": f"{type(e).__name__}: {e}"}
        return {**compat.worker_ranks(), "dummy_run": how, "sync": sync_name,
                "timer": installed, "probe_ms": probe_ms}

    def cpp_stage_times(self) -> dict:
        """This worker's forward times of the steps the scheduler marked since the last call,
        as ``[[step, ms], ...]`` (the engine takes the slowest stage per step)."""
        return {**compat.worker_ranks(), "times": drain_stage_times()}

    def cpp_profile_sweep(self, sizes: list[int], repeats: int = 1) -> dict:
        """Time one single-request prefill of each size, attention computed, on this stage.

        Never raises: an exception in one worker's reply would leave the other workers' replies
        queued behind it and desynchronise vLLM's RPC channel, so errors come back as data.
        """
        try:
            return self._cpp_sweep(sizes, repeats)
        except Exception as e:
            return {**compat.worker_ranks(), "error": f"{type(e).__name__}: {e}"}

    def _cpp_sweep(self, sizes: list[int], repeats: int) -> dict:
        how, run = compat.one_request_dummy_run(self.model_runner)
        sync_name, sync = compat.device_synchronize_fn()
        run(int(sizes[0]))  # warm-up at the largest size: allocator, kernels, caches
        latencies: list[float] = []
        for n in sizes:
            runs = []
            for _ in range(max(1, int(repeats))):
                sync()
                start = time.perf_counter()
                run(int(n))
                sync()
                runs.append((time.perf_counter() - start) * 1000.0)
            latencies.append(statistics.median(runs))
        latencies = faults.sweep_latencies(list(sizes), latencies)
        return {**compat.worker_ranks(), "latencies_ms": latencies, "dummy_run": how,
                "sync": sync_name}
