"""benchmarks/trace_costs.py on a made-up trace whose departures from the model are known."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import trace_costs  # noqa: E402


def _line(step: int, reqs: list[tuple[int, int]], pred: float, meas: float | None,
          decodes: int = 0) -> dict:
    return {"step": step, "requests": [{"id": f"r{h}", "history": h, "chunk": x}
                                       for h, x in reqs],
            "decodes": decodes, "num_tokens": sum(x for _, x in reqs) + decodes,
            "predicted_ms": pred, "measured_ms": meas}


def test_first_chunks_new_sizes_and_stalls_are_told_apart():
    lines = []
    step = 0
    for k in range(6):
        # A prompt: a first chunk 1.5x its prediction, then later chunks as predicted; the
        # first step of each new token count (here every chunk of prompt 0) 20 ms over.
        for i, x in enumerate((2048, 1536, 1024)):
            step += 1
            pred = 50.0 + i
            meas = pred * (1.5 if i == 0 else 1.0) + (20.0 if k == 0 else 0.0)
            lines.append(_line(step, [(i * 4096, x)], pred, meas))
        step += 1
        lines.append(_line(step, [], 5.0, None, decodes=3))  # untimed decode-only step
    step += 1
    lines.append(_line(step, [(0, 2048), (9000, 512)], 60.0, 1100.0))  # a stall
    res = trace_costs.analyse(lines)
    sp = res["single_prefill"]
    assert set(sp) == {"first 1025-2048", "later 1025-2048", "later 1-1024"}
    assert sp["first 1025-2048"]["median"] == pytest.approx(1.5)
    assert sp["later 1-1024"]["median"] == pytest.approx(1.0)
    tc = res["token_counts"]
    assert tc["distinct_token_counts"] == 5  # 2048, 1536, 1024, the decode step's 3, 2560
    assert tc["new"]["steps"] == 4 and tc["seen"]["steps"] == 15
    assert tc["seen"]["median"] == pytest.approx(0.0)
    assert [s["step"] for s in res["stalls"]] == [step]
    assert res["stalls"][0]["first_chunk"] == 2048
    text = trace_costs.render(res, "python benchmarks/trace_costs.py t.jsonl")
    assert "| first 1025-2048 | 6 | 1.500 |" in text


def test_steps_after_a_pause_are_reported_by_position():
    # Prompts back to back, every 0.1 s; before prompts 2 and 4 the engine pauses 0.8 s. The
    # first step after a pause runs 3x its prediction, the second 1.5x, the rest as predicted.
    lines = []
    step = 0
    now = 0.0
    for k in range(5):
        paused = k in (2, 4)
        if paused:
            now += 0.8
        for i in range(4):
            step += 1
            now += 0.1
            slow = (3.0 if i == 0 else 1.5 if i == 1 else 1.0) if paused else 1.0
            line = _line(step, [(i * 2048, 2048)], 50.0, 50.0 * slow)
            line["time"] = now
            lines.append(line)
    # A pause before a step that only continues a prompt (no first chunk) is not counted.
    lines[6]["time"] += 0.9
    for ln in lines[7:]:
        ln["time"] += 0.9
    res = trace_costs.analyse(lines)["after_pause"]
    assert res["step 0"]["steps"] == 2 and res["step 0"]["median"] == pytest.approx(3.0)
    assert res["step 1"]["median"] == pytest.approx(1.5)
    assert res["step 2"]["median"] == pytest.approx(1.0)
    assert res["later"]["steps"] == 20 - 6 and res["later"]["median"] == pytest.approx(1.0)
    text = trace_costs.render({**trace_costs.analyse(lines)}, "t")
    assert "| step 0 | 2 | 3.000 |" in text


def test_cell_starts_are_timed_from_the_cells_start_to_its_second_result():
    from vllm_ascend_cpp.core.latency_model import LatencyModel

    model = LatencyModel(a=1e-5, b=0.1, c=2.0)
    steps = [[(0, 3840)], [(3840, 2304), (0, 128)], [(6144, 1792)]]
    lines, table = [], {"c4-fixed": {"cpp-auto-8192": {}, "cpp-base-2048": {}}}
    # Auto's cells start 600 ms and 0 ms late over two rounds; base's round has no start.
    for name, start, late, rnd in (("cpp-auto-8192", 100.0, 0.6, 0), ("cpp-auto-8192", 200.0,
                                   0.0, 1), ("cpp-base-2048", 300.0, 0.0, 0)):
        t = start + 2 * model.step_ms(steps[0][:1]) / 1e3 + late
        for i, reqs in enumerate(steps):
            if i:
                t += model.step_ms(reqs) / 1e3
            lines.append({**_line(len(lines) + 1, reqs, 1.0, None), "time": t})
        v = table["c4-fixed"][name]
        v.setdefault("start_wall_per_rep", []).append(start if name != "cpp-base-2048"
                                                      else None)
        v.setdefault("new_shapes_per_rep", []).append(3 - rnd)
    got = trace_costs.cell_start_costs(lines, table, model)
    auto = got["cpp-auto-8192"]
    assert [c["over_ms"] for c in auto["cells"]] == pytest.approx([600.0, 0.0], abs=0.2)
    assert [c["new_shapes"] for c in auto["cells"]] == [3, 2]
    assert auto["over_500ms"] == 1 and "cpp-base-2048" not in got
    text = trace_costs.render({**trace_costs.analyse(lines), "cell_starts": got}, "x")
    assert "| cpp-auto-8192 | 2 | 300 | 300 | 1 | 600 (3), 0 (2) |" in text


def test_host_gaps_per_policy_with_and_without_the_rise():
    """Two cells: fixed chunks whose steps rise 35 ms each and come back the rise late (no
    host work), then equal-cost steps 5 ms apart beyond their forward. The rise shows as host
    time until it is taken out; the equal steps' 5 ms stays either way."""
    lines, t, step = [], 100.0, 0
    for k in range(10):
        step += 1
        pred = 100.0 + 35.0 * k
        t += (pred + (35.0 if k else 0.0)) / 1000.0
        lines.append({**_line(step, [(1024 * k, 1024)], pred, pred), "time": t})
    t += 5.0
    fixed_end = t
    for k in range(10):
        step += 1
        t += 255.0 / 1000.0
        lines.append({**_line(step, [(2048 * k, 2048 - 64 * k)], 250.0, 250.0), "time": t})
    table = {"c2": {"fixed-1024": {"start_wall_per_rep": [100.0]},
                    "cpp-base-2048": {"start_wall_per_rep": [fixed_end - 1.0]}}}
    gaps = trace_costs.host_gaps(lines, table, stages=2)
    assert gaps["fixed-1024"]["steps"] == 9
    assert gaps["fixed-1024"]["raw_median"] == pytest.approx(35.0)
    assert gaps["fixed-1024"]["median"] == pytest.approx(0.0, abs=1e-6)
    assert gaps["cpp-base-2048"]["steps"] == 9
    assert gaps["cpp-base-2048"]["raw_median"] == pytest.approx(5.0)
    assert gaps["cpp-base-2048"]["median"] == pytest.approx(5.0)
    assert "| fixed-1024 | 9 | 35.0 | 0.0 | 0.0 |" in trace_costs.render(
        {**trace_costs.analyse(lines), "host_gaps": gaps}, "cmd")


def _two_stage_results(costs: list[float], host_ms: float, start: float) -> list[float]:
    """Result times (s) of steps run through two stages, each step on a stage for its cost,
    at most two batches in flight: a step is dispatched ``host_ms`` after the result two
    back came in."""
    free = [start * 1e3, start * 1e3]
    ends: list[float] = []
    for k, t in enumerate(costs):
        end = ends[k - 2] + host_ms if k >= 2 else start * 1e3
        for s in range(2):
            end = max(end, free[s]) + t
            free[s] = end
        ends.append(end)
    return [e / 1e3 for e in ends]


def test_result_intervals_find_slow_stretches_and_follow_the_batch_queue():
    """Three cells. Fixed 1024: 100 ms steps back to back, but five in a row come back
    160 ms apart with stage 0 slow, and a decode-only step ends the run. Base: 50 and 150 ms
    steps in turn (decodes in one pipeline phase) run through a two-stage pipeline with no
    host time: their results come 50 and 250 ms apart, all as the model says, and an idle
    gap of 2 s (no request) is no slow step. Auto: the same steps with 5 ms of host time
    before each dispatch, which shows on the heavy steps."""
    lines, t, step = [], 100.0, 0
    for k in range(20):
        step += 1
        slow = 6 <= k < 11
        t += (160.0 if slow else 100.0) / 1e3
        line = {**_line(step, [(1024 * k, 1024)], 100.0, None), "time": t}
        if slow and k % 2 == 0:
            line.update(measured_ms=160.0, stage_ms=[160.0, 100.0])
        lines.append(line)
    t += 0.1
    lines.append({**_line(step + 1, [], 10.0, None, decodes=4), "time": t})
    for k in range(4):  # slow again, but after a decode-only step: four in a row ...
        t += 0.16
        lines.append({**_line(step + 2 + k, [(30000 + 1024 * k, 1024)], 100.0, None),
                      "time": t})
    step += 5
    costs = [50.0 if k % 2 == 0 else 150.0 for k in range(20)]
    table = {"c2-var": {"fixed-1024": {"start_wall_per_rep": [100.0]}}}
    for name, host, start in (("cpp-base-2048", 0.0, t + 1.0), ("cpp-auto-8192", 5.0, t + 10.0)):
        table["c2-var"][name] = {"start_wall_per_rep": [start]}
        ends = _two_stage_results(costs, host, start)
        for k, (cost, end) in enumerate(zip(costs, ends)):
            step += 1
            idle = 2.0 if k >= 10 and name == "cpp-base-2048" else 0.0
            lines.append({**_line(step, [(512 * k, 512)], cost, None, decodes=1),
                          "time": end + idle})
    iv = trace_costs.result_intervals(lines, table, stages=2)
    fixed, base, auto = iv["fixed-1024"], iv["cpp-base-2048"], iv["cpp-auto-8192"]
    assert fixed["intervals"] == 19 + 4 and fixed["median_ratio"] == pytest.approx(1.0)
    # ... of which the first follows a cheap decode-only step, so the model expects it late:
    # three slow in a row, no stretch.
    assert fixed["slow_share"] == pytest.approx((5 + 3) / 23)
    assert fixed["over_by_expected"]["100-200 ms"]["slow_share"] == pytest.approx(8 / 23)
    assert fixed["over_by_expected"]["100-200 ms"]["p90_ratio"] == pytest.approx(1.6)
    (stretch,) = fixed["stretches"]
    assert stretch["steps"] == 5 and stretch["first_step"] == 7
    assert stretch["cell"] == "c2-var round 1"
    assert stretch["over_ms"] == pytest.approx(300.0)
    assert stretch["timed"] == 3 and stretch["stage_over_predicted"] == pytest.approx([1.6, 1.0])
    assert fixed["stretch_over_s"] == pytest.approx(0.3)
    assert base["intervals"] == 18 and base["stretches"] == [] and base["slow_share"] == 0
    assert base["median_ratio"] == pytest.approx(1.0) and base["mean_ratio"] == pytest.approx(1.0)
    assert base["over_s_per_cell"] == {"c2-var round 1": pytest.approx(0.0, abs=1e-6)}
    heavy = auto["over_by_expected"]["200-400 ms"]
    assert heavy["median_ms"] == pytest.approx(5.0, abs=1e-6)
    assert auto["over_by_expected"]["0-100 ms"]["median_ms"] == pytest.approx(0.0, abs=1e-6)
    text = trace_costs.render({**trace_costs.analyse(lines), "intervals": iv}, "cmd")
    assert "| fixed-1024 | c2-var round 1 | 7 | 5 | 0.80 | 300 | 1.60 | 3 | 1.60, 1.00 |" \
        in text
