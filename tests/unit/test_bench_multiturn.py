"""The multi-turn benchmark's pieces: its workload, its over-target share, the step target the
trace records, and the benchmark-only switch that turns the prefix lookup off."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from vllm_ascend_cpp.core import LatencyModel
from vllm_ascend_cpp.sim import EngineSpec, Policy
from vllm_ascend_cpp.sim.engine import SimRequest, SimScheduler, build_runtime
from vllm_ascend_cpp.trace import TraceWriter

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import multiturn as mt  # noqa: E402

MODEL = LatencyModel(a=2.6e-6, b=0.021, c=0.65, gamma=3.6e-4, d=2.5e-6)
ENGINE = EngineSpec(stages=2, model=MODEL)


def _replies(conv: mt.Conversation, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2048) for _ in range(conv.output_len)] for _ in range(conv.turns)]


# ----- the workload ----------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_every_turn_resends_the_whole_history_and_respects_the_caps(seed: int) -> None:
    out_len = 64
    convs = mt.make_conversations(5, seed=seed, output_len=out_len, max_turns=12)
    assert len(convs) == 5
    for conv in convs:
        assert 1 <= conv.turns <= 12
        replies = _replies(conv, seed)
        prev: list[int] = []
        for turn, message in enumerate(conv.messages):
            assert mt.MESSAGE_MIN <= len(message) <= mt.MESSAGE_MAX
            prompt = conv.prompt(turn, replies[:turn])
            assert len(prompt) == conv.prompt_len(turn)
            assert len(prompt) + out_len <= mt.HISTORY_CAP
            # The history is the previous prompt followed by the model's reply to it, exactly,
            # then the new message.
            if turn:
                assert prompt[:len(prev) + out_len] == prev + replies[turn - 1]
            assert prompt[len(prompt) - len(message):] == list(message)
            prev = prompt
        if conv.turns < 12:
            # Stopped by the cap: a drawn message (at most MESSAGE_MAX) did not fit after it.
            assert conv.prompt_len(conv.turns - 1) + out_len > mt.HISTORY_CAP - mt.MESSAGE_MAX \
                - out_len
    firsts = {c.messages[0][:32] for c in convs}
    assert len(firsts) == len(convs)  # no prefix shared between conversations


def test_the_workload_is_a_function_of_its_seed_and_reaches_long_histories() -> None:
    a = mt.make_conversations(8, seed=3, output_len=32, max_turns=30)
    assert a == mt.make_conversations(8, seed=3, output_len=32, max_turns=30)
    assert a != mt.make_conversations(8, seed=4, output_len=32, max_turns=30)
    longest = max(c.prompt_len(c.turns - 1) + 32 for c in a)
    assert mt.HISTORY_CAP - mt.MESSAGE_MAX - 32 < longest <= mt.HISTORY_CAP
    short = mt.make_conversations(3, seed=3, output_len=32, max_turns=2)
    assert [c.turns for c in short] == [2, 2, 2]
    small = mt.make_conversations(4, seed=5, output_len=16, max_turns=50, message_min=10,
                                  message_max=20, history_cap=200)
    for c in small:
        assert c.prompt_len(c.turns - 1) + 16 <= 200
        assert all(10 <= len(m) <= 20 for m in c.messages)
        assert c.turns < 50


def test_bad_workloads_and_prompts_are_refused() -> None:
    with pytest.raises(ValueError, match="history cap"):
        mt.make_conversations(1, seed=0, output_len=64, max_turns=3, history_cap=4000)
    with pytest.raises(ValueError):
        mt.make_conversations(0, seed=0, output_len=64, max_turns=3)
    conv = mt.make_conversations(1, seed=0, output_len=8, max_turns=3)[0]
    with pytest.raises(ValueError, match="earlier replies"):
        conv.prompt(1, [])
    with pytest.raises(ValueError, match="reply of 7"):
        conv.prompt(1, [[5] * 7])


# ----- the over-target share from a trace ---------------------------------------------------


def _line(reqs: list[tuple[str, int, int]], measured: float | None,
          target: float | None) -> dict:
    return {"requests": [{"id": i, "history": h, "chunk": n} for i, h, n in reqs],
            "measured_ms": measured, "target_ms": target}


def test_over_target_share_from_a_synthetic_trace() -> None:
    lines = [
        _line([("a", 0, 2048)], 40.0, 40.0),          # a starts cold: on target
        _line([("a", 2048, 2048)], 50.1, 40.0),       # 1.2525x: over
        _line([], 5.0, 1.0),                          # decode-only: not a prefill step
        _line([("b", 9000, 3000)], 120.0, 40.0),      # b's first chunk after a hit: over
        _line([("b", 12000, 500)], 49.0, 40.0),       # 1.225x: not over; b seen already
        _line([("c", 6000, 512)], None, 40.0),        # untimed: not counted, but c is seen
        _line([("c", 6512, 512), ("d", 4096, 1000)], 45.0, 40.0),  # d after a hit: not over
        _line([("e", 0, 100)], 30.0, None),           # no target: not counted
        _line([("f", 64, 64)], 50.0, 40.0),           # f after a hit: exactly 1.25x: not over
    ]
    got = mt.over_target(lines)
    assert got == {"steps": 6, "over": 2, "hit_steps": 3, "hit_over": 1, "untimed": 2,
                   "share": pytest.approx(2 / 6), "hit_share": pytest.approx(1 / 3)}
    assert mt.over_target([])["share"] is None


def test_the_trace_records_the_step_target(tmp_path: Path) -> None:
    rt = build_runtime(ENGINE, Policy("cpp-base", 2048))
    sched = SimScheduler(2048, 16)
    req = SimRequest("r0", 16000, 4, 0.0)
    req.num_computed_tokens = 12000  # a long history: the chunk shrinks to meet the target
    sched.running.append(req)
    sched.requests[req.request_id] = req
    plan = rt.plan(sched)
    assert plan is not None and plan.prefill_cap
    chunk = plan.items[0].tokens
    # The chunk is the largest aligned one whose step stays within the recorded target.
    assert MODEL.request_ms(12000, chunk) <= plan.target_ms
    assert MODEL.request_ms(12000, chunk + 64) > plan.target_ms
    # A fixed budget of 2048 records the target CPP base 2048 plans to.
    big = build_runtime(ENGINE, Policy("cpp-base", 8192))
    big.set_bench_policy("fixed", 2048)
    fixed = big.plan(sched)
    assert fixed.token_budget == 2048 and fixed.target_ms == pytest.approx(plan.target_ms)

    writer = TraceWriter(str(tmp_path / "t.jsonl"))
    rec = type("Rec", (), {"plan": plan, "items": [("r0", 12000, chunk, True)], "step": 1,
                           "state": "ready", "preempted": ()})()
    writer.write_step(rec, 44.0, rt.manager)
    writer.close()
    line = json.loads((tmp_path / "t.jsonl").read_text())
    assert line["target_ms"] == pytest.approx(plan.target_ms, abs=1e-4)
    assert mt.over_target([line])["steps"] == 1


# ----- the lookup switch -------------------------------------------------------------------


def _waiting(prompt: int) -> tuple[SimScheduler, SimRequest]:
    sched = SimScheduler(8192, 16)
    req = SimRequest("w0", prompt, 4, 0.0)
    sched.waiting.append(req)
    sched.requests[req.request_id] = req
    return sched, req


def test_the_lookup_switch_hides_and_restores_a_cached_prefix() -> None:
    rt = build_runtime(ENGINE, Policy("cpp-base", 2048))
    looked: list[str] = []

    def lookup(request: SimRequest) -> int:
        looked.append(request.request_id)
        return 12000

    rt.attach_prefix_cache(lookup)
    sched, _ = _waiting(16000)
    with_hit = rt.plan(sched).items[0].tokens
    assert looked == ["w0"]
    rt.set_bench_prefix_lookup(False)
    assert rt.prefix_hits is None
    blind = rt.plan(sched).items[0].tokens
    assert looked == ["w0"]  # no lookup while off
    # Without the lookup the first chunk is sized as if nothing were cached: larger.
    assert blind == 2048 > with_hit
    rt.set_bench_prefix_lookup(True)
    assert rt.plan(sched).items[0].tokens == with_hit
    assert looked == ["w0", "w0"]  # switching back on forgot the kept answer
    with pytest.raises(ValueError):
        rt.set_bench_prefix_lookup("off")  # type: ignore[arg-type]


# ----- the summary --------------------------------------------------------------------------


def _run(ttfts: dict[str, float], over: int, steps: int) -> dict:
    return {"ttft_by_turn_s": ttfts, "load_avg": 1.0, "steps_by_state": {"calibrating": 9},
            "over_target": {"steps": steps, "over": over, "hit_steps": steps, "hit_over": over,
                            "untimed": 0, "share": over / steps, "hit_share": over / steps}}


def test_summary_pairs_turns_by_round_and_differences_shares() -> None:
    runs = {
        "fixed-512": [_run({"1": 1.0, "2": 1.0, "all": 1.0}, 5, 10) for _ in range(3)],
        "cpp-base-2048": [_run({"1": 0.9, "2": 0.5, "all": 0.7}, 1, 10),
                          _run({"1": 0.9, "2": 0.6, "all": 0.7}, 2, 10),
                          _run({"1": 0.9, "all": 0.9}, 0, 10)],
        "cpp-base-2048-nolookup": [_run({"1": 0.9, "2": 1.0, "all": 0.9}, 6, 10)
                                   for _ in range(3)],
    }
    table = mt.summarise(runs)
    assert table["turns"] == ["1", "2", "all"]
    assert table["tuned_fixed"] == "fixed-512"
    turn2 = table["ratios"]["cpp-base-2048"]["fixed-512"]["2"]
    assert turn2["values"] == pytest.approx([0.5, 0.6])  # round 3 had no second turn
    look = table["lookup"]["cpp-base-2048"]
    assert look["ttft"]["2"]["values"] == pytest.approx([0.5, 0.6])
    assert look["share_difference"]["values"] == pytest.approx([-0.5, -0.4, -0.6])
    assert look["share_difference"]["hi"] < 0
    text = mt.markdown(table, {"command": "x", "conversations": 2, "concurrency": 1,
                               "max_turns": 2, "history_cap": 16384, "output_len": 32,
                               "reps": 3, "wall_s": 60.0})
    assert "| cpp-base-2048 | -50.0 pp [-60.0 to -40.0]" in text
    assert "fell back" not in text
    runs["cpp-base-2048"][1]["steps_by_state"] = {"calibrating": 5, "fixed-fallback": 4}
    text = mt.markdown(mt.summarise(runs), {"command": "x", "conversations": 2,
                                            "concurrency": 1, "max_turns": 2,
                                            "history_cap": 16384, "output_len": 32, "reps": 3,
                                            "wall_s": 60.0})
    assert "cpp-base-2048: 4 of 27 steps" in text
