"""Injected faults on the real engine: it serves everything, falls back, warns once, gives up.

Every fault of vllm_ascend_cpp/faults.py (test-only env hook VLLM_CPP_TEST_FAULT) runs on its
own engine (PP=2, CPU), all engines one after another in ONE job process with the engine core
in that process too (VLLM_ENABLE_V1_MULTIPROCESSING=0), so an engine costs its workers'
start-up only. Each engine has its own profile cache directory, so no cached profile can hide
a fault. For each fault:

- every request finishes with all its tokens;
- dynamic chunking falls back to fixed chunks (or keeps a model that sizes them as fixed);
- exactly one WARNING names the cause;
- nothing is retried without bound: one sweep, and refits counted in the trace.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration.conftest import EngineRun, run_engine_jobs

BUDGET = 2048
SEQUENTIAL = [5000, 300, 4500]  # one at a time: fixed chunks are exactly the budget
TOKENS = 3

# The injected +-50% noise is refused by the noise gate or by the growth gate, whichever trips
# first: on a busy host, or a fast one where the noise swamps the whole rise across the sizes
# (an Intel Xeon VM: rise 28.6 ms, noise 29.6 ms), the growth gate does.
NOISY_REJECTED = r"fit rejected: (the timings are too noisy|latency barely grows with size)"
# fault -> (regex the single warning must match, extra cpp_config)
SWEEP_FAULTS: dict[str, tuple[str, dict]] = {
    "sweep_raise": (r"startup sweep failed on a worker.*injected fault.*sweep_raise", {}),
    "sweep_nan": (r"fit rejected: only 0 usable samples.*8 NaN", {}),
    "sweep_inf": (r"fit rejected: only 0 usable samples.*8 infinite", {}),
    "sweep_zero": (r"fit rejected: only 0 usable samples.*8 zero", {}),
    "sweep_negative": (r"fit rejected: only 0 usable samples.*8 negative", {}),
    "sweep_flat": (r"fit rejected: latency is identical in every sample", {}),
    # 16 samples: with 8, the robust fit may trim noise as outliers and refuse for that.
    "sweep_noisy": (NOISY_REJECTED, {"num_samples": 16}),
    "sweep_falling": (r"fit rejected: latency falls as size grows", {}),
}
CONCAVE_WARNING = r"pinned a \(the attention cost\) at 0.*negative a"
CALIB_WARNING = r"online calibration gave up after 2 failed fits"
CALIB_WINDOW = 16
CALIB_MAX_FAILED = 2
# Online refits: one per min(8, max(2, rows // 4)) new timed rows, so 4 with a 16-row window.
CALIB_REFIT_EVERY = 4
RESCUE_WITHIN_STEPS = 200
# A timed step's stage times reach the engine within this many steps (stage_times.py).
STAGE_DELAY = 16
RESCUE_WARNING = NOISY_REJECTED + r".*will turn dynamic chunking on"


def _engine(workdir: Path, **cpp: object) -> dict:
    return {
        "max_num_batched_tokens": BUDGET,
        "max_model_len": 8192,
        "cpp_config": {
            "enabled": True,
            "trace_file": str(workdir / "trace.jsonl"),
            "profile_cache_dir": str(workdir / "profiles"),  # never shared: no cache hit
            "num_samples": 8,
            **cpp,
        },
    }


SEQ_BATCH = {"lengths": SEQUENTIAL, "seed": 11, "max_tokens": TOKENS, "concurrent": False}
# Many concurrent prefills of different lengths then decodes: varied step shapes, so online
# refits actually run (and fail on the injected noise) instead of failing a shape gate.
MIXED_BATCH = {"lengths": [200 + 97 * i for i in range(32)], "seed": 12, "max_tokens": 6}
# Serving after a rejected sweep: prompts of many lengths with decodes, ~250 steps.
RESCUE_BATCH = {"lengths": [150 + 211 * (i % 23) for i in range(60)], "seed": 13,
                "max_tokens": 8}


@pytest.fixture(scope="module")
def fault_runs(engine_root: Path) -> dict[str, EngineRun]:
    root = engine_root / "faults"
    runs = []
    for fault, (_, extra) in SWEEP_FAULTS.items():
        runs.append({"label": fault, "env": {"VLLM_CPP_TEST_FAULT": fault},
                     "engine": _engine(root / fault, **extra), "batches": [SEQ_BATCH]})
    runs.append({"label": "sweep_concave", "env": {"VLLM_CPP_TEST_FAULT": "sweep_concave"},
                 "engine": _engine(root / "sweep_concave", online_calibration=False),
                 "batches": [SEQ_BATCH]})
    # A noisy sweep, then serving: online calibration must rescue the server.
    runs.append({"label": "sweep_noisy_rescue", "env": {"VLLM_CPP_TEST_FAULT": "sweep_noisy"},
                 "engine": _engine(root / "sweep_noisy_rescue", num_samples=16),
                 "batches": [RESCUE_BATCH]})
    # The sweep itself must pass here, so it gets more, repeated samples.
    runs.append({"label": "calib_noise", "env": {"VLLM_CPP_TEST_FAULT": "calib_noise"},
                 "engine": _engine(root / "calib_noise", num_samples=32, sample_repeats=3,
                                   calibration_window=CALIB_WINDOW,
                                   max_failed_fits=CALIB_MAX_FAILED),
                 "batches": [MIXED_BATCH, SEQ_BATCH]})
    done = run_engine_jobs(root, runs, env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    return {r["label"]: run for r, run in zip(runs, done)}


def cpp_warnings(run: EngineRun) -> list[str]:
    return re.findall(r"WARNING.*\[CPP\].*", run.log)


def assert_all_served(run: EngineRun, batch: int, lengths: list[int], tokens: int) -> None:
    outs = run.outputs(batch)
    assert [o["prompt_len"] for o in outs] == lengths
    assert all(len(o["token_ids"]) == tokens for o in outs), [len(o["token_ids"]) for o in outs]
    assert all(o["finish_reason"] == "length" for o in outs)


def prefill_chunks(lines: list[dict]) -> dict[str, list[tuple[int, int]]]:
    chunks: dict[str, list[tuple[int, int]]] = {}
    for line in lines:
        for r in line["requests"]:
            chunks.setdefault(r["id"], []).append((r["history"], r["chunk"]))
    return chunks


def assert_fixed_chunks(lines: list[dict], lengths: list[int]) -> None:
    chunks = prefill_chunks(lines)
    assert sorted(sum(n for _, n in c) for c in chunks.values()) == sorted(lengths)
    for seq in chunks.values():
        sizes = [n for _, n in seq]
        assert all(n == BUDGET for n in sizes[:-1]), sizes
        assert [h for h, _ in seq] == [sum(sizes[:i]) for i in range(len(sizes))]


@pytest.mark.parametrize("fault", list(SWEEP_FAULTS))
def test_sweep_fault_serves_everything_with_fixed_chunks_and_one_warning(
    fault_runs: dict[str, EngineRun], fault: str
) -> None:
    run = fault_runs[fault]
    assert "startup_error" not in run.result, run.result.get("startup_error")
    assert_all_served(run, 0, SEQUENTIAL, TOKENS)
    warnings = cpp_warnings(run)
    print(f"{fault}: {warnings}")
    assert len(warnings) == 1, warnings
    assert "dynamic chunking is off" in warnings[0]
    assert re.search(SWEEP_FAULTS[fault][0], warnings[0]), warnings[0]
    trace = run.trace()
    assert trace and all(line["state"] == "fixed-fallback" for line in trace)
    assert all(line["planned_budget"] is None for line in trace)  # vLLM's own budget
    assert_fixed_chunks(trace, SEQUENTIAL)
    # Bounded: one sweep, never retried; a failed startup never feeds online refits.
    report = run.report()
    assert report["state"] == "fixed-fallback" and report["fallback_reason"]
    assert report["sweep"]["attempts"] == 1
    assert all(line.get("fit_attempts", 0) == 0 for line in trace)
    assert "at shutdown: state=fixed-fallback" in run.log


def test_negative_a_fit_keeps_a_model_that_never_shrinks_chunks(
    fault_runs: dict[str, EngineRun],
) -> None:
    run = fault_runs["sweep_concave"]
    assert_all_served(run, 0, SEQUENTIAL, TOKENS)
    warnings = cpp_warnings(run)
    print(f"sweep_concave: {warnings}")
    assert len(warnings) == 1 and re.search(CONCAVE_WARNING, warnings[0]), warnings
    report = run.report()
    assert report["fit"]["ok"] and report["coefficients"]["a"] == 0.0
    assert report["coefficients"]["b"] > 0  # the constrained fit, not a negative a
    trace = run.trace()
    assert all(line["state"] == "ready" for line in trace)
    # With a = 0 and no prefix term every chunk costs the same: the base size, whatever the
    # history. Only the tail rule may split the last stretch in two (no tiny last chunk).
    chunks = prefill_chunks(trace)
    assert sorted(sum(n for _, n in c) for c in chunks.values()) == sorted(SEQUENTIAL)
    for seq in chunks.values():
        sizes = [n for _, n in seq]
        assert all(n == BUDGET for n in sizes[:-2]), sizes
        assert sizes[0] == min(BUDGET, sum(sizes)) and sizes[-1] <= sizes[0], sizes


def test_calibration_that_never_passes_gives_up_once_and_retries_boundedly(
    fault_runs: dict[str, EngineRun],
) -> None:
    run = fault_runs["calib_noise"]
    assert_all_served(run, 0, MIXED_BATCH["lengths"], 6)
    assert_all_served(run, 1, SEQUENTIAL, TOKENS)
    warnings = cpp_warnings(run)
    print(f"calib_noise: {warnings}")
    assert len(warnings) == 1 and re.search(CALIB_WARNING, warnings[0]), warnings
    trace = run.trace()
    states = [line["state"] for line in trace]
    assert states[0] == "calibrating"
    # The line of the step whose timing made the last refit fail carries the event. The state
    # changes once that step's stage times are in (fetched within STAGE_DELAY steps).
    events = [i for i, line in enumerate(trace)
              if (line.get("event") or {}).get("kind") == "gave_up"]
    assert len(events) == 1
    gave_up = events[0]
    assert trace[gave_up]["failed_fits"] == CALIB_MAX_FAILED
    # What gives up is CALIB_MAX_FAILED failed refits in a row. Before them a refit may pass
    # by chance: the timings are random and the first refits, on a few rows, are judged with
    # the widest tolerance (CI saw one of four pass at 6 rows, 28.5% against about 30%).
    kinds = [line["event"]["kind"] for line in trace[:gave_up + 1] if line.get("event")]
    assert kinds[-CALIB_MAX_FAILED:] == ["rejected"] * (CALIB_MAX_FAILED - 1) + ["gave_up"]
    assert trace[gave_up]["fit_attempts"] == len(kinds)  # every attempt is on the trace
    assert trace[gave_up]["state_after"] == "fixed-fallback"
    first_fallback = states.index("fixed-fallback")
    assert gave_up < first_fallback <= gave_up + STAGE_DELAY
    # Once given up it never pretends to be calibrated again on noise.
    after = trace[first_fallback:]
    assert {line["state"] for line in after} == {"fixed-fallback"}
    assert all(line["planned_budget"] is None for line in after)
    # The second batch (request ids from 32 on) ran after the give-up, with fixed chunks.
    n_mixed = len(MIXED_BATCH["lengths"])
    seq_lines = [line for line in trace
                 if any(int(r["id"].split("-")[0]) >= n_mixed for r in line["requests"])]
    assert seq_lines and all(line["state"] == "fixed-fallback" for line in seq_lines)
    assert_fixed_chunks(seq_lines, SEQUENTIAL)
    # Bounded timing and attempts after giving up: one step in 16 timed, one refit per
    # CALIB_REFIT_EVERY new timed steps (those already timed when it gave up count too).
    timed_after = sum(1 for line in after if line["measured_ms"] is not None)
    timed_since = sum(1 for line in trace[gave_up + 1:] if line["measured_ms"] is not None)
    attempts_after = sum(1 for line in trace[gave_up + 1:] if line.get("event"))
    print(f"calib_noise: {len(events)} give-up, {attempts_after} refits after it over "
          f"{timed_since} timed steps; {timed_after} timed of {len(after)} fixed-fallback steps")
    assert timed_after <= len(after) // 16 + 2
    assert attempts_after <= timed_since // CALIB_REFIT_EVERY + 1
    assert re.search(r"at shutdown: state=fixed-fallback .*fit_attempts=\d+", run.log)


def test_a_noisy_sweep_is_rescued_by_serving_steps(fault_runs: dict[str, EngineRun]) -> None:
    run = fault_runs["sweep_noisy_rescue"]
    assert_all_served(run, 0, RESCUE_BATCH["lengths"], RESCUE_BATCH["max_tokens"])
    warnings = cpp_warnings(run)
    print(f"sweep_noisy_rescue: {warnings}")
    assert len(warnings) == 1 and re.search(RESCUE_WARNING, warnings[0]), warnings
    report = run.report()
    assert report["state"] == "fixed-fallback" and report["calibration"] == "rescue"
    trace = run.trace()
    assert trace[0]["state"] == "fixed-fallback"
    rescued = [i for i, line in enumerate(trace)
               if (line.get("event") or {}).get("kind") == "rescued"]
    print(f"sweep_noisy_rescue: rescued at step {rescued[:1]} of {len(trace)}")
    assert len(rescued) == 1 and rescued[0] < RESCUE_WITHIN_STEPS
    assert trace[rescued[0]]["state_after"] == "calibrating"
    assert re.search(r"\[CPP\] online calibration rescued the server: dynamic chunking is on",
                     run.log)
    # Dynamic from the step scheduled after the rescue's stage times came in, for good.
    switch = next(i for i, line in enumerate(trace) if line["state"] == "calibrating")
    assert rescued[0] < switch <= rescued[0] + STAGE_DELAY
    assert switch < RESCUE_WITHIN_STEPS
    after = [line for line in trace[switch:] if line["requests"]]
    assert after and all(line["state"] == "calibrating" for line in after)
    assert any(line["planned_budget"] is not None for line in after)
    # Bounded timing before the rescue: one step in four.
    before = trace[:rescued[0]]
    assert sum(1 for line in before if line["measured_ms"] is not None) <= len(before) // 4 + 2
    assert re.search(r"at shutdown: state=calibrating calibration=dynamic", run.log)
