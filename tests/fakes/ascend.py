"""Fakes for torch-npu and vllm-ascend, with the method signatures of vllm-ascend 0.23.0.

Source: the vllm-ascend 0.23.0 source distribution from PyPI (`vllm_ascend-0.23.0.tar.gz`,
fetched with `pip download --no-deps --no-binary :all: vllm-ascend==0.23.0`; it cannot build
here, so the unpacked sdist was read, never installed). Files mirrored, signatures only:

- vllm_ascend/platform.py            NPUPlatform (device_type, device_name, dispatch_key)
- vllm_ascend/worker/worker.py       NPUWorker(WorkerBase): __init__, execute_model,
                                     sample_tokens, profile_prefill_latency,
                                     execute_dummy_batch
- vllm_ascend/worker/model_runner_v1.py  NPUModelRunner(GPUModelRunner): __init__,
                                     _dummy_run (with profile_cpp), execute_model,
                                     sample_tokens
- vllm_ascend/_310p/model_runner_310p.py NPUModelRunner310._dummy_run (no profile_cpp)
- vllm_ascend/worker/v2/model_runner.py  NPUModelRunner (V2) inherits vLLM's V2
                                     `GPUModelRunner._dummy_run` (vllm/v1/worker/gpu/
                                     model_runner.py of vLLM 0.23.0, the vLLM it pairs with)
- torch_npu: importing it registers `torch.npu`; vllm-ascend calls
  `torch.npu.synchronize()` around its own profiling dummy run
  (NPUWorker.profile_prefill_latency) and per timed step (NPUModelRunner._sync_device).

The bodies only record what they were asked to do: how many dummy requests a call would make
(by the rule each real body applies), whether attention metadata would be built, and when the
device was synchronized relative to the runs.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pytest

CUDAGRAPH_FULL = "FULL"  # stands in for vllm.config.CUDAGraphMode.FULL
CUDAGRAPH_NONE = "NONE"  # stands in for vllm.config.CUDAGraphMode.NONE


@dataclass
class EventLog:
    """Ordered record shared by the fake device and the fake runners."""

    events: list[tuple[str, Any]] = field(default_factory=list)

    def add(self, kind: str, detail: Any = None) -> None:
        self.events.append((kind, detail))

    def kinds(self) -> list[str]:
        return [k for k, _ in self.events]


class FakeNpuModule(types.ModuleType):
    """`torch.npu` as torch_npu registers it; only what vllm-ascend's timing paths call."""

    def __init__(self, log: EventLog) -> None:
        super().__init__("torch.npu")
        self.log = log
        self.synchronize_calls = 0

    def synchronize(self, device: Any = None) -> None:
        self.synchronize_calls += 1
        self.log.add("npu.synchronize")

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1


def install_torch_npu(monkeypatch: pytest.MonkeyPatch, log: EventLog | None = None, *,
                      register_on_torch: bool = True) -> FakeNpuModule:
    """Put a fake `torch_npu` in sys.modules and, like the real import, `torch.npu` on torch.

    The real torch is used when it is already imported; otherwise a bare stand-in module, so the
    test does not pay for importing torch. `register_on_torch=False` leaves torch without `npu`
    (as before torch_npu is imported) with the module reachable as `torch_npu.npu` only.
    """
    log = log or EventLog()
    npu = FakeNpuModule(log)
    torch_npu = types.ModuleType("torch_npu")
    torch_npu.npu = npu  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch_npu", torch_npu)
    torch = sys.modules.get("torch")
    if torch is None:
        torch = types.ModuleType("torch")
        monkeypatch.setitem(sys.modules, "torch", torch)
    if register_on_torch:
        monkeypatch.setattr(torch, "npu", npu, raising=False)
    else:
        monkeypatch.delattr(torch, "npu", raising=False)
    return npu


class FakeNPUPlatform:
    """vllm_ascend/platform.py `NPUPlatform` (0.23.0): the class attributes compat reads."""

    device_name: str = "npu"
    device_type: str = "npu"
    dispatch_key: str = "PrivateUse1"
    ray_device_key: str = "NPU"


@dataclass
class FakeSchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192


@dataclass
class FakeVllmConfig:
    scheduler_config: FakeSchedulerConfig = field(default_factory=FakeSchedulerConfig)
    additional_config: dict = field(default_factory=dict)


class FakeNPUModelRunner:
    """vllm_ascend/worker/model_runner_v1.py `NPUModelRunner(GPUModelRunner)`, 0.23.0.

    `_dummy_run` body rule mirrored: profile_cpp -> one request of num_tokens; otherwise
    min(num_tokens, scheduler_config.max_num_seqs) requests; attention metadata is built when
    force_attention or the graph mode is FULL (`_should_build_dummy_attn_metadata`); eager
    when `is_profile or cudagraph_runtime_mode == NONE or profile_cpp` (its force_eager);
    `in_profile_run=is_profile` is what it passes to the forward context.
    """

    def __init__(self, vllm_config: FakeVllmConfig, device: Any):
        self.vllm_config = vllm_config
        self.scheduler_config = vllm_config.scheduler_config
        self.device = device
        self.log = EventLog()  # make_worker shares the device's log
        self.dummy_runs: list[dict[str, Any]] = []

    def _dummy_run(
        self,
        num_tokens: int,
        with_prefill: bool = False,
        cudagraph_runtime_mode: Any = None,
        force_attention: bool = False,
        uniform_decode: bool = False,
        is_profile: bool = False,
        create_mixed_batch: bool = False,
        allow_microbatching: bool = True,
        skip_eplb: bool = False,
        remove_lora: bool = True,
        is_graph_capturing: bool = False,
        num_active_loras: int = 0,
        profile_seq_lens: int | None = None,
        profile_cpp: bool = False,
    ) -> tuple[Any, Any]:
        if profile_cpp:
            num_reqs = 1
        else:
            num_reqs = min(num_tokens, self.scheduler_config.max_num_seqs)
        record = {
            "num_tokens": num_tokens,
            "num_reqs": num_reqs,
            "attention": bool(force_attention or cudagraph_runtime_mode == CUDAGRAPH_FULL),
            "profile_cpp": profile_cpp,
            "is_profile": is_profile,
            "eager": bool(is_profile or cudagraph_runtime_mode == CUDAGRAPH_NONE or profile_cpp),
            "in_profile_run": is_profile,
        }
        self.dummy_runs.append(record)
        self.log.add("dummy_run", record)
        return None, None

    def execute_model(self, scheduler_output: Any, intermediate_tensors: Any = None) -> Any:
        self.log.add("execute_model", scheduler_output)
        return None

    def sample_tokens(self, grammar_output: Any) -> Any:
        self.log.add("sample_tokens", grammar_output)
        return None


class FakeNPUModelRunner310(FakeNPUModelRunner):
    """vllm_ascend/_310p/model_runner_310p.py `NPUModelRunner310._dummy_run`, 0.23.0: the same
    parameters without profile_cpp; the body forwards to NPUModelRunner._dummy_run."""

    def _dummy_run(  # type: ignore[override]
        self,
        num_tokens: int,
        with_prefill: bool = False,
        cudagraph_runtime_mode: Any = None,
        force_attention: bool = False,
        uniform_decode: bool = False,
        is_profile: bool = False,
        create_mixed_batch: bool = False,
        allow_microbatching: bool = True,
        skip_eplb: bool = False,
        remove_lora: bool = True,
        is_graph_capturing: bool = False,
        num_active_loras: int = 0,
        profile_seq_lens: int | None = None,
    ) -> tuple[Any, Any]:
        return super()._dummy_run(
            num_tokens, with_prefill, cudagraph_runtime_mode, force_attention, uniform_decode,
            is_profile, create_mixed_batch, allow_microbatching, skip_eplb, remove_lora,
            is_graph_capturing, num_active_loras, profile_seq_lens,
        )


class FakeNPUModelRunnerV2:
    """vllm_ascend/worker/v2/model_runner.py `NPUModelRunner(GPUModelRunner)` (V2), 0.23.0.

    It does not override `_dummy_run`; the inherited one is vLLM 0.23.0's
    vllm/v1/worker/gpu/model_runner.py `GPUModelRunner._dummy_run(self, num_tokens, *args,
    skip_attn=False, uniform_decode=False, skip_eplb=False, is_profile=False, **kwargs)`:
    min(num_tokens, self.max_num_reqs) requests, attention metadata unless skip_attn, and any
    other keyword (force_attention, profile_cpp, ...) swallowed by **kwargs.
    """

    def __init__(self, vllm_config: FakeVllmConfig, device: Any):
        self.vllm_config = vllm_config
        self.scheduler_config = vllm_config.scheduler_config
        self.max_num_reqs = self.scheduler_config.max_num_seqs
        self.device = device
        self.log = EventLog()
        self.dummy_runs: list[dict[str, Any]] = []

    def _dummy_run(
        self,
        num_tokens: int,
        *args: Any,
        skip_attn: bool = False,
        uniform_decode: bool = False,
        skip_eplb: bool = False,
        is_profile: bool = False,
        **kwargs: Any,
    ) -> tuple[Any, Any]:
        if skip_attn and not is_profile:
            raise ValueError("fake V2 runner: skip_attn without is_profile")
        record = {
            "num_tokens": num_tokens,
            "num_reqs": min(num_tokens, self.max_num_reqs),
            "attention": not skip_attn,
            "swallowed": sorted(kwargs),
            "is_profile": is_profile,
        }
        self.dummy_runs.append(record)
        self.log.add("dummy_run", record)
        return None, None

    def execute_model(self, scheduler_output: Any, intermediate_tensors: Any = None) -> Any:
        self.log.add("execute_model", scheduler_output)
        return None

    def sample_tokens(self, grammar_output: Any) -> Any:
        self.log.add("sample_tokens", grammar_output)
        return None


class FakeNPUWorker:
    """vllm_ascend/worker/worker.py `NPUWorker(WorkerBase)`, 0.23.0.

    The real base is vLLM's vllm/v1/worker/worker_base.py `WorkerBase`; vLLM's
    `WorkerWrapperBase.init_worker` appends `parallel_config.worker_extension_cls` to the
    worker class's bases, which tests reproduce with `with_extension()`.
    """

    def __init__(
        self,
        vllm_config: FakeVllmConfig,
        local_rank: int,
        rank: int,
        distributed_init_method: str,
        is_driver_worker: bool = False,
        **kwargs: Any,
    ) -> None:
        self.vllm_config = vllm_config
        self.scheduler_config = vllm_config.scheduler_config
        self.local_rank = local_rank
        self.rank = rank
        self.distributed_init_method = distributed_init_method
        self.is_driver_worker = is_driver_worker
        runner_cls = kwargs.get("runner_cls", FakeNPUModelRunner)
        # init_device() builds the runner in the real worker; here at construction.
        self.model_runner = runner_cls(vllm_config, "npu:0")
        if kwargs.get("log") is not None:
            self.model_runner.log = kwargs["log"]

    def execute_model(self, scheduler_output: Any) -> Any:
        return self.model_runner.execute_model(scheduler_output, None)

    def sample_tokens(self, grammar_output: Any) -> Any:
        return self.model_runner.sample_tokens(grammar_output)

    def profile_prefill_latency(self, num_tokens: int) -> float:
        # vllm-ascend's own CPP sweep entry point; CPP-with-this-plugin never calls it.
        raise AssertionError("vllm-ascend's profiling chunk path must not run beside cpp_config")

    def execute_dummy_batch(self) -> None:
        self.model_runner._dummy_run(num_tokens=1, uniform_decode=True)


def with_extension(worker_cls: type, extension_cls: type) -> type:
    """The class vLLM's WorkerWrapperBase.init_worker ends up instantiating: the worker class
    with the extension appended to its bases (same method resolution order)."""
    return type(worker_cls.__name__, (worker_cls, extension_cls), {})


def make_worker(extension_cls: type, runner_cls: type = FakeNPUModelRunner,
                log: EventLog | None = None, max_num_seqs: int = 256) -> Any:
    cls = with_extension(FakeNPUWorker, extension_cls)
    cfg = FakeVllmConfig(FakeSchedulerConfig(max_num_seqs=max_num_seqs))
    return cls(cfg, 0, 0, "tcp://127.0.0.1:0", True, runner_cls=runner_cls, log=log)


# ----- vllm-ascend 0.27 and later: the strict AscendConfig ------------------------------------
#
# Mirrored from vllm_ascend/ascend_config.py of the 0.27.1rc1-0.30.0rc2 sdists (PR #13838):
# `AscendConfig` is a pydantic dataclass with `ConfigDict(extra="forbid")`; `init_ascend_config`
# strips the keys it resolves itself (`_NON_USER_INPUT_KEYS`, scheduler keys among them),
# drops unknown keys only when `importlib.util.find_spec("vllm_omni")` finds vLLM-Omni, and
# caches the result per VllmConfig object (a pickled copy in another process builds it again).
# Its callers, each mirrored below with the real signature: NPUPlatform.check_and_update_config
# (inside VllmConfig.__post_init__), NPUWorker.__init__, BalanceScheduler.__init__. Only a few
# AscendConfig fields are modelled; the rules for unknown keys are the real ones.

import importlib.util  # noqa: E402

from pydantic import ConfigDict  # noqa: E402
from pydantic.dataclasses import dataclass as pydantic_dataclass  # noqa: E402

_STRICT = ConfigDict(extra="forbid")


@pydantic_dataclass(config=_STRICT)
class StrictShortRequestFirstConfig:
    enabled: bool = False
    threshold: int = 256
    long_max_wait_ms: float = 0.0


@pydantic_dataclass(config=_STRICT)
class StrictProfilingChunkConfig:
    enabled: bool = False
    smooth_factor: float = 1.0
    min_chunk: int = 4096


@pydantic_dataclass(config=_STRICT)
class StrictSchedulerConfig:
    enable_balance_scheduling: bool = False
    recompute_scheduler_enable: bool = False
    short_request_first_config: StrictShortRequestFirstConfig = field(
        default_factory=StrictShortRequestFirstConfig)
    profiling_chunk_config: StrictProfilingChunkConfig = field(
        default_factory=StrictProfilingChunkConfig)

    @classmethod
    def from_additional_config(cls, additional_config: dict[str, Any]) -> StrictSchedulerConfig:
        nested = additional_config.get("scheduler_config") or {}

        def resolve(key: str, default: Any) -> Any:
            if key in nested:
                return nested[key]
            return additional_config.get(key, default)

        resolved = {k: resolve(k, d) for k, d in (
            ("enable_balance_scheduling", False), ("recompute_scheduler_enable", False),
            ("short_request_first_config", {}), ("profiling_chunk_config", {}))}
        resolved.update({k: v for k, v in nested.items() if k not in resolved})
        return cls(**resolved)


@pydantic_dataclass(config=_STRICT)
class StrictAscendConfig:
    scheduler_config: StrictSchedulerConfig = field(default_factory=StrictSchedulerConfig)
    enable_cpu_binding: bool = True
    enable_kv_nz: bool = False


_NON_USER_INPUT_KEYS = {
    "refresh", "gdn_prefill_backend", "kda_prefill_backend", "scheduler_config",
    "enable_balance_scheduling", "recompute_scheduler_enable", "short_request_first_config",
    "profiling_chunk_config", "batch_job_sched_config",
}


@dataclass
class StrictAscendState:
    """The module globals `_ASCEND_CONFIG` / `_INIT_VLLM_CONFIG`, plus who called."""

    config: Any = None
    vllm_config: Any = None
    callers: list[str] = field(default_factory=list)


STRICT_STATE = StrictAscendState()


def init_ascend_config(vllm_config: Any, caller: str = "") -> StrictAscendConfig:
    """vllm_ascend.ascend_config.init_ascend_config(vllm_config), 0.27.1rc1 and later
    (`caller` is the fake's own record, not a real parameter)."""
    STRICT_STATE.callers.append(caller)
    additional = vllm_config.additional_config if vllm_config.additional_config is not None \
        else {}
    if STRICT_STATE.config is not None and STRICT_STATE.vllm_config is vllm_config \
            and not additional.get("refresh", False):
        return STRICT_STATE.config
    sched = StrictSchedulerConfig.from_additional_config(additional)
    kwargs = {k: v for k, v in additional.items() if k not in _NON_USER_INPUT_KEYS}
    unknown = sorted(set(kwargs) - StrictAscendConfig.__dataclass_fields__.keys())
    if unknown and importlib.util.find_spec("vllm_omni") is not None:
        kwargs = {k: v for k, v in kwargs.items() if k not in unknown}
    config = StrictAscendConfig(scheduler_config=sched, **kwargs)
    STRICT_STATE.config, STRICT_STATE.vllm_config = config, vllm_config
    return config


class StrictNPUPlatform(FakeNPUPlatform):
    """NPUPlatform.check_and_update_config(cls, vllm_config) -> None (classmethod): its first
    act on the configuration is `ascend_config = init_ascend_config(vllm_config)`."""

    @classmethod
    def check_and_update_config(cls, vllm_config: Any) -> None:
        init_ascend_config(vllm_config, "platform")


class StrictNPUWorker(FakeNPUWorker):
    """NPUWorker.__init__ of 0.27+: calls init_ascend_config(vllm_config) before anything
    else of its own (worker.py)."""

    def __init__(self, vllm_config: Any, local_rank: int, rank: int,
                 distributed_init_method: str, is_driver_worker: bool = False,
                 **kwargs: Any) -> None:
        init_ascend_config(vllm_config, "worker")
        super().__init__(vllm_config, local_rank, rank, distributed_init_method,
                         is_driver_worker, **kwargs)


class StrictBalanceScheduler:
    """vllm_ascend/patch/platform/patch_balance_schedule.py `BalanceScheduler.__init__` of
    0.25+ (the vLLM Scheduler base is left out): after super().__init__ it reads
    `init_ascend_config(vllm_config).scheduler_config.short_request_first_config`."""

    def __init__(self, vllm_config: Any, kv_cache_config: Any, structured_output_manager: Any,
                 block_size: int, hash_block_size: int | None = None, mm_registry: Any = None,
                 include_finished_set: bool = False, log_stats: bool = False) -> None:
        self.vllm_config = vllm_config
        srf = init_ascend_config(vllm_config, "scheduler").scheduler_config
        self.short_request_first = srf.short_request_first_config.enabled


# ----- vllm-ascend 0.23.0's BalanceScheduler on a PD prefill node ------------------------------


def _balance_scheduler_023() -> type:
    from tests.fakes.vllm_shapes import Scheduler023

    class FakeBalanceScheduler023(Scheduler023):
        """vllm_ascend/patch/platform/patch_balance_schedule.py `BalanceScheduler(Scheduler)`,
        0.23.0, paired with vLLM 0.23.0. `schedule(self, throttle_prefills=False)` hands over
        to vLLM unless balance scheduling is on or `_disable_preemption_on_prefill_node` holds
        (vLLM 0.23.0 and `kv_transfer_config.kv_role == "kv_producer"`); then its own copy of
        schedule() runs. The copy's reads, recorded by tools/ascend_surfaces.py in
        tests/fakes/ascend_surfaces.json ("own copy: ..."), are those of vLLM 0.23.0's
        schedule() (tests/unit/test_ascend_path.py compares them fact by fact), so the copy is
        vLLM 0.23's walk (Scheduler023) here; `own_copy_steps` counts the steps it ran."""

        def __init__(self, config: Any, kv_role: str | None = None, **queues: Any) -> None:
            super().__init__(config, **queues)
            self._balance_enabled = False
            self._disable_preemption = kv_role == "kv_producer"
            self.own_copy_steps = 0

        def schedule(self, throttle_prefills: bool = False) -> dict[str, int]:  # type: ignore[override]
            if not self._balance_enabled and not self._disable_preemption:
                return super().schedule()
            self.own_copy_steps += 1
            return self._walk()

    return FakeBalanceScheduler023


# vllm_ascend/worker/v2/model_runner.py `NPUModelRunner._dummy_run`, 0.27.1rc1 and 0.28.0rc1:
# its own override has exactly vLLM's V2 parameters, `(num_tokens, *args, skip_attn=False,
# uniform_decode=False, skip_eplb=False, is_profile=False, **kwargs)`, and forwards to vLLM's
# V2 one (same request rule, same attention rule): the inherited-shape fake is that shape.
FakeNPUModelRunnerV2_027 = FakeNPUModelRunnerV2


class FakeNPUModelRunnerV2_029(FakeNPUModelRunnerV2):  # noqa: N801
    """The same override in 0.29.0rc1 and 0.30.0rc2, with `context_len=0` added after
    uniform_decode (adaptive-verification profiling); it forwards to vLLM's V2 one."""

    def _dummy_run(  # type: ignore[override]
        self,
        num_tokens: int,
        *args: Any,
        skip_attn: bool = False,
        uniform_decode: bool = False,
        context_len: int = 0,
        skip_eplb: bool = False,
        is_profile: bool = False,
        **kwargs: Any,
    ) -> tuple[Any, Any]:
        kwargs.pop("skip_gdn_state_update", None)
        return super()._dummy_run(num_tokens, *args, skip_attn=skip_attn,
                                  uniform_decode=uniform_decode, skip_eplb=True,
                                  is_profile=is_profile, **kwargs)
