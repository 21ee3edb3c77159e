"""The engine the in-process benchmarks build: model shape, engine arguments, CPP settings,
the policy switch and the trace reader.

Shared by bench_engine.py and multiturn.py (serve_bench.py takes the model shape) so that
their figures describe the same engine.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

# A wider MLP than the test model: attention is then 50-80% of the last chunk's cost at 16k
# (printed from the fitted profile), instead of ~95% with the tiny test model.
BENCH_MODEL = {"intermediate_size": 4096, "num_hidden_layers": 2}


def engine_kwargs(args: argparse.Namespace, model_dir: Path, budget: int, cpp: dict) -> dict:
    return dict(
        model=str(model_dir), load_format="dummy", skip_tokenizer_init=True,
        pipeline_parallel_size=2, enforce_eager=True, enable_chunked_prefill=True,
        max_num_batched_tokens=budget, max_model_len=args.max_model_len,
        max_num_seqs=16, dtype=args.dtype, enable_prefix_caching=False,
        distributed_executor_backend="mp", seed=0,
        additional_config={"cpp_config": cpp},
    )


def cpp_settings(trace: Path, work: Path, extra: dict) -> dict:
    # A window larger than the run keeps every step timed (the default times one step in 16
    # once the model predicts well), so the prefill CV covers every step of every policy.
    return {"enabled": True, "trace_file": str(trace), "profile_cache_dir": str(work / "profiles"),
            "sample_repeats": 3, "calibration_window": 8192, **extra}


def bench_mode(pol: dict) -> str:
    return {"fixed": "fixed", "auto": "auto"}.get(pol["cpp"].get("target", "base"), "base")


def use_policy(runtime: Any, pol: dict) -> None:
    """Switch a one-engine runtime to plan as an engine configured with ``pol`` would
    (``CppRuntime.set_bench_policy``: its mode, budget, base chunk and smallest chunk)."""
    runtime.set_bench_policy(bench_mode(pol), pol["budget"], pol["cpp"].get("base_chunk"),
                             pol["cpp"].get("min_chunk"))


class TraceLog:
    """The trace file's lines, parsed once: each read parses only what was appended since.
    A one-engine run writes hundreds of thousands of lines; re-reading them for every cell
    would cost more than the cells."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[dict] = []
        self._pos = 0

    def read(self) -> list[dict]:
        if self.path.exists():
            with open(self.path, "rb") as fh:
                fh.seek(self._pos)
                data = fh.read()
            end = data.rfind(b"\n") + 1  # whole lines only; the writer may be mid-line
            self._pos += end
            self.lines += [json.loads(x) for x in data[:end].splitlines() if x.strip()]
        return self.lines
