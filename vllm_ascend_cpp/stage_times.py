"""Every stage's forward time of the timed steps, gathered in the engine.

The last stage's time rides on the step's ModelRunnerOutput, but the other stages return
intermediate tensors that never reach the engine. Each worker therefore keeps its times in a
ring buffer (worker/step_timer.py), and every ``fetch_every`` timed steps the engine asks all
workers for them with one non-blocking ``collective_rpc`` of a named method. vLLM's
multiprocessing executor answers RPCs in order behind the steps already sent, so the answer
holds every step that finished before the request, and it arrives while the engine collects
the next step's output: the pipeline never waits for it. A fetch also goes out once the oldest
waiting step is ``FETCH_AFTER_STEPS`` steps old, so sparse timing is not held back. Steps are
then resolved with one time per pipeline stage (the slowest tensor-parallel rank of the stage)
and planned on the slowest stage, as the startup sweep is.

Where the executor cannot do this (a single worker; an RPC that fails), steps resolve at once
with the last stage's time alone and the reason is logged once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_ascend_cpp import compat
from vllm_ascend_cpp.log import logger

# One RPC per this many timed steps: while calibration fills its window every step is timed.
FETCH_EVERY = 8
# ... or once the oldest waiting step is this many steps old, so that sparse timing (rescue,
# give-up) still reaches the calibrator within a few steps.
FETCH_AFTER_STEPS = 8
# A step whose stage times have not come back after this many fetches resolves without them.
_MAX_FETCHES_WAITED = 4
# Stage times kept for steps the engine has not finished yet (bounded).
_MAX_KEPT = 1024


class StageTimes:
    """Pairs timed steps with every stage's forward time; see the module docstring."""

    def __init__(self, executor: Any, workers: int, fetch_every: int = FETCH_EVERY) -> None:
        self.executor = executor
        self.fetch_every = max(1, int(fetch_every))
        self.enabled = executor is not None and int(workers) > 1
        self.disabled_reason = "" if self.enabled else "one worker: its time is every stage's"
        self._awaiting: dict[int, tuple[Any, float | None]] = {}
        self._waited: dict[int, int] = {}
        self._got: dict[int, list[float]] = {}
        self._future: Any = None
        self._asked: list[int] = []
        self.fetches = 0

    def submit(self, step: int, payload: Any, last_stage_ms: float | None) -> None:
        self._awaiting[int(step)] = (payload, last_stage_ms)

    def poll(self, resolve: Callable[[Any, float | None, list[float] | None], None],
             step: int | None = None) -> None:
        """Resolve what can be resolved: ``resolve(payload, last_stage_ms, stage_ms)``, with
        ``stage_ms`` one time per pipeline stage or None when only the last stage's is known.
        ``step`` is the engine's current step number."""
        if not self.enabled:
            self._resolve_all(resolve)
            return
        missing: set[int] = set()
        if self._future is not None and self._future.done():
            future, self._future = self._future, None
            try:
                replies = future.result()
            except Exception as e:
                self._disable(f"fetching per-stage times failed: {type(e).__name__}: {e}")
                self._resolve_all(resolve)
                return
            # A reply also holds steps the workers ran after the engine asked (the pipeline
            # runs ahead of the engine): they are kept for when the engine gets to them.
            self._got.update(_by_step(replies))
            missing = set(self._asked)
            self._asked = []
        for waiting in list(self._awaiting):
            stages = self._got.pop(waiting, None)
            if stages is None:
                if waiting not in missing:
                    continue
                # Asked for and seen by no worker (should not happen): wait a little longer.
                self._waited[waiting] = self._waited.get(waiting, 0) + 1
                if self._waited[waiting] < _MAX_FETCHES_WAITED:
                    continue
            payload, last = self._awaiting.pop(waiting)
            self._waited.pop(waiting, None)
            resolve(payload, last, stages)
        while len(self._got) > _MAX_KEPT:
            self._got.pop(next(iter(self._got)))
        if self._future is None and self._awaiting and (
                len(self._awaiting) >= self.fetch_every
                or (step is not None and step - min(self._awaiting) >= FETCH_AFTER_STEPS)):
            self._fetch()

    def _fetch(self) -> None:
        try:
            self._future = self.executor.collective_rpc(compat.WORKER_STAGE_TIMES,
                                                        non_block=True)
        except Exception as e:
            self._disable(f"the executor cannot fetch per-stage times: {type(e).__name__}: {e}")
            return
        self._asked = list(self._awaiting)
        self.fetches += 1

    def flush(self, resolve: Callable[[Any, float | None, list[float] | None], None]) -> None:
        """Resolve everything still waiting with what is known (at shutdown; never blocks)."""
        self._resolve_all(resolve)

    def _resolve_all(self, resolve: Callable[[Any, float | None, list[float] | None],
                                             None]) -> None:
        awaiting, self._awaiting = self._awaiting, {}
        for payload, last in awaiting.values():
            resolve(payload, last, None)

    def _disable(self, reason: str) -> None:
        if self.enabled:
            logger.warning("[CPP] %s; timing the last pipeline stage only", reason)
        self.enabled = False
        self.disabled_reason = reason
        self._future = None


def _by_step(replies: Any) -> dict[int, list[float]]:
    """``{step: [ms of pp rank 0, ms of pp rank 1, ...]}``, the slowest TP rank per stage."""
    per_stage: dict[int, dict[int, float]] = {}
    for reply in replies if isinstance(replies, list) else [replies]:
        if not isinstance(reply, dict):
            continue
        pp = int(reply.get("pp_rank", 0))
        for step, ms in reply.get("times") or []:
            stages = per_stage.setdefault(int(step), {})
            stages[pp] = max(float(ms), stages.get(pp, 0.0))
    return {step: [stages[k] for k in sorted(stages)] for step, stages in per_stage.items()}
