"""The startup profiling report: what was measured, what was fitted, and what it predicts.

:func:`build_report` returns a JSON-ready dict (NaN becomes ``None``); :func:`format_report`
renders it as the block written to the log.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .fit import FitResult
from .latency_model import LatencyModel, pipeline_ttft_ms
from .predictor import ChunkSizePredictor, PlannedChunk
from .settings import CoreSettings

__all__ = ["fixed_plan", "compare_plans", "build_report", "format_report",
           "REPORT_HEADER"]

REPORT_HEADER = "[CPP] startup profiling report"


def fixed_plan(model: LatencyModel | None, prompt_len: int, chunk: int,
               history: int = 0) -> list[PlannedChunk]:
    """The prompt cut into chunks of ``chunk`` tokens (the last one shorter)."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    out = []
    done = 0
    while done < prompt_len:
        n = min(chunk, prompt_len - done)
        ms = model.request_ms(history + done, n) if model is not None else math.nan
        out.append(PlannedChunk(history=history + done, chunk=n, predicted_ms=ms))
        done += n
    return out


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def compare_plans(predictor: ChunkSizePredictor, prompt_len: int, budget: int,
                  stages: int) -> dict:
    """Dynamic plan vs fixed chunks of ``budget`` for one prompt, with predicted TTFTs."""
    model = predictor.model
    dynamic = predictor.plan(prompt_len, budget=budget) if predictor.ready else []
    fixed = fixed_plan(model, prompt_len, budget)
    if model is not None and predictor.ready:
        ttft_dynamic = pipeline_ttft_ms([c.predicted_ms for c in dynamic], stages)
        ttft_fixed = pipeline_ttft_ms([c.predicted_ms for c in fixed], stages)
        ratio = ttft_dynamic / ttft_fixed if ttft_fixed > 0 else math.nan
    else:
        ttft_dynamic = ttft_fixed = ratio = math.nan
    return {
        "prompt_len": prompt_len,
        "budget": budget,
        "pp_size": stages,
        "chunks": [c.to_dict() for c in dynamic],
        "fixed_chunks": [c.to_dict() for c in fixed],
        "ttft_dynamic_ms": _clean(ttft_dynamic),
        "ttft_fixed_ms": _clean(ttft_fixed),
        "ttft_ratio": _clean(ratio),
    }


def build_report(*, model: LatencyModel | None, fit: FitResult | None,
                 sizes: Sequence[float], latencies_ms: Sequence[float],
                 settings: CoreSettings, predictor: ChunkSizePredictor, state: Any,
                 source: str = "sweep", fallback_reason: str = "") -> dict:
    """Everything the observability contract asks of the startup report, as a dict."""
    reference = settings.reference_prompt_len or 8 * settings.base_chunk
    plans = compare_plans(predictor, reference, settings.sweep_top, settings.pp_size)
    return {
        "source": source,
        "state": getattr(state, "value", state),
        "fallback_reason": fallback_reason,
        "samples": [{"size": _clean(float(s)), "latency_ms": _clean(float(t))}
                    for s, t in zip(sizes, latencies_ms, strict=False)],
        "coefficients": model.to_dict() if model is not None else None,
        "fit": fit.to_dict() if fit is not None else None,
        "target_ms": _clean(predictor.target_ms) if predictor.target_ms is not None else None,
        "base_chunk": settings.base_chunk,
        "smooth_factor": settings.smooth_factor,
        "min_chunk": predictor.min_chunk,
        "alignment": predictor.alignment,
        "reference_prompt_len": reference,
        "pp_size": settings.pp_size,
        "dynamic_plan": plans["chunks"],
        "fixed_plan": plans["fixed_chunks"],
        "ttft_dynamic_ms": plans["ttft_dynamic_ms"],
        "ttft_fixed_ms": plans["ttft_fixed_ms"],
        "ttft_ratio": plans["ttft_ratio"],
    }


# What each calibration mode (ProfilingChunkManager.calibration) means for the operator.
CALIBRATION_MODES = {
    "dynamic": "dynamic chunking on",
    "rescue": "fixed chunks; timing a share of steps until an online fit turns dynamic "
              "chunking on",
    "gave-up": "fixed chunks after online calibration gave up; timing a few steps to retry",
    "off": "fixed chunks for good",
}


def _ms(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def format_chunk_table(dynamic: Sequence[dict], fixed: Sequence[dict]) -> list[str]:
    """Dynamic and fixed plans side by side, one chunk per row."""
    header = (f"{'#':>4}  {'history':>9} {'chunk':>7} {'pred ms':>9}   |"
              f"  {'history':>9} {'chunk':>7} {'pred ms':>9}")
    title = f"{'':>4}  {'dynamic':^27}   |  {'fixed':^27}".rstrip()
    lines = [title, header, "-" * len(header)]
    for i in range(max(len(dynamic), len(fixed))):
        left = dynamic[i] if i < len(dynamic) else None
        right = fixed[i] if i < len(fixed) else None
        cells = []
        for row in (left, right):
            if row is None:
                cells.append(f"{'':>9} {'':>7} {'':>9}")
            else:
                cells.append(f"{row['history']:>9} {row['chunk']:>7} "
                             f"{_ms(row['predicted_ms']):>9}")
        lines.append(f"{i + 1:>4}  {cells[0]}   |  {cells[1]}".rstrip())
    return lines


def format_report(report: dict) -> str:
    """The report as a multi-line block for the log."""
    lines = [f"{REPORT_HEADER} (source: {report.get('source', '?')}, "
             f"state: {report.get('state', '?')})"]
    if report.get("fallback_reason"):
        lines.append(f"  fallback: {report['fallback_reason']}")
    calibration = report.get("calibration")
    if calibration in CALIBRATION_MODES:
        lines.append(f"  calibration: {calibration} ({CALIBRATION_MODES[calibration]})")
    samples = report.get("samples") or []
    if samples:
        sizes = [s["size"] for s in samples if s["size"] is not None]
        lines.append(f"  samples: {len(samples)} single-request prefills, sizes "
                     f"{int(min(sizes)) if sizes else '?'}..{int(max(sizes)) if sizes else '?'}")
        per_line = 6
        for start in range(0, len(samples), per_line):
            chunk = samples[start:start + per_line]
            cells = [f"{int(s['size']) if s['size'] is not None else '?':>6}:"
                     f"{_ms(s['latency_ms']):>9}" for s in chunk]
            lines.append("    " + "  ".join(cells))
    coef = report.get("coefficients")
    if coef:
        lines.append(f"  model: t = c + gamma*L + b*x + a*(2Lx + x^2) + d*x^2 ms with "
                     f"a={coef['a']:.4g} b={coef['b']:.4g} c={coef['c']:.4g} "
                     f"gamma={coef['gamma']:.4g} d={coef.get('d', 0.0):.4g}")
    else:
        lines.append("  model: none")
    fit = report.get("fit")
    if fit:
        r2 = _ms(fit.get("r2"), 4)
        rel = fit.get("rel_residual")
        rel_text = f"{rel:.2%}" if isinstance(rel, float) else "n/a"
        status = "ok" if fit.get("ok") else f"rejected: {fit.get('reason')}"
        lines.append(f"  fit: {status}; R^2={r2}, median relative residual={rel_text}, "
                     f"used {fit.get('n_used')}/{fit.get('n_samples')} "
                     f"(rejected {fit.get('n_rejected')}, outliers {fit.get('n_outliers')})")
    lines.append(f"  target: {_ms(report.get('target_ms'))} ms per chunk "
                 f"(base chunk {report.get('base_chunk')}, smooth {report.get('smooth_factor')}, "
                 f"min chunk {report.get('min_chunk')}, alignment {report.get('alignment')})")
    auto = report.get("auto_target")
    if auto:
        lines.append(f"  target auto: {_ms(auto.get('target_ms'))} ms chosen for the reference "
                     f"prompt at pp={report.get('pp_size')} (base target "
                     f"{_ms(auto.get('base_target_ms'))} ms); each step re-chooses from the "
                     f"prefill queue")
    dynamic = report.get("dynamic_plan") or []
    fixed = report.get("fixed_plan") or []
    lines.append(f"  plan for a {report.get('reference_prompt_len')}-token prompt "
                 f"at pp={report.get('pp_size')}:")
    lines.extend("    " + line for line in format_chunk_table(dynamic, fixed))
    ratio = report.get("ttft_ratio")
    lines.append(f"  predicted TTFT: dynamic {_ms(report.get('ttft_dynamic_ms'), 1)} ms "
                 f"({len(dynamic)} chunks) vs fixed {_ms(report.get('ttft_fixed_ms'), 1)} ms "
                 f"({len(fixed)} chunks); ratio {_ms(ratio, 3)}")
    return "\n".join(lines)
