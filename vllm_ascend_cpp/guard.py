"""The failure policy of the per-step hook: our bug costs a step of sizing, never a request.

The scheduler subclass runs each piece of CPP's per-step work (planning, recording what vLLM
scheduled, and on each result per-stage times, calibration, trace and summary) through
`HotPathGuard.run`.
A failure is caught there: that step runs with vLLM's own limits, one WARNING names the
failure (the traceback goes to DEBUG), and after `MAX_CONSECUTIVE_FAILURES` failures in a row
at one entry point CPP turns itself off for the life of the engine with one ERROR line.
Only a call that did its work (returned something other than None) breaks a run of failures:
under pipeline parallelism vLLM also schedules empty steps, and their trivially successful
calls must not hide a failure that happens on every real step.
vLLM's own calls are never inside the guard, so their exceptions propagate unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from vllm_ascend_cpp.log import logger

T = TypeVar("T")

# Failures in a row at one entry point before CPP turns itself off: one is a fluke (a single
# odd step), three in a row is a bug that would otherwise warn on every step forever.
MAX_CONSECUTIVE_FAILURES = 3


class HotPathGuard:
    def __init__(self, max_failures: int = MAX_CONSECUTIVE_FAILURES) -> None:
        self.max_failures = max(1, int(max_failures))
        self.disabled = False
        self.failures = 0  # over the engine's life
        self._in_a_row: dict[str, int] = {}

    def run(self, where: str, fn: Callable[..., T], *args: Any) -> tuple[bool, T | None]:
        """(True, fn(*args)), or (False, None) when it raised (logged and counted). A result
        other than None counts as a success that ends a run of failures at `where`."""
        if self.disabled:
            return False, None
        try:
            value = fn(*args)
        except Exception as exc:
            self._failed(where, exc)
            return False, None
        if value is not None and self._in_a_row.get(where):
            self._in_a_row[where] = 0
        return True, value

    def _failed(self, where: str, exc: Exception) -> None:
        self.failures += 1
        n = self._in_a_row.get(where, 0) + 1
        self._in_a_row[where] = n
        logger.warning(
            "[CPP] %s failed (%s: %s); this step runs with vLLM's own limits (%d in a row)",
            where, type(exc).__name__, exc, n,
        )
        logger.debug("[CPP] %s failure traceback", where, exc_info=exc)
        if n >= self.max_failures:
            self.disabled = True
            logger.error(
                "[CPP] turned off for the life of this engine: %s failed %d times in a row "
                "(last: %s: %s); vLLM schedules every step with its own limits",
                where, n, type(exc).__name__, exc,
            )
