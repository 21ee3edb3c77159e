"""Traffic patterns for the scheduler harness: who arrives when, with what prompt.

Prompts are token ids. A request may start with the first `prefix_len` tokens of one of a few
shared documents (multi-turn chat and agents resend their history), so with prefix caching on
vLLM finds cache hits; the rest of the prompt is the request's own.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field

from .build import EngineShape

NUM_DOCUMENTS = 3
VOCAB = 2000  # the tiny model's vocabulary is 2048; 0-2 are special tokens


@dataclass(frozen=True)
class RequestSpec:
    arrive: int  # engine iteration at which the client sends it
    prompt_len: int  # 1 .. max_model_len - 1
    max_tokens: int
    document: int | None = None  # index of the shared document its prompt starts with
    prefix_len: int = 0  # tokens taken from that document (at most prompt_len)
    priority: int = 0
    abort_after: int | None = None  # iterations after arrival at which the client aborts

    def expected_tokens(self, max_model_len: int) -> int:
        """Output tokens when it runs to the end: max_tokens, or up to the model length."""
        return min(self.max_tokens, max_model_len - self.prompt_len)


@dataclass(frozen=True)
class Pattern:
    shape: EngineShape
    requests: tuple[RequestSpec, ...]
    seed: int = 0
    name: str = field(default="", compare=False)


@functools.lru_cache(maxsize=16)
def _document(seed: int, index: int, length: int) -> tuple[int, ...]:
    rng = random.Random(seed * 7919 + index)
    return tuple(rng.randrange(3, VOCAB) for _ in range(length))


def prompt_tokens(pattern: Pattern, index: int) -> list[int]:
    spec = pattern.requests[index]
    head: list[int] = []
    if spec.document is not None and spec.prefix_len > 0:
        doc = _document(pattern.seed, spec.document % NUM_DOCUMENTS, pattern.shape.max_model_len)
        head = list(doc[: min(spec.prefix_len, spec.prompt_len)])
    rng = random.Random((pattern.seed << 20) ^ (index + 1))
    return head + [rng.randrange(3, VOCAB) for _ in range(spec.prompt_len - len(head))]


def make_request(pattern: Pattern, index: int, arrival_time: float, block_hasher) -> object:
    from vllm import SamplingParams
    from vllm.v1.request import Request

    spec = pattern.requests[index]
    params = SamplingParams(max_tokens=spec.max_tokens, ignore_eos=True)
    return Request(
        request_id=f"r{index}",
        prompt_token_ids=prompt_tokens(pattern, index),
        sampling_params=params,
        pooling_params=None,
        arrival_time=arrival_time,
        priority=spec.priority,
        block_hasher=block_hasher,
    )


@functools.cache
def block_hasher(block_size: int):
    """vLLM's request block hasher, set up as its EngineCore does for prefix caching."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    return get_request_block_hasher(block_size, hash_fn)
