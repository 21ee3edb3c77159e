"""core/ is numpy and scipy only: importing it must not pull in vLLM or torch."""

from __future__ import annotations

import subprocess
import sys


def test_core_and_cli_import_without_vllm_or_torch():
    code = ("import sys, vllm_ascend_cpp.core, vllm_ascend_cpp.cli; "
            "bad = [m for m in ('vllm', 'torch') if m in sys.modules]; "
            "print(','.join(bad))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert proc.stdout.strip() == ""


def test_public_names_are_exported():
    import vllm_ascend_cpp.core as core

    for name in ("LatencyModel", "FitResult", "fit_startup", "fit_rows", "ChunkDecision",
                 "PlannedChunk", "ChunkSizePredictor", "Candidate", "PlannedItem", "StepPlan",
                 "simulate", "StepPlanner", "CalibrationEvent", "OnlineCalibrator", "CppState",
                 "CoreSettings", "ProfilingChunkManager", "pipeline_ttft_ms", "build_report",
                 "format_report"):
        assert hasattr(core, name), name
        assert name in core.__all__
