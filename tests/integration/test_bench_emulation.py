"""The one-engine benchmark's fixed budget schedules exactly what vLLM's own budget does,
and its clients (closed loop, and the same-arrivals replay) drive the real engine as they say.

`benchmarks/bench_engine.py --one-engine` serves every policy from one engine and emulates a
fixed chunk of N tokens as a per-step budget of N (CppRuntime.set_bench_policy). That is only a
fair baseline if vLLM, given that budget, schedules the same steps as an engine started with
max_num_batched_tokens = N. Two real engines in one process: one with vLLM's own budget of 512
(CPP in its A/B mode "fixed", which traces every step but leaves vLLM's chunks alone), one with
a budget of 2048 and the emulated fixed 512. Their traces must match step by step.
"""

from __future__ import annotations

from pathlib import Path

from tests.integration.conftest import cpp_on, run_engine_jobs

BUDGET = 512
BATCHES = [
    # One long prompt alone, then three at once with decodes mixed into later prefill steps.
    {"lengths": [3000], "seed": 11, "max_tokens": 4},
    {"lengths": [1500, 2600, 700], "seed": 12, "max_tokens": [6, 3, 8]},
]


def _steps(trace: list[dict]) -> list[tuple]:
    """Per step: (request, history, chunk) of each prefill, the decode count, the token total.
    Request ids are renamed by first appearance: the two engines number requests alike, but
    the comparison should not rest on that."""
    names: dict[str, int] = {}
    out = []
    for line in trace:
        reqs = tuple((names.setdefault(r["id"], len(names)), r["history"], r["chunk"])
                     for r in line["requests"])
        out.append((reqs, line["decodes"], line["num_tokens"]))
    return out


def test_emulated_fixed_budget_matches_vllms_own(engine_root: Path) -> None:
    root = engine_root / "bench_emulation"
    own, emulated = (root / "own", root / "emulated")
    runs = [
        {"label": "own", "engine": {"max_num_batched_tokens": BUDGET,
                                    "cpp_config": cpp_on(own, target="fixed")},
         "batches": BATCHES},
        {"label": "emulated", "engine": {"max_num_batched_tokens": 4 * BUDGET,
                                         "cpp_config": cpp_on(emulated)},
         "batches": [{**b, "bench_policy": {"mode": "fixed", "budget": BUDGET}}
                     for b in BATCHES]},
    ]
    a, b = run_engine_jobs(root, runs, env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    steps_a, steps_b = _steps(a.trace()), _steps(b.trace())
    assert steps_a, "the reference engine traced no step"
    # The larger engine would have scheduled 2048-token chunks without the override.
    assert max(s[2] for s in steps_b) == BUDGET
    assert len(steps_a) == len(steps_b), (len(steps_a), len(steps_b))
    for i, (x, y) in enumerate(zip(steps_a, steps_b)):
        assert x == y, f"step {i}: vLLM's budget scheduled {x}, the emulation {y}"
    # Same steps, same answers.
    for batch in range(len(BATCHES)):
        assert [o["token_ids"] for o in a.outputs(batch)] == \
            [o["token_ids"] for o in b.outputs(batch)]


LENGTHS = [700, 500, 900, 600]
OUT = 3


def test_bench_clients_close_the_loop_and_replay_arrivals_open_loop(engine_root: Path) -> None:
    root = engine_root / "bench_clients"
    # The idle gap: the third prompt arrives long after the first two are served, so only an
    # open-loop driver that waits for it (not one that submits when the engine goes idle)
    # gives it a non-negative wait and the run its full length.
    arrivals = [0.0, 0.0, 2.5, 2.6]
    batches = [{"lengths": LENGTHS, "seed": 21, "max_tokens": OUT, "bench_clients": c}
               for c in ({"k": 2}, {"arrivals": arrivals})]
    (run,) = run_engine_jobs(root, [{"label": "clients", "engine": {
        "max_num_batched_tokens": 512, "cpp_config": cpp_on(root / "clients")},
        "batches": batches}], env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    closed, replay = (run.result["batches"][i]["bench"] for i in range(2))
    for figures in (closed, replay):
        assert figures["output_tokens"] == OUT * len(LENGTHS)
        assert all(0 < t <= e for t, e in zip(figures["ttfts_s"], figures["e2e_s"]))
    # Closed loop with 2 clients: both start at once, and a later prompt is submitted only
    # when a client's last request has finished, so never more than 2 are in flight.
    got = closed["arrivals_s"]
    assert got[:2] == [0.0, 0.0]
    finishes = sorted(a + e for a, e in zip(got, closed["e2e_s"]))
    assert got[2] >= finishes[0] and got[3] >= finishes[1]
    for t in got:
        assert sum(a <= t < a + e for a, e in zip(got, closed["e2e_s"])) <= 2
    # Open loop: every prompt added at or after its arrival, the arrivals kept as given.
    assert replay["arrivals_s"] == arrivals
    assert all(lag >= 0 for lag in replay["submit_lag_s"])
    assert replay["wall_s"] >= arrivals[-1]
    # The trace saw all four prompts' prefills in each batch.
    assert sum(1 for line in run.trace() for r in line["requests"] if r["history"] == 0) >= 8
