"""A small soak on the real engine: random lengths, Poisson arrivals, PP=2, CPP with online
calibration. The long version (300+ requests) is benchmarks/soak.py, whose docstring derives
the wait bound this test checks: every request finishes, none is lost, none waits more steps
than the bound allows.

Memory: the plugin's per-step code (scheduler hook, runtime, calibrator, trace, prefix
lookups) runs in the engine-core process. A second, in-process engine (sync driver,
VLLM_ENABLE_V1_MULTIPROCESSING=0) serves warm traffic under tracemalloc, and the bytes our
package allocated and still holds at the end must stay under half of a 1 KiB-per-step leak
over the steps taken (leak_check.py); the same check is shown to fail on vLLM's real
scheduler (tests/sched_harness, no workers) with a 1 KiB-per-step leak injected.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import soak
from tests.integration import leak_check
from tests.integration.conftest import EngineRun, cpp_on, run_engine_job

N = 60
BATCH = soak.workload(N, min_len=100, max_len=12000, max_tokens=8, rate=1.5,
                      max_arrival_s=45.0, seed=6)
# Covers the longest prompts first, so the allocator has seen every shape before "start".
WARMUP = {"lengths": [12000, 3000, 700, 150], "max_tokens": 4, "seed": 99}


@pytest.fixture(scope="module")
def soak_run(engine_root: Path) -> tuple[EngineRun, dict]:
    wd = engine_root / "soak"
    # oneDNN keeps one primitive per distinct matmul shape (up to 1024): that bounded cache
    # fills for minutes on this CPU engine whatever the chunking (see benchmarks/soak.py).
    # Capped, the RSS figures the soak prints settle (its own memory check is the in-process
    # run below); kept as the calibration figures were measured with it.
    spec = soak.job_spec(wd, BATCH, warmup=WARMUP, rss_every_s=3.0, num_samples=32,
                         sample_repeats=2, env={"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "8"})
    spec["engine"].pop("model_dir")  # conftest puts the tiny model beside the other engines
    run = run_engine_job(wd, engine=spec["engine"], batches=spec["batches"], driver="async",
                         env=spec["env"], rss_every_s=spec["rss_every_s"])
    outputs = run.outputs(1)
    t0 = min(o["submit"] for o in outputs)
    fig = soak.analyse(BATCH, outputs, [x for x in run.trace() if x["time"] >= t0],
                       run.report(), run.result["rss"], run.result.get("rss_samples", []))
    print(json.dumps({k: v for k, v in fig.items() if k != "rows"}, indent=1, default=str))
    return run, fig


def test_every_request_finishes_and_none_is_lost(soak_run: tuple[EngineRun, dict]) -> None:
    run, fig = soak_run
    assert fig["requests"] == N and fig["completed"] == N and fig["lost"] == 0
    for o, length, tokens in zip(run.outputs(1), BATCH["lengths"], BATCH["max_tokens"]):
        assert o["prompt_len"] == length and len(o["token_ids"]) == tokens


def test_no_request_waits_more_steps_than_the_bound(soak_run: tuple[EngineRun, dict]) -> None:
    _, fig = soak_run
    wb = fig["wait_bound"]
    print(f"max steps waited / bound = {wb['max_steps_over_bound']:.3f}; max wait "
          f"{fig['wait_s']['max']:.2f} s ({wb['violations_time']} over the time bound)")
    assert wb["violations_steps"] == 0, wb["worst_by_steps"]
    assert all(r["steps"] >= 1 for r in fig["rows"])  # the clock really saw the steps


def test_cpp_ran_with_online_calibration(soak_run: tuple[EngineRun, dict]) -> None:
    run, fig = soak_run
    assert run.report()["fit"]["ok"]
    assert fig["states"].get("calibrating", 0) + fig["states"].get("ready", 0) > 0
    assert fig["fit_attempts"] is not None and fig["fit_attempts"] >= 1


def test_calibration_converges_on_this_traffic(soak_run: tuple[EngineRun, dict]) -> None:
    # Ordinary traffic must never make online calibration give up (the 300-request soak once
    # ran 23% of its steps in fixed fallback), and the model it converges to must predict
    # what the engine measures. Timed steps of the second half, slowest stage.
    run, fig = soak_run
    cal = fig["calibration"]
    print(f"calibration: {cal}")
    assert cal["give_ups"] == 0 and "online calibration gave up" not in run.log
    assert cal["fallback_share"] is not None and cal["fallback_share"] <= 0.05
    assert cal["accepted_fits"] >= 1
    # The later half of the timed steps, after the refits from the startup model: the second
    # half of a run this short may hold only a dozen timed steps (one in 16 once the model is
    # good; CI once saw 15), too few for a median.
    later = cal["later_timed_half"]
    assert later["steps"] >= 40, later
    # Loose on purpose: on a shared 2-core runner equal work varies 1.5-2x in time (median
    # 0.16-0.33 seen at load 12-40). A model off by 2x gives a median near 0.5 and fails here;
    # the 10% / 25% bars are measured by benchmarks/soak.py on a quiet machine.
    assert later["pred_error_median"] <= 0.35, later
    assert later["pred_error_p90"] <= 1.0, later
    # Every stage timed: both stages' times on the timed steps.
    assert cal["timed_steps_with_stage_times"] >= cal["timed_steps_second_half"]


# Decode-heavy traffic with a shared prefix (prefix-cache hits), so the measured run is
# hundreds of steps; the first batch is the warm-up (same shape: calibration windows and
# the pending-step map fill there), the others are measured.
MEMORY_BATCHES = [{"lengths": soak.workload(16, min_len=64, max_len=1500, max_tokens=1,
                                            rate=1.0, max_arrival_s=1.0, seed=s)["lengths"],
                   "seed": s, "prefix_seed": 5, "shared_prefix": 48, "max_tokens": 64}
                  for s in (11, 12, 13, 14)]


@pytest.fixture(scope="module")
def memory_run(engine_root: Path) -> dict:
    wd = engine_root / "soak-memory"
    engine = {"max_num_batched_tokens": 1024, "max_model_len": 4096,
              "enable_prefix_caching": True,
              "cpp_config": cpp_on(wd, num_samples=16, sample_repeats=1,
                                   online_calibration=True)}
    run = run_engine_job(wd, engine=engine, batches=MEMORY_BATCHES, tracemalloc_from=1,
                         env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                              "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert "startup_error" not in run.result, run.result["startup_error"]
    fig = run.result["tracemalloc"]
    print(f"memory: {json.dumps(fig)}")
    return fig


def test_plugin_keeps_no_memory_per_step(memory_run: dict) -> None:
    fig = memory_run
    # Enough steps that a 1 KiB-per-step leak stands out of allocator-sized noise.
    assert fig["steps"] >= 200, fig
    assert fig["growth_bytes"] < fig["bound_bytes"], fig


@pytest.mark.parametrize("fault", [None, "step_leak_1k"])
def test_memory_check_catches_a_1k_per_step_leak(fault: str | None,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above on vLLM's real Scheduler with the CPP hook (no workers): clean, it
    passes; with 1 KiB kept per step (faults.py), it fails."""
    from tests.sched_harness.build import EngineShape
    from tests.sched_harness.drive import PatternRun
    from tests.sched_harness.traffic import Pattern, RequestSpec
    from vllm_ascend_cpp import faults

    if fault:
        monkeypatch.setenv(faults.ENV, fault)
    faults.active.cache_clear()  # read once per process
    monkeypatch.setattr(faults, "_leaked", [])

    def pattern(seed: int) -> Pattern:
        reqs = tuple(RequestSpec(arrive=i * 3, prompt_len=200 + 97 * i, max_tokens=60,
                                 document=i % 2, prefix_len=64) for i in range(16))
        return Pattern(EngineShape(max_model_len=2048, max_num_batched_tokens=256,
                                   model="cpu_like", target="auto"), reqs, seed=seed)

    try:
        PatternRun(pattern(0)).run()  # warm-up: imports, caches, first calibration
        run = PatternRun(pattern(1))
        growth = leak_check.PackageGrowth(lambda: run.sched.cpp._step)
        growth.start()
        run.run()
        fig = growth.stop()
    finally:
        faults.active.cache_clear()
    print(f"{fault}: {json.dumps(fig, indent=1)}")
    assert fig["steps"] >= 200, fig
    if fault is None:
        assert fig["growth_bytes"] < fig["bound_bytes"], fig
    else:
        assert fig["growth_bytes"] >= fig["steps"] * leak_check.LEAK_PER_STEP, fig
        assert fig["growth_bytes"] > fig["bound_bytes"]
