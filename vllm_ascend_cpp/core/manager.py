"""Lifecycle of dynamic chunking on one engine: profile, plan, time, recalibrate, fall back.

States::

    UNPROFILED --begin_profiling--> PROFILING --finish_profiling--> READY | CALIBRATING
        |                                         \\--(fit rejected)--> FIXED_FALLBACK (rescue)
        \\--load_profile--> READY | CALIBRATING
    UNPROFILED | PROFILING --start_rescue--> FIXED_FALLBACK (rescue)
    any --fail(reason)--> FIXED_FALLBACK (for good)
    CALIBRATING --calibrator gave up--> FIXED_FALLBACK --calibrator reenabled--> CALIBRATING
    FIXED_FALLBACK (rescue) --an online fit passed--> CALIBRATING

READY means a model is in use and online calibration is off; CALIBRATING means a model is in
use and timed steps keep refining it. FIXED_FALLBACK has three flavours (:attr:`calibration`):
``rescue`` (no usable startup fit; a quarter of the steps are timed until an online fit passes
or calibration gives up), ``gave-up`` (one step in ``fallback_timing_period`` is timed, and a
passing fit turns dynamic chunking back on) and ``off`` (for good: nothing is timed). In every
state but READY and CALIBRATING :meth:`plan_step` returns the fallback plan (vLLM's own budget,
no cap), so scheduling never waits on this class.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from enum import Enum

import numpy as np

from . import step_planner
from .auto_target import MAX_QUEUE, AutoTarget, AutoTargetTracker
from .calibrator import CalibrationEvent, OnlineCalibrator
from .fit import MIN_SAMPLES, FitResult, fit_startup
from .latency_model import LatencyModel
from .predictor import ChunkSizePredictor
from .report import build_report
from .settings import CoreSettings
from .speed import SpeedFactor
from .step_planner import Candidate, StepPlan, StepPlanner, simulate

__all__ = ["CppState", "ProfilingChunkManager", "PROFILE_VERSION"]

PROFILE_VERSION = 1
# Timing a step costs a device sync; once the model is trusted, one step in this many is
# enough to notice drift.
TIMING_PERIOD = 16
# Rescue (no startup model): one step in this many is timed until an online fit passes.
RESCUE_TIMING_PERIOD = 4
# While a model is in use, a step without prefill work is timed at most one in this many: it
# sizes no chunk, a one-decode step is a few milliseconds whose measured time wanders by half on
# a busy host (benchmarks/results/soak_tcmalloc.md), and each timed step costs a device sync
# per worker.
DECODE_TIMING_PERIOD = 16
# Recent prediction error above this keeps every step timed.
TIMING_ERROR_THRESHOLD = 0.10
_RECENT_ERRORS = 64
_RECENT_EVENTS = 64
# Host gaps: the median of this many recent ones, once this many are in, rebuilt when it moves
# by more than this fraction.
_HOST_GAP_WINDOW = 64
_HOST_GAP_MIN = 8
_HOST_GAP_CHANGE = 0.25
# Timed steps whose median measured/predicted ratio scales the model in use (core/speed.py).
SPEED_WINDOW = 16


# (str, Enum) rather than StrEnum: setup.py still admits Python 3.10.
class CppState(str, Enum):  # noqa: UP042
    UNPROFILED = "unprofiled"
    PROFILING = "profiling"
    READY = "ready"
    CALIBRATING = "calibrating"
    FIXED_FALLBACK = "fixed-fallback"


class ProfilingChunkManager:
    """Owns the model, predictor, planner and calibrator of one engine; see module docstring."""

    def __init__(self, settings: CoreSettings) -> None:
        self.settings = settings
        self.state = CppState.UNPROFILED
        self.fallback_reason = ""
        self.model: LatencyModel | None = None
        self.fit: FitResult | None = None
        self.source = ""
        self.predictor = ChunkSizePredictor(
            None, base_chunk=settings.base_chunk, smooth_factor=settings.smooth_factor,
            min_chunk=settings.min_chunk, block_size=settings.block_size)
        self.planner = StepPlanner(self.predictor)
        self.auto: AutoTargetTracker | None = None
        # Per-step host time between back-to-back prefill steps, beyond the forward (ms).
        self._host_gaps: deque[float] = deque(maxlen=_HOST_GAP_WINDOW)
        self._host_ms_in_use = 0.0
        # Benchmarks only: the gap histories of the policies not being served now, by the key
        # each was served under (use_gap_history; None is the operator's settings).
        self._gap_histories: dict[Hashable, deque[float]] = {}
        self._gap_key: Hashable = None
        self.calibrator: OnlineCalibrator | None = (
            OnlineCalibrator(window=settings.calibration_window,
                             max_failed_fits=settings.max_failed_fits,
                             min_rows=min(12, settings.calibration_window))
            if settings.online_calibration else None)
        self.report: dict | None = None
        # The latest refit outcomes only: a server refits for days, memory must not grow.
        self.events: deque[CalibrationEvent] = deque(maxlen=_RECENT_EVENTS)
        self._sizes: list[float] = []
        self._latencies: list[float] = []
        # fail() is final; a calibrator give-up is not (it may re-enable).
        self._failed_for_good = False
        self._steps_planned = 0
        self._fallback_steps = 0
        self._steps_timed = 0
        self._timing_calls = 0
        self._decode_timing_calls = 0
        self._errors: deque[float] = deque(maxlen=_RECENT_ERRORS)
        # With online calibration, predictions follow the host's speed between refits.
        self.speed = SpeedFactor(window=SPEED_WINDOW)
        # Decode tokens vLLM scheduled in each of the last S-1 steps, oldest first: the oldest
        # is the load of the next step's phase (a decode comes back S steps after it ran).
        self._phase_decodes: deque[int] = deque(maxlen=max(0, settings.pp_size - 1))

    # -- profiling ------------------------------------------------------------------------

    def sample_sizes(self) -> list[int]:
        """``num_samples`` sizes ``top, top*(n-1)/n, ..., top/n`` (ints >= 1, descending),
        ``top`` the settings' ``sweep_top``."""
        n = self.settings.num_samples
        base = self.settings.sweep_top
        return [max(1, base * (n - k) // n) for k in range(n)]

    def begin_profiling(self) -> None:
        self._require(CppState.UNPROFILED, "begin profiling")
        self.state = CppState.PROFILING

    def finish_profiling(self, sizes: Sequence[int],
                         latencies_ms: Sequence[float]) -> FitResult:
        """Fit the sweep; READY/CALIBRATING on success, FIXED_FALLBACK with a reason if not."""
        self._require(CppState.PROFILING, "finish profiling")
        self._sizes = [float(s) for s in sizes]
        self._latencies = [float(t) for t in latencies_ms]
        fit = fit_startup(self._sizes, self._latencies, min_samples=MIN_SAMPLES)
        self.fit = fit
        self.source = "sweep"
        if fit.ok and fit.model is not None:
            if self.calibrator is not None:
                self.calibrator.set_anchors(self._sizes, self._latencies)
            self._use_model(fit.model)
        else:
            self.start_rescue(f"startup profiling fit rejected: {fit.reason}")
        self._build_report()
        return fit

    def start_rescue(self, reason: str) -> None:
        """Serve with fixed chunks because no startup model exists, and let online calibration
        turn dynamic chunking on once a fit of timed serving steps passes its gates (without
        online calibration this is the plain fallback)."""
        self._enter_fallback(reason)
        if self.calibrator is not None and not self._failed_for_good:
            self.fallback_reason += ("; online calibration will turn dynamic chunking on "
                                     "once a fit of timed serving steps passes its gates")

    @property
    def calibration(self) -> str:
        """``dynamic``, ``rescue``, ``gave-up`` or ``off`` (see the module docstring)."""
        if self.state in (CppState.READY, CppState.CALIBRATING):
            return "dynamic"
        cal = self.calibrator
        if self.state != CppState.FIXED_FALLBACK or cal is None or self._failed_for_good:
            return "off"
        return "gave-up" if cal.gave_up else "rescue"

    def load_profile(self, profile: Mapping) -> None:
        """Use a profile saved by :meth:`profile_dict` instead of sweeping.

        Raises ValueError when the profile is malformed (the caller should sweep instead).
        """
        self._require(CppState.UNPROFILED, "load a profile")
        if not isinstance(profile, Mapping):
            raise ValueError("profile must be a JSON object")
        version = profile.get("version", PROFILE_VERSION)
        if version != PROFILE_VERSION:
            raise ValueError(f"profile version {version!r} is not {PROFILE_VERSION}")
        if profile.get("model") is None:
            raise ValueError("profile has no model")
        model = LatencyModel.from_dict(profile["model"])
        if not model.is_physical:
            raise ValueError("profile model has a negative coefficient")
        samples = profile.get("samples") or {}
        try:
            self._sizes = [_float_or_nan(s) for s in samples.get("sizes", [])]
            self._latencies = [_float_or_nan(t) for t in samples.get("latencies_ms", [])]
        except (AttributeError, TypeError) as exc:
            raise ValueError(f"profile samples are malformed: {exc}") from exc
        self.fit = _fit_from_dict(profile.get("fit"), model)
        self.source = "cache"
        if self.calibrator is not None and len(self._sizes) == len(self._latencies):
            self.calibrator.set_anchors(self._sizes, self._latencies)
        self._use_model(model)
        self._build_report()

    def fail(self, reason: str) -> None:
        """Give up on dynamic chunking for good (any state -> FIXED_FALLBACK)."""
        self._failed_for_good = True
        self._enter_fallback(reason)

    # -- serving --------------------------------------------------------------------------

    @property
    def head_prefills(self) -> int:
        """How many of the walk's first prefills a head given to :meth:`plan_step` with
        ``rest`` must hold: the lead, and with the auto target the queue it reads."""
        return MAX_QUEUE if self.auto is not None else 1

    def plan_step(self, candidates: Sequence[Candidate], *, max_budget: int,
                  max_requests: int | None = None,
                  rest: Callable[[], Sequence[Candidate]] | None = None,
                  in_flight: Sequence[float] = ()) -> StepPlan:
        """This step's budget and cap; the fallback plan unless a model is in use.

        With ``rest``, ``candidates`` may be only the head of the walk (a long waiting queue
        is not built past what a step can reach) and ``rest()`` gives the whole walk. The
        caller promises that everything after the head is a prefill with tokens to compute
        (no decode) and that the head holds the walk's first :attr:`head_prefills` prefills
        (or all of them): then every input the decision reads is in the head, and the tail
        can change the plan only through a walk that takes every item of the head and still
        has budget: the planner's budget walk took every item whole below its target and
        ``max_budget`` (:attr:`StepPlan.open_end`), or vLLM's walk left tokens of the budget
        unused. Such a step is planned again on the whole walk, so the
        plan is always the one the whole walk gives. The planner's walks keep no state; the
        auto target reads only what the head holds. A step may be planned more than once
        (cached prefixes grew within it): what is kept across steps is fed by
        :meth:`record_decodes`, once per step scheduled.
        """
        self._steps_planned += 1
        if self.state in (CppState.READY, CppState.CALIBRATING):
            target = None
            if self.auto is not None:
                target = self.auto.target_for(candidates, max_budget, max_requests,
                                              in_flight)
            phases = self._phase_decodes
            next_phase = phases[0] if step_planner.BALANCE_PHASES and phases \
                and len(phases) == phases.maxlen else None
            plan = self.planner.plan(candidates, max_budget=max_budget,
                                     max_requests=max_requests, target_ms=target,
                                     next_phase_decodes=next_phase)
            if rest is not None and _walked_past(plan.items, plan.token_budget, candidates,
                                                 plan.open_end):
                plan = self.planner.plan(rest(), max_budget=max_budget,
                                         max_requests=max_requests, target_ms=target,
                                         next_phase_decodes=next_phase)
        else:
            items = simulate(candidates, max_budget, 0, max_requests)
            if rest is not None and _walked_past(items, max_budget, candidates, False):
                items = simulate(rest(), max_budget, 0, max_requests)
            plan = StepPlan(max_budget, 0, items, math.nan, fallback=True,
                            reason=self.fallback_reason or f"state {self.state.value}")
        if plan.fallback:
            self._fallback_steps += 1
        return plan

    def record_decodes(self, decodes: Sequence[tuple[int, int]]) -> None:
        """``(history, tokens)`` of each decode vLLM scheduled in this step (called once per
        ``schedule()``, planned or not: a step planned again for shared prefixes must not
        count twice, and one planned by nobody, decodes only, must count)."""
        if self._phase_decodes.maxlen:
            self._phase_decodes.append(sum(int(n) for _, n in decodes))
        if self.auto is not None:
            self.auto.record(decodes)

    def record_step(self, items: Sequence[tuple[int, int]], measured_ms: float,
                    predicted_ms: float | None = None) -> CalibrationEvent | None:
        """Feed one timed step; returns the calibration event it triggered, if any."""
        self._steps_timed += 1
        try:
            measured = float(measured_ms)
        except (TypeError, ValueError):
            measured = math.nan
        if self.model is not None and items and math.isfinite(measured) and measured > 0:
            pred = predicted_ms
            if pred is None or not math.isfinite(pred):
                pred = self.predict_ms(items)
            self._errors.append(abs(pred - measured) / measured)
        cal = self.calibrator
        if cal is None or self._failed_for_good:
            return None
        # Rows are collected while a model is refined, and in fixed fallback to rescue a
        # server whose sweep gave no model or to recover after the calibrator gave up.
        if self.state not in (CppState.CALIBRATING, CppState.FIXED_FALLBACK):
            return None
        if self.state == CppState.CALIBRATING and self.model is not None and items \
                and self.speed.observe(measured, self.model.step_ms(items)):
            self._install(self.model)
        cal.add(items, measured)
        event = cal.maybe_refit(self.model)
        if event is None:
            return None
        self.events.append(event)
        if event.kind in ("accepted", "reenabled", "rescued") and event.model is not None:
            self._use_model(event.model)
            self._errors.clear()
            if event.kind != "accepted" and self.report is not None:
                self.report["calibration"] = self.calibration
                self.report["calibration_event"] = event.to_dict()
        elif event.kind == "gave_up":
            self._enter_fallback(f"online calibration gave up: {event.reason}")
        return event

    def should_time_step(self, prefill: bool = True) -> bool:
        """Whether to time the coming step (each call is one step); ``prefill`` says whether
        it has prefill work.

        Always while calibrating with a window not yet full, or while the recent median
        prediction error is above 10%; otherwise one step in 16. A step without prefill work
        at most one in ``DECODE_TIMING_PERIOD``. In rescue one step in 4, after a give-up one
        step in ``fallback_timing_period``. Never when no model is or could be in use.
        """
        self._timing_calls += 1
        cal = self.calibrator
        mode = self.calibration
        if mode == "off":
            return False
        if mode == "rescue":
            return self._timing_calls % RESCUE_TIMING_PERIOD == 0
        if mode == "gave-up":
            return self._timing_calls % self.settings.fallback_timing_period == 0
        if not prefill:
            self._decode_timing_calls += 1
            return self._decode_timing_calls % DECODE_TIMING_PERIOD == 0
        if self.state == CppState.CALIBRATING and cal is not None and cal.n_rows < cal.window:
            return True
        if self._errors and float(np.median(self._errors)) > TIMING_ERROR_THRESHOLD:
            return True
        return self._timing_calls % TIMING_PERIOD == 0

    # -- observability --------------------------------------------------------------------

    def profile_dict(self) -> dict:
        """Everything worth saving to skip the next sweep, as JSON-ready data."""
        return {
            "version": PROFILE_VERSION,
            "model": self.model.to_dict() if self.model is not None else None,
            "samples": {"sizes": _finite_or_none(self._sizes),
                        "latencies_ms": _finite_or_none(self._latencies)},
            "fit": self.fit.to_dict() if self.fit is not None else None,
            "target_ms": self.predictor.target_ms,
            "settings": self.settings.to_dict(),
            "source": self.source,
        }

    def summary(self) -> dict:
        cal = self.calibrator
        errors = list(self._errors)
        return {
            "state": self.state.value,
            "calibration": self.calibration,
            "fallback_reason": self.fallback_reason,
            "model": self.model.to_dict() if self.model is not None else None,
            "target_ms": self.predictor.target_ms,
            "target_mode": self.settings.target_mode,
            "auto_target_ms": self.auto.target_ms if self.auto is not None else None,
            "host_ms_per_step": self._host_ms_in_use,
            "speed": self.speed.value,
            "steps_planned": self._steps_planned,
            "fallback_steps": self._fallback_steps,
            "steps_timed": self._steps_timed,
            "median_prediction_error": float(np.median(errors)) if errors else None,
            "failed_fits": cal.failed_fits if cal is not None else 0,
            "fit_attempts": cal.attempts if cal is not None else 0,
            "accepted_fits": cal.accepted_fits if cal is not None else 0,
            "rejected_rows": cal.rejected_rows if cal is not None else 0,
            "calibration_rows": cal.n_rows if cal is not None else 0,
            "anchor_rows": cal.n_anchors if cal is not None else 0,
            "fit_basis": cal.basis if cal is not None else "",
        }

    # -- internals ------------------------------------------------------------------------

    def _require(self, state: CppState, action: str) -> None:
        if self.state != state:
            raise RuntimeError(f"cannot {action} in state {self.state.value} "
                               f"(expected {state.value})")

    def record_host_gap(self, gap_ms: float) -> None:
        """Wall time between two back-to-back prefill steps' results, minus the later step's
        forward: the host's share of a step, which the auto target puts on each dispatch.
        The auto target is rebuilt when the median moves by more than a quarter."""
        try:
            gap = float(gap_ms)
        except (TypeError, ValueError):
            return
        if not math.isfinite(gap):
            return
        self._host_gaps.append(max(0.0, gap))
        if len(self._host_gaps) < _HOST_GAP_MIN or self.settings.target_mode != "auto":
            return
        host = float(np.median(self._host_gaps))
        used = self._host_ms_in_use
        if abs(host - used) > _HOST_GAP_CHANGE * max(used, 0.25):
            self.use_host_ms(host)

    def use_host_ms(self, host_ms: float) -> None:
        """Set the host time per step the auto target puts on each dispatch (the simulator sets it;
        a serving engine learns it through :meth:`record_host_gap`)."""
        host = float(host_ms)
        self._host_ms_in_use = host if math.isfinite(host) and host > 0 else 0.0
        if self.auto is not None:
            self.auto = self._carried_auto()

    def use_gap_history(self, key: Hashable) -> None:
        """BENCHMARK ONLY: from now on learn host gaps into the history kept under ``key``
        (a new, empty one the first time), keeping the current one under its own key.

        A gap holds what a dearer step adds on its own (the rise), so it depends on the policy:
        fixed 1,024-token chunks at 16k prompts show about 32 ms, CPP's equal-cost steps about
        5. A separate engine with a policy learns from that policy's steps alone; one history
        shared by every policy of a one-engine benchmark had the auto target planning with 17
        to 37 ms per dispatch after fixed and base cells, and choosing steps twice base's size.
        The auto target takes the history's host time at the next :meth:`reconfigure`."""
        if key == self._gap_key:
            return
        self._gap_histories[self._gap_key] = self._host_gaps
        self._host_gaps = self._gap_histories.pop(key, None) or deque(maxlen=_HOST_GAP_WINDOW)
        self._gap_key = key

    def reconfigure(self, settings: CoreSettings) -> None:
        """Swap the chunk settings and target mode, keeping the fitted model, the calibration
        window, the host-time history in use (see :meth:`use_gap_history`) and the state.

        For benchmarks that serve several policies from one engine (see
        ``CppRuntime.set_bench_policy``): a policy switch then changes only what a separate
        engine with those settings would have planned with, not what the engine has learnt.
        """
        self.settings = settings
        self.predictor = ChunkSizePredictor(
            None, base_chunk=settings.base_chunk, smooth_factor=settings.smooth_factor,
            min_chunk=settings.min_chunk, block_size=settings.block_size)
        if self.model is not None:
            self.predictor = self.predictor.with_model(self.model.scaled(self.speed.value))
        self.planner = StepPlanner(self.predictor)
        # The auto target starts from the history in use, or from none, as a new engine does.
        if settings.target_mode == "auto" and len(self._host_gaps) >= _HOST_GAP_MIN:
            self._host_ms_in_use = float(np.median(self._host_gaps))
        else:
            self._host_ms_in_use = 0.0  # only the auto target learns and uses it
        self.auto = (AutoTargetTracker(AutoTarget(self.predictor, settings.pp_size,
                                                  host_ms=self._host_ms_in_use))
                     if settings.target_mode == "auto" and self.predictor.ready else None)

    @property
    def host_ms(self) -> float:
        """The host time per step the auto target currently puts on each dispatch."""
        return self._host_ms_in_use

    def predict_ms(self, items: Sequence[tuple[int, int]]) -> float:
        """What the model in use (with the host's speed) predicts for a step of these
        ``(history, chunk)`` items; NaN without a model."""
        model = self.predictor.model
        return model.step_ms(items) if model is not None else math.nan

    def _use_model(self, model: LatencyModel) -> None:
        self.speed.reset(self._recent_ratios(model))
        if not self._install(model):
            self._enter_fallback(f"the fitted model is unusable: "
                                 f"{self.predictor.not_ready_reason}")
            return
        if not self._failed_for_good:
            self.state = CppState.CALIBRATING if self.calibrator is not None else CppState.READY
            self.fallback_reason = ""

    def _install(self, model: LatencyModel) -> bool:
        """Plan with ``model`` at the current speed; False when the predictor cannot use it."""
        self.model = model
        self.predictor = self.predictor.with_model(model.scaled(self.speed.value))
        self.planner = StepPlanner(self.predictor)
        if not self.predictor.ready:
            return False
        self.auto = self._carried_auto() if self.settings.target_mode == "auto" else None
        return True

    def _carried_auto(self) -> AutoTargetTracker:
        """An auto target on the current costs and host time. New costs change every forecast
        (its cache goes), but the tracker keeps the head it is on and that head's target."""
        auto = AutoTarget(self.predictor, self.settings.pp_size, host_ms=self._host_ms_in_use)
        return self.auto.rebound(auto) if self.auto is not None else AutoTargetTracker(auto)

    def _recent_ratios(self, model: LatencyModel) -> list[float]:
        """``measured / predicted`` of ``model`` on the latest online rows, oldest first: a new
        model starts at the speed those steps ran at, not at the window's average."""
        cal = self.calibrator
        if cal is None or not cal.n_rows:
            return []
        X, y = cal.window_arrays()
        X, y = X[-SPEED_WINDOW:], y[-SPEED_WINDOW:]
        pred = X @ model.as_vector()
        return [float(m / p) for m, p in zip(y, pred) if p > 0]

    def _enter_fallback(self, reason: str) -> None:
        self.state = CppState.FIXED_FALLBACK
        self.fallback_reason = reason

    def _build_report(self) -> None:
        predictor = self.predictor
        auto = None
        if self.auto is not None:
            # The report shows the plan auto would make for the reference prompt alone.
            s = self.settings
            auto = self.auto.auto.choose([(0, s.reference_len)], s.sweep_top)
            if auto is not None and math.isfinite(auto.target_ms) and auto.target_ms > 0:
                predictor = predictor.with_model(self.model, target_ms=auto.target_ms)
        self.report = build_report(model=self.model, fit=self.fit, sizes=self._sizes,
                                   latencies_ms=self._latencies, settings=self.settings,
                                   predictor=predictor, state=self.state,
                                   source=self.source, fallback_reason=self.fallback_reason)
        self.report["target_mode"] = self.settings.target_mode
        self.report["calibration"] = self.calibration
        if auto is not None:
            self.report["auto_target"] = auto.to_dict()


def _finite_or_none(values: Sequence[float]) -> list[float | None]:
    # JSON has no NaN; a failed sample is saved as null.
    return [v if math.isfinite(v) else None for v in values]


def _walked_past(items: Sequence, budget: int, head: Sequence[Candidate],
                 open_end: bool) -> bool:
    """Whether a walk that scheduled ``items`` under ``budget`` could have gone on past the
    end of ``head`` (see :meth:`ProfilingChunkManager.plan_step`): the planner's budget walk
    ran out of candidates (``open_end``), or vLLM's would, with tokens of the budget unused."""
    if len(items) < len(head):
        return False  # it stopped inside the head: what follows was never read
    return open_end or sum(i.tokens for i in items) < budget


def _float_or_nan(value: object) -> float:
    return math.nan if value is None else float(value)


def _fit_from_dict(d: Mapping | None, model: LatencyModel) -> FitResult | None:
    if not isinstance(d, Mapping):
        return None

    def number(key: str) -> float:
        value = d.get(key)
        return float(value) if isinstance(value, (int, float)) else math.nan

    def count(key: str) -> int:
        value = d.get(key)
        return int(value) if isinstance(value, int) else 0

    return FitResult(ok=bool(d.get("ok", True)), model=model, reason=str(d.get("reason", "")),
                     r2=number("r2"), rel_residual=number("rel_residual"),
                     n_samples=count("n_samples"), n_used=count("n_used"),
                     n_rejected=count("n_rejected"), n_outliers=count("n_outliers"))
