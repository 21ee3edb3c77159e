"""The pipeline simulator: vLLM's pipeline-parallel engine as a discrete-event model.

It runs the plugin's own scheduler hook and core planner against a latency model, so policies
(vLLM's fixed budget, CPP with the base target, CPP with ``target: auto``) can be compared at
pipeline depths and prompt lengths this machine cannot run. numpy only; never imports vLLM.
"""

from .engine import (
    POLICY_KINDS,
    EngineSpec,
    Policy,
    SimResult,
    Workload,
    simulate_policies,
    simulate_policy,
)
from .profile import (
    ProfileInfo,
    host_ms_from_trace,
    load_profile,
    predicted_vs_measured,
    refit_from_trace,
    simulate_trace_policy,
    step_items,
)
from .timeline import StepSpan, Timeline, cv, pipeline_spans

__all__ = [
    "POLICY_KINDS",
    "EngineSpec",
    "Policy",
    "ProfileInfo",
    "SimResult",
    "StepSpan",
    "Timeline",
    "Workload",
    "cv",
    "load_profile",
    "pipeline_spans",
    "predicted_vs_measured",
    "host_ms_from_trace",
    "refit_from_trace",
    "simulate_policies",
    "simulate_policy",
    "simulate_trace_policy",
    "step_items",
]
