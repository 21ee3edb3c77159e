"""``vllm-cpp``: offline tools around the CPP latency model.

Each subcommand is one ``add_<name>_parser`` function (arguments) and one ``run_<name>``
function (work, returns the exit code), listed in ``SUBCOMMANDS``. Errors in the arguments exit
with code 2 and one line on stderr starting ``vllm-cpp: error:``.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from .core.latency_model import LatencyModel
from .core.predictor import ChunkSizePredictor
from .core.report import compare_plans, format_chunk_table
from .model_args import (
    CliError,
    add_model_arguments,
    describe,
    model_from_coefficients,
    wants_profile,
)
from .sim.commands import add_report_parser, add_simulate_parser
from .testing.demo import add_demo_parser

PROG = "vllm-cpp"


class _Parser(argparse.ArgumentParser):
    # argparse prints usage plus an error and exits itself; we want one line and a return code.
    def error(self, message: str) -> NoReturn:
        raise CliError(message)


# -- plan ---------------------------------------------------------------------------------

def add_plan_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "plan",
        help="print the dynamic chunk plan of one prompt and its predicted TTFT",
        description="Plan the chunks of one prompt from latency coefficients (or a saved "
                    "profile) and compare predicted TTFT against fixed chunks of --budget.")
    src = p.add_argument_group("latency model (coefficients in ms, or a saved profile)")
    add_model_arguments(src, "profile JSON saved by the plugin")
    p.add_argument("--prompt-len", type=int, required=True, help="prompt length in tokens")
    p.add_argument("--budget", type=int, default=None,
                   help="token budget per step, also the base chunk and the fixed chunk "
                        "(default: the profile's base chunk)")
    p.add_argument("--pp", type=int, default=2, help="pipeline stages (default 2)")
    p.add_argument("--smooth", type=float, default=1.0, help="smooth factor in (0, 1]")
    p.add_argument("--min-chunk", type=int, default=None,
                   help="smallest chunk (default min(4096, budget))")
    p.add_argument("--block-size", type=int, default=16, help="KV block size (default 16)")
    p.add_argument("--target-ms", type=float, default=None,
                   help="per-chunk target in ms (default: cost of the base chunk at L=0)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(run=run_plan)
    return p


def _load_profile(path: str) -> tuple[LatencyModel, dict]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise CliError(f"cannot read profile {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CliError(f"profile {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise CliError(f"profile {path} has no latency model")
    try:
        model = LatencyModel.from_dict(data["model"])
    except (TypeError, ValueError) as exc:
        raise CliError(f"profile {path} has a bad latency model: {exc}") from None
    return model, data


def _plan_model(args: argparse.Namespace) -> tuple[LatencyModel, dict]:
    if wants_profile(args):
        return _load_profile(args.profile)
    return model_from_coefficients(args), {}


def _positive(name: str, value: int | None) -> None:
    if value is None or value < 1:
        raise CliError(f"{name} must be a positive integer, got {value}")


def run_plan(args: argparse.Namespace) -> int:
    model, profile = _plan_model(args)
    budget = args.budget
    if budget is None:
        settings = profile.get("settings") if isinstance(profile.get("settings"), dict) else {}
        budget = settings.get("base_chunk")
        if not isinstance(budget, int):
            raise CliError("--budget is required (the profile does not name a base chunk)")
    _positive("--prompt-len", args.prompt_len)
    _positive("--budget", budget)
    _positive("--pp", args.pp)
    _positive("--block-size", args.block_size)
    if not 0.0 < args.smooth <= 1.0:
        raise CliError(f"--smooth must be in (0, 1], got {args.smooth}")
    min_chunk = min(4096, budget) if args.min_chunk is None else args.min_chunk
    if min_chunk < 0:
        raise CliError(f"--min-chunk must be >= 0, got {min_chunk}")
    if args.target_ms is not None and not (math.isfinite(args.target_ms) and args.target_ms > 0):
        raise CliError(f"--target-ms must be a positive number, got {args.target_ms}")
    predictor = ChunkSizePredictor(model, base_chunk=budget, smooth_factor=args.smooth,
                                   min_chunk=min_chunk, block_size=args.block_size,
                                   target_ms=args.target_ms)
    if not predictor.ready:
        raise CliError(f"cannot plan with this model: {predictor.not_ready_reason}")

    result = compare_plans(predictor, args.prompt_len, budget, args.pp)
    result = {"model": model.to_dict(), "target_ms": predictor.target_ms,
              "smooth_factor": predictor.smooth_factor, "min_chunk": predictor.min_chunk,
              "alignment": predictor.alignment, **result}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"model: {describe(model)} "
          f"(ms); target {predictor.target_ms:.2f} ms per chunk")
    print(f"prompt {args.prompt_len} tokens, budget {budget}, pp {args.pp}, smooth "
          f"{predictor.smooth_factor}, min chunk {predictor.min_chunk}, alignment "
          f"{predictor.alignment}")
    for line in format_chunk_table(result["chunks"], result["fixed_chunks"]):
        print(line)
    ratio = result["ttft_ratio"]
    print(f"predicted TTFT at pp={args.pp}: fixed {result['ttft_fixed_ms']:.1f} ms "
          f"({len(result['fixed_chunks'])} chunks of {budget}), dynamic "
          f"{result['ttft_dynamic_ms']:.1f} ms ({len(result['chunks'])} chunks), "
          f"ratio {ratio:.3f}")
    return 0


# -- serve-model --------------------------------------------------------------------------

_MODEL_FILES = {"config.json", "tokenizer.json", "tokenizer_config.json"}


def add_serve_model_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "serve-model",
        help="write a tiny dummy-weight Llama directory that `vllm serve` loads offline",
        description="Write a tiny Llama config and a small word-level tokenizer to DIR, so "
                    "`vllm serve DIR --load-format dummy` runs with text prompts, the OpenAI "
                    "API and `vllm bench serve`, without the hub or real weights.")
    p.add_argument("dir", metavar="DIR", help="directory to write (created if missing)")
    p.set_defaults(run=run_serve_model)
    return p


def run_serve_model(args: argparse.Namespace) -> int:
    from .testing.server import CPU_SERVER_ENV, ServerSpec, operator_command, server_command
    from .testing.tiny_model import write_tiny_llama

    target = Path(args.dir)
    if target.exists() and not target.is_dir():
        raise CliError(f"{target} exists and is not a directory")
    # Never overwrite the config of a real model someone pointed us at by mistake.
    foreign = sorted(p.name for p in target.iterdir() if p.name not in _MODEL_FILES) \
        if target.is_dir() else []
    if foreign:
        raise CliError(f"{target} already holds other files ({', '.join(foreign[:3])}); "
                       "give an empty or new directory")
    try:
        out = write_tiny_llama(target, with_tokenizer=True).resolve()
    except ImportError as exc:
        raise CliError(f"the tokenizer needs the `tokenizers` package: {exc}") from None
    except OSError as exc:
        raise CliError(f"cannot write {target}: {exc.strerror or exc}") from None
    spec = ServerSpec(str(out), 8000, enforce_eager=False, cpp_config={"enabled": True})
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in CPU_SERVER_ENV.items()
                   if k.startswith("VLLM_CPU"))
    print(f"wrote {out} (" + ", ".join(sorted(_MODEL_FILES)) + "; dummy weights, no hub)")
    print("serve it with 2 pipeline stages and CPP on:")
    print(f"  {operator_command(spec)}")
    print("with vllm-cpu, whose `vllm` script does not start, the same server is:")
    print(f"  {env} {shlex.join(server_command(spec, 'python'))}")
    return 0


# -- entry point --------------------------------------------------------------------------

SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], argparse.ArgumentParser]] = [
    add_plan_parser,
    add_demo_parser,
    add_simulate_parser,
    add_report_parser,
    add_serve_model_parser,
]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Tools for dynamic chunked pipeline parallelism.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return int(args.run(args))
    except CliError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:
        # --help and friends exit through argparse.
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)


if __name__ == "__main__":
    raise SystemExit(main())
