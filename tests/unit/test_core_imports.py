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


def test_only_the_cli_reaches_the_test_bed():
    """The plugin vLLM loads never imports the CPU test bed (vllm_ascend_cpp/testing)."""
    import ast
    from pathlib import Path

    pkg = Path(__file__).resolve().parents[2] / "vllm_ascend_cpp"
    offenders = []
    for path in pkg.rglob("*.py"):
        rel = path.relative_to(pkg)
        if rel.parts[0] == "testing" or rel == Path("cli.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")]
                names += [f"{names[0]}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if any(n.lstrip(".").split(".")[0] == "testing" or ".testing" in n
                   or n.startswith("vllm_ascend_cpp.testing") for n in names):
                offenders.append(str(rel))
    assert offenders == []
