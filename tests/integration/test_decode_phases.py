"""Decodes spread over the pipeline's phases, through vLLM's own scheduler.

Under pipeline parallelism a decode is scheduled again only once its last token is back,
``pp_size`` steps later, so every running decode keeps the phase (step number modulo
``pp_size``) of the step that finished its prompt. Two decodes in one phase make every other
step carry both and leave the steps between with nothing to decode: the stages idle. The
planner finishes a prompt a step later when the phase it would join carries more decodes than
the next one, or a step early when the next one is busier and the rest is cheap
(`StepPlanner._finish_in_the_quieter_phase`). Here vLLM 0.32's `Scheduler` (and
`AsyncScheduler` with the V2 runner) runs a short prompt that decodes while a long one arrives
at each of eight moments; once both decode, no step may carry both. With the rule off some
arrival moments put both in one phase, so the assertion can fail.
"""

from __future__ import annotations

from typing import Any

import pytest

import vllm_ascend_cpp.core.step_planner as planner_module
from tests.sched_harness.build import EngineShape
from tests.sched_harness.drive import PatternRun
from tests.sched_harness.traffic import Pattern, RequestSpec

ARRIVALS = range(8)


class _DecodeCounts(PatternRun):
    """The harness's checked run, also counting the decodes of each step while two decode."""

    def __init__(self, pattern: Pattern) -> None:
        super().__init__(pattern)
        self.shared: list[int] = []  # decodes per step while both requests were decoding

    def schedule(self) -> Any:
        decoding = [r for r in self.sched.running
                    if r.num_computed_tokens >= r.num_prompt_tokens]
        out = super().schedule()
        if len(decoding) == 2:
            ids = {r.request_id for r in decoding}
            self.shared.append(sum(1 for rid in out.num_scheduled_tokens if rid in ids))
        return out


def _run(arrive: int, async_scheduling: bool) -> list[int]:
    shape = EngineShape(max_model_len=4096, max_num_batched_tokens=1024, base_chunk=512,
                        min_chunk=64, model="attention", async_scheduling=async_scheduling,
                        v2_runner=async_scheduling)
    pattern = Pattern(shape, (RequestSpec(arrive=0, prompt_len=40, max_tokens=400),
                              RequestSpec(arrive=arrive, prompt_len=3000, max_tokens=40)))
    run = _DecodeCounts(pattern)
    run.run()
    return run.shared


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_two_decodes_never_share_a_phase(async_scheduling: bool,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(planner_module, "BALANCE_PHASES", True)
    for arrive in ARRIVALS:
        shared = _run(arrive, async_scheduling)
        # The long prompt's 39 decodes after its first token, each beside none of the short
        # one's (a step of both would come with a step of neither).
        assert shared.count(1) >= 39, (arrive, shared)
        assert 2 not in shared, (arrive, shared)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_without_the_hold_some_arrivals_share_a_phase(async_scheduling: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(planner_module, "BALANCE_PHASES", False)
    collided = [arrive for arrive in ARRIVALS if 2 in _run(arrive, async_scheduling)]
    assert collided, "every arrival moment split the decodes without the rule"
