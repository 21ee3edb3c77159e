"""CPP never changes an answer: greedy tokens and prompt logprobs, CPP on vs off (float32).

Three engines, one after another in one job process: fixed chunks of 2048 (vLLM alone),
fixed chunks of 1024 (vLLM alone), and CPP on at a 2048 budget. Chunk boundaries change the
order of floating-point sums, so prompt logprobs may differ in the last bits; CPP is held to
the difference that changing vLLM's own fixed budget already makes.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from tests.integration.conftest import EngineRun, cpp_on, run_engine_jobs

N_PROMPTS = 50
# Log-uniform lengths from 64 to 12k tokens: short, chunked once, and chunked many times.
_rng = random.Random(2024)
LENGTHS = sorted(int(math.exp(_rng.uniform(math.log(64), math.log(12288))))
                 for _ in range(N_PROMPTS))
TOKENS = 8
BATCH = {"lengths": LENGTHS, "seed": 21, "max_tokens": TOKENS, "prompt_logprobs": 1}
# CPP may not differ from fixed 2048 by more than fixed 1024 does, give or take this factor
# (and an absolute floor for the case where both budgets agree to the last bit).
EPSILON_FACTOR = 1.5
ABS_FLOOR = 1e-5


def _engine(budget: int, cpp: dict | None) -> dict:
    return {"max_num_batched_tokens": budget, "max_model_len": 16384, "dtype": "float32",
            "cpp_config": cpp}


@pytest.fixture(scope="module")
def answer_runs(engine_root: Path) -> dict[str, EngineRun]:
    root = engine_root / "answers"
    wd = root / "cpp2048"
    runs = [
        {"label": "fixed2048", "engine": _engine(2048, None), "batches": [BATCH]},
        {"label": "fixed1024", "engine": _engine(1024, None), "batches": [BATCH]},
        {"label": "cpp2048", "batches": [BATCH],
         "engine": _engine(2048, cpp_on(wd, sample_repeats=3,
                                        profile_cache_dir=str(wd / "profiles")))},
    ]
    done = run_engine_jobs(root, runs, env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                                            "VLLM_CPU_KVCACHE_SPACE": "1"})
    return {r["label"]: run for r, run in zip(runs, done)}


def max_logprob_diff(a: EngineRun, b: EngineRun) -> float:
    worst = 0.0
    for oa, ob in zip(a.outputs(), b.outputs(), strict=True):
        la, lb = oa["prompt_logprobs"], ob["prompt_logprobs"]
        assert len(la) == len(lb) == oa["prompt_len"]
        for x, y in zip(la, lb):
            if x is None or y is None:
                assert x is None and y is None
                continue
            worst = max(worst, abs(x - y))
    return worst


def test_cpp_was_really_dynamic(answer_runs: dict[str, EngineRun]) -> None:
    """Without shrinking chunks this comparison would prove nothing."""
    run = answer_runs["cpp2048"]
    assert run.report()["fit"]["ok"], run.report().get("fallback_reason")
    sizes = {r["chunk"] for line in run.trace() for r in line["requests"]}
    assert any(n % 128 == 0 and n < 2048 for n in sizes), sorted(sizes)


def test_greedy_tokens_identical(answer_runs: dict[str, EngineRun]) -> None:
    on, off, off1024 = (answer_runs[k].outputs() for k in ("cpp2048", "fixed2048", "fixed1024"))
    assert len(on) == N_PROMPTS >= 50
    assert [o["prompt_len"] for o in on] == LENGTHS
    assert all(len(o["token_ids"]) == TOKENS for o in on)
    assert [o["token_ids"] for o in on] == [o["token_ids"] for o in off]
    assert [o["token_ids"] for o in off1024] == [o["token_ids"] for o in off]


def test_prompt_logprobs_differ_no_more_than_between_fixed_budgets(
    answer_runs: dict[str, EngineRun],
) -> None:
    baseline = max_logprob_diff(answer_runs["fixed2048"], answer_runs["fixed1024"])
    cpp = max_logprob_diff(answer_runs["cpp2048"], answer_runs["fixed2048"])
    cpp_vs_1024 = max_logprob_diff(answer_runs["cpp2048"], answer_runs["fixed1024"])
    n = sum(o["prompt_len"] - 1 for o in answer_runs["cpp2048"].outputs())
    print(f"max |prompt logprob difference| over {N_PROMPTS} prompts ({n} positions): "
          f"fixed 2048 vs fixed 1024 = {baseline:.3g}, CPP vs fixed 2048 = {cpp:.3g}, "
          f"CPP vs fixed 1024 = {cpp_vs_1024:.3g}")
    allowed = max(EPSILON_FACTOR * baseline, ABS_FLOOR)
    assert cpp <= allowed, (cpp, baseline)
    assert cpp_vs_1024 <= max(EPSILON_FACTOR * baseline, ABS_FLOOR) + allowed
