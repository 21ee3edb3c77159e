"""The startup report: pipeline TTFT arithmetic, plans, and the log block."""

from __future__ import annotations

import json
import math

import pytest

from vllm_ascend_cpp.core.latency_model import LatencyModel
from vllm_ascend_cpp.core.manager import CppState
from vllm_ascend_cpp.core.predictor import ChunkSizePredictor
from vllm_ascend_cpp.core.report import (
    REPORT_HEADER,
    build_report,
    compare_plans,
    fixed_plan,
    format_report,
    pipeline_ttft_ms,
)
from vllm_ascend_cpp.core.settings import CoreSettings

MODEL = LatencyModel(a=1e-7, b=0.02, c=30.0)


def test_pipeline_ttft():
    assert pipeline_ttft_ms([10.0, 20.0, 30.0], 1) == 60.0
    assert pipeline_ttft_ms([10.0, 20.0, 30.0], 4) == 60.0 + 3 * 30.0
    assert pipeline_ttft_ms([], 4) == 0.0
    with pytest.raises(ValueError):
        pipeline_ttft_ms([1.0], 0)


def test_equal_steps_beat_growing_steps_of_the_same_total():
    assert pipeline_ttft_ms([25.0] * 4, 4) < pipeline_ttft_ms([10.0, 20.0, 30.0, 40.0], 4)


def test_fixed_plan():
    plan = fixed_plan(MODEL, 20000, 8192)
    assert [c.chunk for c in plan] == [8192, 8192, 3616]
    assert [c.history for c in plan] == [0, 8192, 16384]
    assert plan[1].predicted_ms == pytest.approx(MODEL.request_ms(8192, 8192))
    assert all(math.isnan(c.predicted_ms) for c in fixed_plan(None, 100, 64))


def test_compare_plans_dynamic_wins_on_a_long_prompt():
    p = ChunkSizePredictor(MODEL, base_chunk=16384)
    out = compare_plans(p, 131072, 16384, 4)
    assert out["ttft_dynamic_ms"] < out["ttft_fixed_ms"]
    assert sum(c["chunk"] for c in out["chunks"]) == 131072
    assert len(out["fixed_chunks"]) == 8


def test_build_report_without_model_is_still_json():
    settings = CoreSettings(base_chunk=4096)
    p = ChunkSizePredictor(None, base_chunk=4096)
    r = build_report(model=None, fit=None, sizes=[4096.0], latencies_ms=[math.nan],
                     settings=settings, predictor=p, state=CppState.FIXED_FALLBACK,
                     source="sweep", fallback_reason="no samples")
    json.dumps(r, allow_nan=False)
    assert r["coefficients"] is None and r["dynamic_plan"] == [] and r["ttft_ratio"] is None
    text = format_report(r)
    assert text.splitlines()[0].startswith(REPORT_HEADER)
    assert "no samples" in text and "model: none" in text
