"""What the ``vllm-cpp`` commands share: their error, and the latency-model options of
``plan`` and ``simulate``."""

from __future__ import annotations

import argparse
import math

from .core.latency_model import LatencyModel

REQUIRED = ("a", "b", "c")
OPTIONAL = ("gamma", "d")


class CliError(Exception):
    """A problem with the command line or its inputs; exit code 2."""


class ModelArgsError(CliError, ValueError):
    """A bad combination or value of the model options."""


def add_model_arguments(group: argparse._ArgumentGroup, profile_help: str) -> None:
    group.add_argument("--a", type=float, help="attention coefficient (ms per token^2)")
    group.add_argument("--b", type=float, help="linear coefficient (ms per token)")
    group.add_argument("--c", type=float, help="per-step overhead (ms)")
    group.add_argument("--gamma", type=float, default=None,
                       help="prefix coefficient (ms per cached token, default 0)")
    group.add_argument("--d", type=float, default=None,
                       help="extra cost of the chunk's own x^2 block (ms per token^2, default "
                            "0: a causal kernel; equal to --a: a kernel computing the whole "
                            "block)")
    group.add_argument("--profile", metavar="FILE", help=profile_help)


def wants_profile(args: argparse.Namespace) -> bool:
    """True when the model comes from ``--profile``; refuses mixing it with coefficients."""
    given = [k for k in REQUIRED + OPTIONAL if getattr(args, k) is not None]
    if args.profile is not None:
        if given:
            raise ModelArgsError("give either --profile or coefficients, not both")
        return True
    if not any(getattr(args, k) is not None for k in REQUIRED):
        raise ModelArgsError("no latency model: give --a, --b and --c, or --profile FILE")
    return False


def model_from_coefficients(args: argparse.Namespace) -> LatencyModel:
    missing = [k for k in REQUIRED if getattr(args, k) is None]
    if missing:
        raise ModelArgsError("missing coefficient " + ", ".join(f"--{k}" for k in missing))
    values = {k: getattr(args, k) for k in REQUIRED}
    values.update({k: getattr(args, k) or 0.0 for k in OPTIONAL})
    for name, value in values.items():
        if not math.isfinite(value) or value < 0:
            raise ModelArgsError(f"--{name} must be a finite number >= 0, got {value}")
    return LatencyModel(**values)


def describe(model: LatencyModel) -> str:
    return (f"a={model.a:.4g} b={model.b:.4g} c={model.c:.4g} gamma={model.gamma:.4g} "
            f"d={model.d:.4g}")
