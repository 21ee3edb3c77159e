"""The pipeline simulator: vLLM's batch-queue engine and scheduling walk, the plugin's own
planner, closed-loop clients, and the figures it reports."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace

import pytest

from vllm_ascend_cpp.cli import main
from vllm_ascend_cpp.core.latency_model import LatencyModel, pipeline_ttft_ms
from vllm_ascend_cpp.core.predictor import ChunkSizePredictor
from vllm_ascend_cpp.core.report import fixed_plan
from vllm_ascend_cpp.sim import (
    EngineSpec,
    Policy,
    Timeline,
    Workload,
    host_ms_from_trace,
    load_profile,
    pipeline_spans,
    refit_from_trace,
    simulate_policy,
    simulate_trace_policy,
)
from vllm_ascend_cpp.sim.engine import SimRequest, SimScheduler
from vllm_ascend_cpp.sim.timeline import StepSpan, cv
from vllm_ascend_cpp.sim.trace_view import trace_summary, trace_timeline

K = 1024
MODEL = LatencyModel(a=2e-7, b=0.0064, c=18.0, gamma=5e-4)
REMOTE = dict(decode="remote", remote_tpot_ms=5.0)


def engine(stages: int = 4, **kw) -> EngineSpec:
    return EngineSpec(stages=stages, model=MODEL, **kw)


def test_sim_does_not_import_vllm_or_torch():
    code = ("import sys, vllm_ascend_cpp.sim, vllm_ascend_cpp.sim.plots; "
            "print(','.join(m for m in ('vllm', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == ""


# -- one request: the pipeline formula ------------------------------------------------------

@pytest.mark.parametrize("stages", [2, 4])
def test_one_prompt_fixed_matches_the_pipeline_formula(stages):
    wl = Workload(prompt_len=100_000, num_requests=2, **REMOTE)
    r = simulate_policy(engine(stages), Policy("fixed", 16 * K), wl)
    want = pipeline_ttft_ms([c.predicted_ms for c in fixed_plan(MODEL, 100_000, 16 * K)],
                            stages)
    assert r.ttft_ms == pytest.approx([want, want])
    assert r.prefill_steps == 2 * math.ceil(100_000 / (16 * K))


def test_one_prompt_cpp_base_runs_the_predictor_plan():
    wl = Workload(prompt_len=100_000, num_requests=1, **REMOTE)
    r = simulate_policy(engine(), Policy("cpp-base", 16 * K), wl, record_timeline=True)
    p = ChunkSizePredictor(MODEL, base_chunk=16 * K, min_chunk=4096)
    plan = p.plan(100_000, budget=16 * K)
    assert [s.items[0][2] for s in r.timeline.steps] == [c.chunk for c in plan]
    assert r.plan_mismatches == 0
    # Near-equal steps: the pipeline formula, up to the batch queue (at most 4 in flight)
    # holding back a step behind a slightly slower one.
    formula = pipeline_ttft_ms([c.predicted_ms for c in plan], 4)
    assert r.ttft_ms[0] == pytest.approx(formula, rel=2e-3)


def test_auto_beats_base_and_fixed_for_one_long_prompt():
    wl = Workload(prompt_len=128 * K, num_requests=1, **REMOTE)
    got = {k: simulate_policy(engine(), Policy(k, 16 * K), wl).mean_ttft_ms
           for k in ("fixed", "cpp-base", "cpp-auto")}
    assert got["cpp-auto"] < got["fixed"] and got["cpp-auto"] <= got["cpp-base"] * 1.001


# -- engine mechanics -------------------------------------------------------------------------

def test_decode_waits_for_its_previous_token():
    wl = Workload(prompt_len=5000, num_requests=1, output_len=6)
    r = simulate_policy(engine(3), Policy("fixed", 8192), wl, record_timeline=True)
    steps = r.timeline.steps
    assert len(steps) == 1 + 5  # one prefill step, then 5 decodes
    for prev, nxt in zip(steps, steps[1:]):
        assert nxt.starts[0] >= prev.ends[-1]  # the token came back before the next step


def test_prefill_chunks_overlap_but_never_more_than_stages_in_flight():
    wl = Workload(prompt_len=64 * K, num_requests=3, concurrency=3, **REMOTE)
    r = simulate_policy(engine(4), Policy("fixed", 4096), wl, record_timeline=True)
    steps = r.timeline.steps
    assert steps[1].starts[0] < steps[0].ends[-1]  # chunk 2 entered before chunk 1 left
    for k in range(4, len(steps)):
        assert steps[k].starts[0] >= steps[k - 4].ends[-1] - 1e-9
    for s in steps:  # stages in order, no stage runs two steps at once
        assert all(a <= b + 1e-9 for a, b in zip(s.ends, s.starts[1:]))
    for s in range(4):
        spans = sorted((st.starts[s], st.ends[s]) for st in steps)
        assert all(e <= n + 1e-9 for (_, e), (n, _) in zip(spans, spans[1:]))


def test_scheduler_walk_is_vllms():
    sched = SimScheduler(budget=1000, max_num_seqs=3)
    running = SimRequest("a", 5000, 4, 0.0)
    running.num_computed_tokens = 5000
    running.num_output_tokens = 1          # decode ready: needs 1 token
    inflight = SimRequest("b", 5000, 4, 0.0)
    inflight.num_computed_tokens = 5000    # token not back yet: needs 0, skipped
    sched.running = [running, inflight]
    sched.waiting.extend([SimRequest("c", 3000, 4, 0.0), SimRequest("d", 3000, 4, 0.0)])
    out = sched.schedule(1000, 600)
    assert [(r.request_id, n) for r, n in out] == [("a", 1), ("c", 600)]
    # max_num_seqs = 3: "d" stays waiting even though budget is left.
    assert [r.request_id for r in sched.running] == ["a", "b", "c"]
    # The prefill cap only applies when more than one request is eligible (vLLM 0.32).
    lone = SimScheduler(budget=1000, max_num_seqs=3)
    lone.waiting.append(SimRequest("x", 3000, 4, 0.0))
    assert [n for _, n in lone.schedule(1000, 200)] == [1000]


def test_closed_loop_keeps_concurrency_and_remote_decode_delays_the_next_request():
    wl = Workload(prompt_len=10_000, concurrency=2, num_requests=6, decode="remote",
                  remote_tpot_ms=100.0)
    r = simulate_policy(engine(2), Policy("fixed", 8192), wl)
    assert len(r.ttft_ms) == 6
    # Each client waits 127 * 100 ms between its requests: the run takes at least that twice.
    assert r.makespan_ms >= 2 * 127 * 100.0
    assert r.throughput_tok_s == pytest.approx(6 * (10_000 + 128) / (r.makespan_ms / 1000))


@pytest.mark.parametrize("kind", ["fixed", "cpp-base", "cpp-auto"])
def test_replaying_a_closed_loops_arrivals_reproduces_it(kind):
    # The replay pushes every arrival up front instead of on each completion: the same
    # submission times must give the same run, step for step.
    wl = Workload(prompt_len=6000, concurrency=2, num_requests=6, variable=True, seed=1,
                  output_len=16)
    closed = simulate_policy(engine(2), Policy(kind, 2048), wl)
    assert closed.arrival_ms[:2] == [0.0, 0.0] and closed.arrival_ms[2] > 0
    again = simulate_policy(engine(2), Policy(kind, 2048),
                            replace(wl, arrivals_ms=tuple(closed.arrival_ms)))
    assert again.arrival_ms == closed.arrival_ms
    assert again.ttft_ms == closed.ttft_ms and again.steps == closed.steps


def test_replayed_arrivals_do_not_wait_for_completions():
    # One client, two prompts: closed loop, the second waits for the first; replayed at t=0,
    # both are queued at once and the second's TTFT includes the first's prefill.
    wl = Workload(prompts=(4000, 4000), concurrency=1, output_len=4)
    closed = simulate_policy(engine(2), Policy("fixed", 1024), wl)
    both = simulate_policy(engine(2), Policy("fixed", 1024), replace(wl, arrivals_ms=(0.0, 0.0)))
    assert closed.arrival_ms[1] > 0 and both.arrival_ms == [0.0, 0.0]
    assert both.ttft_ms[1] > closed.ttft_ms[1]
    assert both.makespan_ms < closed.makespan_ms
    late = simulate_policy(engine(2), Policy("fixed", 1024),
                           replace(wl, arrivals_ms=(0.0, 1e6)))
    # Arriving to an idle engine, the second prompt is served as the first was.
    assert late.ttft_ms[1] == pytest.approx(late.ttft_ms[0])


@pytest.mark.parametrize("times", [(0.0,), (5.0, 1.0), (0.0, -1.0), (0.0, math.inf)])
def test_bad_arrival_times_raise(times):
    with pytest.raises(ValueError, match="arrivals_ms"):
        Workload(prompts=(10, 10), arrivals_ms=times)


def test_variable_prompts_are_seeded_and_in_range():
    wl = Workload(prompt_len=1000, num_requests=50, variable=True, seed=3)
    lens = wl.prompt_lengths()
    assert lens == Workload(prompt_len=1000, num_requests=50, variable=True,
                            seed=3).prompt_lengths()
    assert all(500 <= n <= 1500 for n in lens) and len(set(lens)) > 10
    assert Workload(prompts=(5, 7)).prompt_lengths() == [5, 7]


def test_bad_inputs_raise():
    with pytest.raises(ValueError):
        Policy("magic", 100)
    with pytest.raises(ValueError):
        Policy.parse("fixed")
    with pytest.raises(ValueError):
        Workload(decode="nowhere")
    with pytest.raises(ValueError):
        simulate_policy(engine(1), Policy("cpp-auto", 100), Workload(prompt_len=10))


# -- figures ------------------------------------------------------------------------------------

def test_bubble_fraction_and_cv_by_hand():
    # Two stages, two steps of 1 and 3 ms: stage 0 busy [0,1] [1,4]; stage 1 [1,2] [4,7].
    spans = pipeline_spans([1.0, 3.0], 2)
    assert spans == [([0.0, 1.0], [1.0, 2.0]), ([1.0, 4.0], [4.0, 7.0])]
    tl = Timeline(2, [StepSpan(k, [("r", 0, 1, True)], t, s, e)
                      for k, (t, (s, e)) in enumerate(zip([1.0, 3.0], spans))], [(0.0, 7.0)])
    # Idle inside [0, 7]: stage 0 for 3 ms, stage 1 for 1 + 2 = 3 ms, of 14 stage-ms.
    assert tl.bubble_fraction() == pytest.approx(6 / 14)
    assert tl.prefill_step_cv() == pytest.approx(cv([1.0, 3.0])) == pytest.approx(0.5)
    assert math.isnan(cv([1.0]))
    assert pipeline_spans([2.0, 2.0, 2.0], 2, max_in_flight=1)[1][0][0] == 4.0


# -- profiles and the validation hook ----------------------------------------------------------

REPORT = {"coefficients": MODEL.to_dict(), "base_chunk": 8192, "min_chunk": 2048,
          "alignment": 64, "pp_size": 2, "smooth_factor": 1.0, "target_mode": "auto"}


def test_load_profile_reads_reports_and_cached_profiles(tmp_path):
    info = load_profile(REPORT)
    assert info.model == MODEL and info.base_chunk == 8192 and info.min_chunk == 2048
    assert info.pp_size == 2 and info.block_size == 16 and info.target_mode == "auto"
    cached = {"key": "x", "profile": {"model": MODEL.to_dict(),
                                      "settings": {"base_chunk": 4096, "min_chunk": 1024,
                                                   "block_size": 128, "pp_size": 4}}}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(cached))
    info = load_profile(str(path))
    assert (info.base_chunk, info.block_size, info.pp_size) == (4096, 128, 4)
    swept = load_profile({**REPORT, "sweep": {"total_ms_by_worker": {"pp0/tp0": 50.0,
                                                                      "pp1/tp0": 100.0}}})
    assert swept.stage_scale == (0.5, 1.0)
    assert load_profile({**REPORT, "sweep": {"total_ms_by_worker": {"pp0/tp0": 5}}}) \
        .stage_scale is None
    with pytest.raises(ValueError):
        load_profile({"coefficients": {"a": -1, "b": 0, "c": 0}})
    with pytest.raises(ValueError):
        load_profile({"nothing": 1})


def test_simulate_trace_policy_predicts_each_policy():
    got = {}
    for kind in ("fixed", "cpp-base", "cpp-auto"):
        r = simulate_trace_policy(REPORT, policy=kind, prompt_len=20_000, num_requests=2,
                                  output_len=4)
        got[kind] = r.mean_ttft_ms
        assert r.stages == 2 and len(r.ttft_ms) == 2
    assert got["cpp-auto"] <= got["fixed"]
    replay = simulate_trace_policy(REPORT, policy="fixed", prompt_lens=[1000, 3000],
                                   output_len=2, sched_ms=1.0)
    assert replay.prompt_lens == [1000, 3000]
    with pytest.raises(ValueError):
        simulate_trace_policy(REPORT, policy="fixed")


def test_simulate_trace_policy_replays_given_arrivals():
    lens = [6000, 6000, 6000]
    alone = simulate_trace_policy(REPORT, policy="cpp-base", prompt_lens=lens[:1],
                                  output_len=4).mean_ttft_ms
    # Arrivals far enough apart that nobody queues: every prompt is served as if alone,
    # though three clients would have sent all three at once.
    apart = simulate_trace_policy(REPORT, policy="cpp-base", prompt_lens=lens, output_len=4,
                                  concurrency=3, arrivals_ms=[0.0, 1e6, 2e6])
    assert apart.ttft_ms == pytest.approx([alone] * 3, rel=1e-6)
    together = simulate_trace_policy(REPORT, policy="cpp-base", prompt_lens=lens,
                                     output_len=4, concurrency=3)
    assert together.mean_ttft_ms > 1.5 * alone
    with pytest.raises(ValueError):  # one time per prompt
        simulate_trace_policy(REPORT, policy="fixed", prompt_lens=lens, arrivals_ms=[0.0])
    with pytest.raises(ValueError):  # times need prompts to belong to
        simulate_trace_policy(REPORT, policy="fixed", prompt_len=1000, arrivals_ms=[0.0])


def test_refit_from_trace_recovers_the_model_and_feeds_the_prediction():
    lines = []
    for k in range(60):
        L, x = (k * 1543) % 60_000, 512 + (k * 977) % 8000
        lines.append({"requests": [{"id": "r", "history": L, "chunk": x}], "decodes": 0,
                      "measured_ms": MODEL.request_ms(L, x) * (1 + 0.01 * ((-1) ** k))})
    lines.append({"requests": [{"id": "r", "history": 0, "chunk": 64}], "decodes": 3,
                  "measured_ms": 1e6})  # decodes' contexts are unknown: left out
    fitted = refit_from_trace(lines)
    assert fitted is not None
    assert fitted.request_ms(30_000, 4096) == pytest.approx(MODEL.request_ms(30_000, 4096),
                                                            rel=0.05)
    assert refit_from_trace([]) is None
    doubled = LatencyModel(a=2 * MODEL.a, b=2 * MODEL.b, c=2 * MODEL.c, gamma=2 * MODEL.gamma)
    slow = simulate_trace_policy(REPORT, policy="fixed", prompt_lens=[20_000], output_len=2,
                                 model=doubled)
    fast = simulate_trace_policy(REPORT, policy="fixed", prompt_lens=[20_000], output_len=2)
    assert slow.mean_ttft_ms == pytest.approx(2 * fast.mean_ttft_ms)


def test_refit_from_trace_prices_decodes_from_the_decode_steps():
    # Prefills of one chunk size cannot split gamma*L from a*2*L*x (both grow with L alone);
    # a decode takes gamma*L whole, so only steps that carry decodes pin what one costs.
    true = LatencyModel(a=3e-6, b=0.02, c=1.5, gamma=2e-5, d=2e-6)
    samples = [{"size": float(x), "latency_ms": true.request_ms(0, x)}
               for x in range(128, 8193, 128)]
    prefills = [{"requests": [{"id": "r", "history": L, "chunk": 1024}], "decodes": 0,
                 "measured_ms": true.request_ms(L, 1024) * (1 + 0.02 * ((-1) ** (L // 1024)))}
                for L in range(0, 15361, 1024)]
    decoding = []
    for k in range(24):
        n, ctx = 1 + k % 4, 4000 + 500 * k
        items = [(ctx + i, 1) for i in range(n)]
        pre = [(8000 + 128 * k, 512)] if k % 2 else []
        decoding.append({"requests": [{"id": "p", "history": L, "chunk": x} for L, x in pre],
                         "decodes": n, "decode_history": sum(h for h, _ in items),
                         "decode_tokens": n, "measured_ms": true.step_ms(pre + items)})
    three = [(16000, 1)] * 3
    fitted = refit_from_trace(prefills + decoding, samples)
    assert fitted is not None
    assert fitted.step_ms(three) == pytest.approx(true.step_ms(three), rel=0.05)
    prefill_only = refit_from_trace(prefills, samples)
    assert prefill_only is not None
    assert abs(prefill_only.step_ms(three) / true.step_ms(three) - 1) > 0.2
    assert fitted.request_ms(12000, 1024) == pytest.approx(true.request_ms(12000, 1024), rel=0.03)
    # The same decode steps without their context (older traces), or with speculative
    # tokens (the sums would not be exact), are left out, not guessed.
    blind = [dict(ln, decode_history=None) for ln in decoding]
    spec = [dict(ln, decode_tokens=ln["decodes"] + 1) for ln in decoding]
    for extra in (blind, spec):
        other = refit_from_trace(prefills + extra, samples)
        assert other is not None and other.to_dict() == prefill_only.to_dict()


def test_refit_from_a_fixed_chunk_trace_needs_the_sweep():
    # One chunk size: x and x^2 are constant, so b and c cannot be told apart from the trace
    # alone; the sweep's L = 0 samples pin them.
    true = LatencyModel(a=2.7e-6, b=0.02, c=1.5, gamma=1e-4, d=2.7e-6)
    lines = [{"requests": [{"id": "r", "history": L, "chunk": 1024}], "decodes": 0,
              "measured_ms": true.request_ms(L, 1024)} for L in range(0, 15361, 1024)]
    assert refit_from_trace(lines) is None
    samples = [{"size": float(x), "latency_ms": true.request_ms(0, x)}
               for x in range(128, 8193, 128)]
    fitted = refit_from_trace(lines, samples)
    assert fitted is not None
    for L, x in ((15360, 1024), (8000, 4096), (0, 512)):
        assert fitted.request_ms(L, x) == pytest.approx(true.request_ms(L, x), rel=0.02)


# -- traces -------------------------------------------------------------------------------------

def _trace_lines() -> list[dict]:
    lines = []
    t = 1000.0
    for k, (h, n) in enumerate([(0, 4096), (4096, 4096), (8192, 2048)]):
        ms = MODEL.request_ms(h, n)
        t += ms / 1000
        lines.append({"step": k + 1, "time": t, "state": "calibrating",
                      "requests": [{"id": "r0", "history": h, "chunk": n}], "decodes": 0,
                      "num_tokens": n, "planned_budget": n, "prefill_cap": 0,
                      "predicted_ms": ms * 1.05, "measured_ms": ms if k != 1 else None})
    lines.append({"step": 4, "time": t + 0.01, "state": "calibrating", "requests": [],
                  "decodes": 1, "num_tokens": 1, "planned_budget": None,
                  "prefill_cap": None, "predicted_ms": 18.0, "measured_ms": None})
    return lines


def test_trace_timeline_and_summary():
    lines = _trace_lines()
    tl = trace_timeline(lines, 2)
    assert len(tl.steps) == 4
    # Timed steps use the measurement, the untimed one its prediction.
    assert tl.steps[0].stage_ms == pytest.approx(MODEL.request_ms(0, 4096))
    assert tl.steps[1].stage_ms == pytest.approx(1.05 * MODEL.request_ms(4096, 4096))
    for a, b in zip(tl.steps, tl.steps[1:]):
        assert b.starts[0] >= a.ends[0] - 1e-9 and b.starts[1] >= a.ends[1] - 1e-9
    s = trace_summary(lines, 2)
    assert s["steps"] == 4 and s["prefill_steps"] == 3 and s["timed_steps"] == 2
    assert s["requests"]["r0"]["chunks"] == [4096, 4096, 2048]
    assert s["median_prediction_error"] == pytest.approx(0.05)
    assert 0.0 <= s["bubble_fraction"] < 1.0


# -- the CLI ------------------------------------------------------------------------------------

def test_cli_simulate_json(capsys):
    argv = ["simulate", "--a", "2e-7", "--b", "0.0064", "--c", "18", "--pp", "4",
            "--prompt-len", "65536", "--budget", "16384", "--decode", "remote",
            "--requests", "2", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    names = [r["policy"] for r in out["results"]]
    assert names == ["fixed@16384", "cpp-base@16384", "cpp-auto@16384"]
    ttft = {r["policy"]: r["mean_ttft_ms"] for r in out["results"]}
    assert ttft["cpp-auto@16384"] < ttft["fixed@16384"]
    assert main([*argv[:-1], "--policy", "fixed:8192"]) == 0
    assert "fixed@8192" in capsys.readouterr().out


def test_cli_simulate_with_a_profile(tmp_path, capsys):
    path = tmp_path / "trace.jsonl.report.json"
    path.write_text(json.dumps(REPORT))
    assert main(["simulate", "--profile", str(path), "--prompt-len", "20000",
                 "--requests", "1", "--output-len", "2", "--policy", "cpp-auto"]) == 0
    assert "cpp-auto@8192" in capsys.readouterr().out


@pytest.mark.parametrize("argv,msg", [
    (["simulate", "--prompt-len", "100"], "no latency model"),
    (["simulate", "--a", "1", "--prompt-len", "100"], "missing coefficient"),
    (["simulate", "--a", "1", "--b", "1", "--c", "1", "--prompt-len", "100"], "--budget"),
    (["simulate", "--a", "1", "--b", "1", "--c", "1", "--prompt-len", "100", "--budget", "64",
      "--pp", "1"], "--pp"),
    (["simulate", "--a", "1", "--b", "1", "--c", "1", "--prompt-len", "100", "--budget", "64",
      "--policy", "best"], "KIND"),
    (["report", "--trace", "/nonexistent/trace.jsonl"], "cannot read trace"),
])
def test_cli_errors_exit_2(argv, msg, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("vllm-cpp: error:") and msg in err


def test_cli_report_text_and_json(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in _trace_lines()) + "\n")
    assert main(["report", "--trace", str(path), "--pp", "2"]) == 0
    text = capsys.readouterr().out
    assert "4 steps" in text and "median prediction error 5.0%" in text and "r0" in text
    (tmp_path / "t.jsonl.report.json").write_text(json.dumps({**REPORT, "pp_size": 3}))
    assert main(["report", "--trace", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["traces"][0]["stages"] == 3


def test_host_time_from_trace_uses_back_to_back_prefill_steps():
    def line(t, meas, prefill=True):
        return {"time": t, "measured_ms": meas, "decodes": 0,
                "requests": [{"id": "r", "history": 0, "chunk": 64}] if prefill else []}

    lines = [line(10.000, 20.0), line(10.023, 20.0), line(10.047, 21.0),
             line(10.300, 2.0, prefill=False),  # decode: the chain breaks here
             line(10.600, 20.0), line(10.624, 21.0)]
    assert host_ms_from_trace(lines) == pytest.approx(3.0)
    assert host_ms_from_trace([line(1.0, 5.0)]) == 0.0
    # A gap shorter than the forward (stages overlapping) is no host time, not negative.
    assert host_ms_from_trace([line(1.0, 5.0), line(1.001, 5.0)]) == 0.0
