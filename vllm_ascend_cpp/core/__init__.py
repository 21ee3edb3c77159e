"""The numpy-only core of dynamic chunked pipeline parallelism.

Never imports vLLM or torch: the latency model, its fits, chunk sizing, the per-step planner,
online calibration, the lifecycle manager and the startup report.
"""

from .calibrator import CalibrationEvent, OnlineCalibrator
from .fit import FitResult, fit_rows, fit_startup
from .latency_model import LatencyModel, host_gap_ms, pipeline_ttft_ms
from .manager import CppState, ProfilingChunkManager
from .predictor import ChunkDecision, ChunkSizePredictor, PlannedChunk
from .report import build_report, format_report
from .settings import CoreSettings
from .step_planner import Candidate, PlannedItem, StepPlan, StepPlanner, simulate

__all__ = [
    "CalibrationEvent",
    "Candidate",
    "ChunkDecision",
    "ChunkSizePredictor",
    "CoreSettings",
    "CppState",
    "FitResult",
    "LatencyModel",
    "OnlineCalibrator",
    "PlannedChunk",
    "PlannedItem",
    "ProfilingChunkManager",
    "StepPlan",
    "StepPlanner",
    "build_report",
    "fit_rows",
    "fit_startup",
    "format_report",
    "host_gap_ms",
    "pipeline_ttft_ms",
    "simulate",
]
