"""vLLM 0.32's own Scheduler / AsyncScheduler with the CPP hook on, built without workers.

The classes are the plugin's `CppScheduler` and `CppAsyncScheduler`; only `start_cpp` (the
startup sweep through the executor) is replaced by loading a given latency model, as a cached
profile would be. The KV cache manager is vLLM's, over a synthetic `KVCacheConfig` of one
full-attention group with as many blocks as the shape asks for.

Building a `VllmConfig` costs about 0.2 s, a scheduler about 3 ms: one `VllmConfig` is built
per model length and each scheduler gets a shallow copy of it with its own (validated)
`SchedulerConfig` and `CacheConfig`.
"""

from __future__ import annotations

import copy
import functools
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_ascend_cpp.core.latency_model import LatencyModel

PP_SIZE = 2

# Step cost models the harness plans with (milliseconds; see core/latency_model.py). The
# attention-heavy one shrinks chunks several-fold over a few thousand tokens of history; the
# linear one never does; the CPU-like one sits in between with a large per-step cost.
MODELS: dict[str, LatencyModel] = {
    "attention": LatencyModel(a=1e-5, b=0.01, c=2.0, gamma=1e-4, d=1e-5),
    "linear": LatencyModel(a=0.0, b=0.02, c=5.0),
    "cpu_like": LatencyModel(a=2e-6, b=0.03, c=12.0, gamma=5e-5, d=2e-6),
}


@dataclass(frozen=True)
class EngineShape:
    """One engine configuration as an operator would set it (plus the CPP settings)."""

    max_model_len: int = 2048
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 8
    max_num_active_seqs: int | None = None
    block_size: int = 16
    num_blocks: int = 4096
    prefix_caching: bool = True
    policy: str = "fcfs"
    long_prefill_token_threshold: int = 0
    adaptive_threshold: bool = False
    # vLLM 0.32 admits a request only when its whole prompt fits in the KV cache; off, it
    # admits on the first chunk and preempts when the cache runs out.
    reserve_full_prompt: bool = True
    async_scheduling: bool = False
    # Async scheduling under the V2 model runner: vLLM spaces a request's decodes pp_size
    # steps apart (`next_decode_eligible_step`) and keeps pp_size + 1 batches in flight.
    v2_runner: bool = False
    model: str = "attention"
    target: str = "base"
    base_chunk: int | None = None
    min_chunk: int | None = 64
    online_calibration: bool = True
    cpp: bool = True

    @property
    def in_flight(self) -> int:
        """Batches the engine keeps in flight (vLLM's `max_concurrent_batches`)."""
        return PP_SIZE + 1 if self.async_scheduling and self.v2_runner else PP_SIZE

    def cpp_config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "enabled": True,
            "target": self.target,
            "min_chunk": self.min_chunk,
            "online_calibration": self.online_calibration,
            "profile_cache_dir": "",
        }
        if self.base_chunk is not None:
            cfg["base_chunk"] = self.base_chunk
        return cfg


@functools.cache
def _tiny_model_dir() -> str:
    from vllm_ascend_cpp.testing.tiny_model import write_tiny_llama

    path = Path(tempfile.gettempdir()) / "cpp-sched-harness-llama"
    return str(write_tiny_llama(path))


@functools.cache
def _base_config(max_model_len: int) -> Any:
    from vllm.config import CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig

    model = ModelConfig(model=_tiny_model_dir(), skip_tokenizer_init=True,
                        max_model_len=max_model_len, dtype="float32")
    sched = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=max_model_len,
                            max_model_len=max_model_len, is_encoder_decoder=False)
    return VllmConfig(model_config=model, scheduler_config=sched,
                      cache_config=CacheConfig(block_size=16),
                      parallel_config=ParallelConfig(pipeline_parallel_size=PP_SIZE))


def vllm_config(shape: EngineShape) -> Any:
    from vllm.config import CacheConfig, SchedulerConfig

    base = _base_config(shape.max_model_len)
    sched = SchedulerConfig(
        max_num_seqs=shape.max_num_seqs,
        max_num_active_seqs=shape.max_num_active_seqs,
        max_num_batched_tokens=shape.max_num_batched_tokens,
        max_model_len=shape.max_model_len,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
        long_prefill_token_threshold=shape.long_prefill_token_threshold,
        long_prefill_token_threshold_adaptive=shape.adaptive_threshold,
        policy=shape.policy,
        scheduler_reserve_full_isl=shape.reserve_full_prompt,
        # VllmConfig turns async scheduling off for PP on the V1 runner (all this CPU has);
        # the harness builds the AsyncScheduler itself, as an engine with the V2 runner would.
        async_scheduling=shape.async_scheduling,
        disable_hybrid_kv_cache_manager=base.scheduler_config.disable_hybrid_kv_cache_manager,
    )
    cache = CacheConfig(block_size=shape.block_size,
                        enable_prefix_caching=shape.prefix_caching)
    cache.num_gpu_blocks = shape.num_blocks
    cfg = copy.copy(base)
    object.__setattr__(cfg, "scheduler_config", sched)
    object.__setattr__(cfg, "cache_config", cache)
    object.__setattr__(cfg, "additional_config",
                       {"cpp_config": shape.cpp_config()} if shape.cpp else {})
    return cfg


def kv_cache_config(shape: EngineShape) -> Any:
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    spec = FullAttentionSpec(block_size=shape.block_size, num_kv_heads=1, head_size=1,
                             dtype=torch.float32)
    return KVCacheConfig(num_blocks=shape.num_blocks, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])


@functools.cache
def scheduler_class(async_scheduling: bool, cpp: bool) -> type:
    """The plugin's scheduler class (or vLLM's own with `cpp=False`), with the startup sweep
    replaced by loading the latency model the harness put on the config."""
    if not cpp:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler

        return AsyncScheduler if async_scheduling else Scheduler
    from vllm_ascend_cpp.scheduler import CppAsyncScheduler, CppScheduler

    base = CppAsyncScheduler if async_scheduling else CppScheduler

    def start_cpp(self: Any, vllm_config: Any) -> None:
        self.cpp.manager.load_profile({"model": _PRELOADED[id(vllm_config)].to_dict()})

    return type(f"Harness{base.__name__}", (base,), {"start_cpp": start_cpp})


# vllm_config id -> the latency model its scheduler loads (set just before construction).
_PRELOADED: dict[int, LatencyModel] = {}


def build_scheduler(shape: EngineShape) -> Any:
    from vllm.v1.structured_output import StructuredOutputManager

    cfg = vllm_config(shape)
    cls = scheduler_class(shape.async_scheduling, shape.cpp)
    _PRELOADED[id(cfg)] = MODELS[shape.model]
    try:
        sched = cls(vllm_config=cfg, kv_cache_config=kv_cache_config(shape),
                    structured_output_manager=StructuredOutputManager(cfg),
                    block_size=shape.block_size, log_stats=False)
    finally:
        _PRELOADED.pop(id(cfg), None)
    if shape.async_scheduling and shape.v2_runner:
        # What the engine sets from VllmConfig.use_v2_model_runner; read by schedule().
        sched.use_v2_model_runner = True
    return sched
