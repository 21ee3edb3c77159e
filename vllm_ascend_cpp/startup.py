"""Startup profiling, run once in the engine-core process after the engine is built.

Prepare every worker (warm-up dummy run, step timer), then load the cached profile or run the
sweep on every worker, fit, log the report and save it. Any failure leaves the engine serving
with fixed chunks and one warning that says why: startup never fails because of profiling.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np

from vllm_ascend_cpp import compat, profile_cache
from vllm_ascend_cpp.config import CppConfig, EngineFacts
from vllm_ascend_cpp.core import format_report
from vllm_ascend_cpp.log import logger


def slowest_stage(results: list[dict], n: int) -> tuple[list[float], dict]:
    """Per size, the slowest worker's latency: the pipeline moves at its slowest stage."""
    rows = []
    for r in results:
        if isinstance(r, dict) and r.get("error"):
            where = f"pp{r.get('pp_rank', '?')}/tp{r.get('tp_rank', '?')}"
            raise RuntimeError(f"worker {where}: {r['error']}")
        lat = r.get("latencies_ms") if isinstance(r, dict) else None
        if lat is None or len(lat) != n:
            raise RuntimeError(f"a worker returned {len(lat or [])} timings for {n} sizes")
        rows.append(np.asarray(lat, dtype=float))
    table = np.vstack(rows)
    with np.errstate(invalid="ignore"):
        slowest = np.max(table, axis=0)
    totals = [float(np.nansum(row)) for row in rows]
    by_stage = {
        f"pp{r.get('pp_rank', 0)}/tp{r.get('tp_rank', 0)}": round(t, 3)
        for r, t in zip(results, totals)
    }
    return [float(x) for x in slowest], {"total_ms_by_worker": by_stage}


def run_startup(executor: Any, runtime: Any, vllm_config: Any) -> None:
    cfg: CppConfig = runtime.cfg
    facts: EngineFacts = runtime.facts
    manager = runtime.manager
    started = time.monotonic()
    if executor is None:
        manager.fail("no executor was registered for this engine (unsupported vLLM layout)")
        _fallback(cfg, manager, sweeps=0)
        return
    fields = profile_cache.cache_key_fields(vllm_config, cfg, facts)
    key = profile_cache.cache_key(fields)
    cached = profile_cache.load(cfg.cache_dir, key)
    sizes = manager.sample_sizes()
    try:
        # Without a cached profile, one timed run at the largest size tells how long the
        # sweep will take (it is the sweep's own warm-up size, so it costs nothing new).
        prep = executor.collective_rpc(
            compat.WORKER_PREPARE,
            kwargs={"timing": bool(cfg.online_calibration),
                    "probe_tokens": int(sizes[0]) if cached is None else 0},
        )
        errors = [p["error"] for p in prep if isinstance(p, dict) and p.get("error")]
        if errors:
            raise RuntimeError(errors[0])
    except Exception as e:  # the engine must still work: fall back to vLLM's own warm-up
        _warm_up_fallback(executor)
        manager.fail(f"worker preparation failed: {_short(e)}")
        _fallback(cfg, manager, sweeps=0)
        return
    how = prep[0].get("dummy_run", "?") if prep else "?"
    sync = prep[0].get("sync", "?") if prep else "?"

    if cached is not None:
        try:
            manager.load_profile(cached["profile"])
        except Exception as e:
            logger.warning("[CPP] cached profile unusable (%s); profiling again", _short(e))
            cached = None
        else:
            logger.info(
                "[CPP] loaded cached profile %s: startup sweep skipped",
                profile_cache.cache_path(cfg.cache_dir or "", key),
            )
    if cached is None:
        repeats = int(cfg.sample_repeats)
        expected = expected_sweep_s(prep, sizes, repeats)
        logger.info(
            "[CPP] startup sweep: %d single-request prefills from %d down to %d tokens, "
            "%d repeat(s) each, on %d worker(s) at once; expected about %s",
            len(sizes), sizes[0], sizes[-1], repeats, len(prep),
            f"{expected:.0f} s" if expected is not None else "(unknown)",
        )
        sweep_started = time.monotonic()
        manager.begin_profiling()
        try:
            results = executor.collective_rpc(compat.WORKER_SWEEP, args=(sizes, repeats))
            latencies, stages = slowest_stage(list(results), len(sizes))
        except Exception as e:
            # One sweep, never retried: a worker that failed once would likely fail again.
            # Serving steps can still be timed, so online calibration may rescue the server.
            logger.info("[CPP] startup sweep failed after %.1f s",
                        time.monotonic() - sweep_started)
            reason = f"startup sweep failed on a worker: {_short(e)}"
            if _timers_installed(prep):
                manager.start_rescue(reason)
            else:
                manager.fail(reason)
            _fallback(cfg, manager, sweeps=1)
            return
        logger.info("[CPP] startup sweep done in %.1f s (total ms by worker: %s)",
                    time.monotonic() - sweep_started, stages["total_ms_by_worker"])
        fit = manager.finish_profiling(sizes, latencies)
        if manager.report is not None:
            manager.report["sweep"] = {
                "dummy_batch": f"1 request of n tokens ({how})",
                "device_sync": sync,
                "workers": len(results),
                "attempts": 1,
                "seconds": round(time.monotonic() - started, 2),
                "expected_seconds": round(expected, 1) if expected is not None else None,
                **stages,
            }
        if not fit.ok:
            bad = _describe_unusable(latencies)
            if bad:
                manager.fallback_reason += f" (sweep timings: {bad})"
            _fallback(cfg, manager, sweeps=1)
            return
        path = profile_cache.save(cfg.cache_dir, key, fields, manager.profile_dict())
        if path:
            logger.info("[CPP] profile saved to %s", path)
    report = manager.report or {}
    logger.info("%s", format_report(report))
    _write_report_json(cfg, report)
    model = manager.model
    if model is not None and model.a == 0.0 and manager.state.value in ("ready", "calibrating"):
        # The fit bounds a at 0; an unconstrained fit of these timings would make it negative.
        logger.warning(
            "[CPP] the startup fit pinned a (the attention cost) at 0: the timings grow less "
            "than linearly with size, so a free fit would give a negative a; chunks will not "
            "shrink as the prefix grows%s",
            " until online calibration measures a" if cfg.online_calibration else "",
        )


def expected_sweep_s(prep: list[Any], sizes: list[int], repeats: int) -> float | None:
    """Seconds the sweep should take, from each worker's timed run at the largest size.

    Assumes a sample's time grows linearly with its size (an overestimate where ``c``
    dominates, an underestimate where attention does); the warm-up run adds one more.
    """
    probes = [p.get("probe_ms") for p in prep if isinstance(p, dict)]
    probes = [float(p) for p in probes if isinstance(p, (int, float)) and p > 0]
    if not probes or not sizes:
        return None
    top = float(sizes[0])
    runs = sum(float(n) / top for n in sizes) * max(1, repeats) + 1.0
    return max(probes) * runs / 1000.0


def _timers_installed(prep: list[Any]) -> bool:
    return bool(prep) and all(isinstance(p, dict) and p.get("timer") for p in prep)


def _warm_up_fallback(executor: Any) -> None:
    try:
        executor.collective_rpc("execute_dummy_batch")
    except Exception as e:
        logger.warning("[CPP] fallback warm-up failed too: %s", _short(e))


def _fallback(cfg: CppConfig, manager: Any, sweeps: int) -> None:
    """The one warning for a startup that could not enable dynamic chunking, and its report."""
    logger.warning(
        "[CPP] dynamic chunking is off, serving with fixed chunks of %d tokens: %s",
        manager.settings.base_chunk, manager.fallback_reason,
    )
    report = dict(manager.report or {})
    report.update(state=manager.state.value, fallback_reason=manager.fallback_reason,
                  calibration=manager.calibration)
    report["sweep"] = {**report.get("sweep", {}), "attempts": sweeps}
    _write_report_json(cfg, report)


def _describe_unusable(latencies: list[float]) -> str:
    """How many sweep timings could not be real ("3 NaN, 61 zero"), or "" when all could."""
    arr = np.asarray(latencies, dtype=float)
    counts = [
        (int(np.count_nonzero(np.isnan(arr))), "NaN"),
        (int(np.count_nonzero(np.isinf(arr))), "infinite"),
        (int(np.count_nonzero(arr == 0)), "zero"),
        (int(np.count_nonzero(np.isfinite(arr) & (arr < 0))), "negative"),
    ]
    return ", ".join(f"{n} {what}" for n, what in counts if n)


def _write_report_json(cfg: CppConfig, report: dict) -> None:
    target = None
    if cfg.trace_file:
        target = os.path.expanduser(cfg.trace_file) + ".report.json"
    elif cfg.cache_dir:
        target = os.path.join(cfg.cache_dir, "last-report.json")
    if target is None:
        return
    try:
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        with open(target, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2, default=str)
        logger.info("[CPP] profiling report written to %s", target)
    except OSError as e:
        logger.warning("[CPP] could not write the profiling report to %s (%s)", target, e)


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) < 300 else text[:297] + "..."
