"""Read a fitted profile (the engine's ``trace_file + ".report.json"``, or a cached profile)
and predict TTFT for a workload: the hook for checking the simulator against a real engine.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from vllm_ascend_cpp.core.fit import fit_rows
from vllm_ascend_cpp.core.latency_model import LatencyModel

from .engine import EngineSpec, Policy, SimResult, Workload, simulate_policy

__all__ = ["ProfileInfo", "host_ms_from_trace", "load_profile", "refit_from_trace",
           "simulate_trace_policy"]


@dataclass(frozen=True)
class ProfileInfo:
    model: LatencyModel
    base_chunk: int | None
    min_chunk: int | None
    block_size: int
    pp_size: int | None
    smooth_factor: float
    target_mode: str
    # Per pipeline stage, its sweep time over the slowest stage's (the model is the slowest).
    stage_scale: tuple[float, ...] | None = None

    def policy(self, kind: str, budget: int | None = None) -> Policy:
        budget = int(budget or self.base_chunk or 0)
        if budget < 1:
            raise ValueError("the profile names no base chunk: give the budget")
        if kind == "fixed":
            return Policy("fixed", budget)
        # The profile's own chunk settings apply when the budget is the one it ran with.
        same = self.base_chunk is not None and budget == self.base_chunk
        return Policy(kind, budget,
                      base_chunk=self.base_chunk if same else None,
                      min_chunk=self.min_chunk if same else None,
                      smooth_factor=self.smooth_factor)


def _int_or_none(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None


def load_profile(source: str | os.PathLike | Mapping) -> ProfileInfo:
    """A report JSON (``coefficients``, ``base_chunk``, ``min_chunk``, ``alignment``,
    ``pp_size``, ...) or a profile-cache JSON (``model`` and ``settings``; the cache file's
    ``profile`` entry is unwrapped). Raises ValueError when there is no usable model."""
    if isinstance(source, Mapping):
        data: Any = source
    else:
        with open(os.path.expanduser(os.fspath(source)), encoding="utf-8") as fh:
            data = json.load(fh)
    if not isinstance(data, Mapping):
        raise ValueError("profile must be a JSON object")
    if isinstance(data.get("profile"), Mapping):
        data = data["profile"]
    coef = data.get("coefficients") or data.get("model")
    if not isinstance(coef, Mapping):
        raise ValueError("profile has no coefficients (report) or model (cached profile)")
    model = LatencyModel.from_dict(coef)
    if not model.is_physical:
        raise ValueError("profile model has a negative coefficient")
    settings = data.get("settings") if isinstance(data.get("settings"), Mapping) else {}

    def pick(key: str) -> Any:
        return data.get(key, settings.get(key))

    block = _int_or_none(settings.get("block_size"))
    if block is None:
        # The report keeps the alignment, max(block_size, 64): any block size up to 64
        # aligns alike.
        align = _int_or_none(data.get("alignment"))
        block = align if align is not None and align > 64 else 16
    smooth = pick("smooth_factor")
    smooth = float(smooth) if isinstance(smooth, (int, float)) and 0 < smooth <= 1 else 1.0
    mode = pick("target_mode")
    pp = _int_or_none(pick("pp_size"))
    return ProfileInfo(model=model, base_chunk=_int_or_none(pick("base_chunk")),
                       min_chunk=_int_or_none(pick("min_chunk")), block_size=block,
                       pp_size=pp, smooth_factor=smooth,
                       target_mode=mode if mode in ("base", "auto") else "base",
                       stage_scale=_stage_scale(data.get("sweep"), pp))


def _stage_scale(sweep: Any, pp: int | None) -> tuple[float, ...] | None:
    """From the report's ``sweep.total_ms_by_worker`` (``"pp{r}/tp{t}": ms``): each stage's
    share of the slowest stage, which is what the fitted model describes."""
    if not isinstance(sweep, Mapping) or not pp:
        return None
    totals = sweep.get("total_ms_by_worker")
    if not isinstance(totals, Mapping):
        return None
    by_stage: dict[int, float] = {}
    for key, ms in totals.items():
        try:
            rank = int(str(key).split("/")[0].removeprefix("pp"))
            value = float(ms)
        except (TypeError, ValueError):
            return None
        if not (value > 0 and math.isfinite(value)):
            return None
        by_stage[rank] = max(by_stage.get(rank, 0.0), value)
    if sorted(by_stage) != list(range(pp)):
        return None
    slowest = max(by_stage.values())
    return tuple(by_stage[r] / slowest for r in range(pp))


def refit_from_trace(lines: Sequence[Mapping],
                     samples: Sequence[Mapping] | None = None) -> LatencyModel | None:
    """A model fitted to a trace's timed steps, as the plugin's own online fit does.

    The startup sweep can be off (a busy machine, a cold cache); what the engine measured while
    serving is the better description of it. Steps with decodes count when the line records the
    decodes' cached tokens (``decode_history``) and each decode ran one token (a decode is then
    the ``x = 1`` case, an exact row); older traces lack the field and such steps are left out.
    Fitted to prefill steps alone, ``gamma*L`` and ``a*2*L*x`` are told apart only by chunk
    sizes that vary little, and a decode (``x = 1``) takes the whole ``gamma*L``: on the CPU
    test bed such a fit priced one decode at 16K context at 13 ms, where each decode adds about
    2.4 ms to a measured decode-only step. ``samples`` (the report's sweep samples, ``{"size",
    "latency_ms"}``) join as steps at ``L = 0``: a trace of fixed chunks has one chunk size and
    cannot pin ``b`` and ``c`` on its own, and the sweep has no prefix and cannot pin ``gamma``
    or tell ``a`` from ``d``. None when the fit is rejected.
    """
    rows, ms = [], []
    for ln in lines:
        if not isinstance(ln, Mapping):
            continue
        meas = ln.get("measured_ms")
        if not isinstance(meas, (int, float)) or not meas > 0:
            continue
        items = step_items(ln)
        if items:
            rows.append(LatencyModel.step_features(items))
            ms.append(float(meas))
    for smp in samples or ():
        size, lat = smp.get("size"), smp.get("latency_ms")
        if isinstance(size, (int, float)) and isinstance(lat, (int, float)) and size > 0:
            rows.append(LatencyModel.step_features([(0, int(size))]))
            ms.append(float(lat))
    if not rows:
        return None
    fit = fit_rows(np.vstack(rows), ms)
    return fit.model if fit.ok else None


def step_items(line: Mapping) -> list[tuple[int, int]] | None:
    """A trace line's step as latency-model items: each prefill's ``(history, chunk)`` and
    the decodes (:func:`_decode_items`); None when the decodes cannot be rebuilt exactly."""
    decodes = _decode_items(line)
    if decodes is None:
        return None
    return [(int(r.get("history") or 0), int(r.get("chunk") or 0))
            for r in line.get("requests") or () if isinstance(r, Mapping)] + decodes


def _decode_items(line: Mapping) -> list[tuple[int, int]] | None:
    """The line's decodes as ``(history, 1)`` items for a regression row (their summed
    history stands for each one's: the row is linear in the sums), ``[]`` without decodes,
    None when they cannot be rebuilt exactly (no ``decode_history``, or speculative tokens)."""
    n = int(line.get("decodes") or 0)
    if n <= 0:
        return []
    history, tokens = line.get("decode_history"), line.get("decode_tokens")
    if not isinstance(history, int) or tokens != n:
        return None
    # Rows are sums over items: one decode carries the history, the rest add their token.
    return [(history, 1)] + [(0, 1)] * (n - 1)


def host_ms_from_trace(lines: Sequence[Mapping]) -> float:
    """Median host time per step: wall time between two consecutive prefill steps' trace
    lines minus the later step's measured forward (what the pipeline did not hide; 0 when the
    trace has no such pair). The simulator's ``sched_ms``."""
    gaps = []
    prev = None
    for ln in lines:
        if not isinstance(ln, Mapping):
            prev = None
            continue
        meas, when = ln.get("measured_ms"), ln.get("time")
        busy = bool(ln.get("requests"))
        if (busy and prev is not None and isinstance(meas, (int, float))
                and isinstance(when, (int, float))):
            gaps.append((when - prev) * 1000.0 - meas)
        prev = when if busy and isinstance(when, (int, float)) else None
    return max(0.0, float(np.median(gaps))) if gaps else 0.0


def simulate_trace_policy(profile: str | os.PathLike | Mapping | ProfileInfo, *,
                          policy: str | Policy = "cpp-auto", budget: int | None = None,
                          concurrency: int = 1, prompt_len: int | None = None,
                          prompt_lens: Sequence[int] | None = None,
                          num_requests: int | None = None, variable: bool = False,
                          output_len: int = 128, stages: int | None = None,
                          sched_ms: float = 0.0, seed: int = 0,
                          stage_scale: bool = True, model: LatencyModel | None = None,
                          record_timeline: bool = False,
                          arrivals_ms: Sequence[float] | None = None) -> SimResult:
    """Predict a real engine's run from its fitted profile.

    ``policy`` is ``fixed``, ``cpp-base`` or ``cpp-auto`` (the profile's chunk settings where
    ``budget`` is its base chunk), or a :class:`Policy` with its own (then ``budget`` is
    ignored); ``budget`` is ``max_num_batched_tokens`` (default: the profile's base chunk).
    Decodes run on the engine, as on the CPU test bed. ``prompt_lens`` replays an exact prompt
    list (then ``prompt_len``, ``num_requests`` and ``variable`` are ignored). ``sched_ms`` is
    host time per scheduler call, worth setting on slow hosts. With ``stage_scale`` (default)
    and per-worker sweep totals in the report, faster stages run proportionally faster than the
    fitted (slowest) one. ``model`` replaces the profile's coefficients (e.g.
    :func:`refit_from_trace` of the run being predicted). ``arrivals_ms`` (with ``prompt_lens``)
    replays fixed submission times instead of closed-loop clients. The result's ``mean_ttft_ms``
    is the prediction to compare with the measured mean TTFT.
    """
    info = profile if isinstance(profile, ProfileInfo) else load_profile(profile)
    if model is not None:
        info = replace(info, model=model)
    S = int(stages or info.pp_size or 2)
    pol = policy if isinstance(policy, Policy) else info.policy(policy, budget)
    if prompt_lens is not None:
        lens = tuple(int(n) for n in prompt_lens)
        if not lens:
            raise ValueError("prompt_lens is empty")
        workload = Workload(concurrency=concurrency, prompt_len=max(lens),
                            output_len=output_len, seed=seed, prompts=lens,
                            arrivals_ms=None if arrivals_ms is None else tuple(arrivals_ms))
    else:
        if prompt_len is None:
            raise ValueError("give prompt_len or prompt_lens")
        if arrivals_ms is not None:
            raise ValueError("arrivals_ms needs prompt_lens (one time per prompt)")
        workload = Workload(concurrency=concurrency, num_requests=num_requests,
                            prompt_len=int(prompt_len), variable=variable,
                            output_len=output_len, seed=seed)
    scale = info.stage_scale if stage_scale and info.stage_scale is not None \
        and len(info.stage_scale) == S else None
    engine = EngineSpec(stages=S, model=info.model, block_size=info.block_size,
                        sched_ms=float(sched_ms), seed=seed, stage_scale=scale)
    return simulate_policy(engine, pol, workload, record_timeline=record_timeline)


def predicted_vs_measured(predicted_ms: float, measured_ms: float) -> float:
    """Relative error of a prediction (``(pred - meas) / meas``; NaN without a measurement)."""
    if not (math.isfinite(measured_ms) and measured_ms > 0 and math.isfinite(predicted_ms)):
        return math.nan
    return (predicted_ms - measured_ms) / measured_ms
