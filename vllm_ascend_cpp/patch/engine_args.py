"""The front-end hook: take `cpp_config` out of `additional_config` before vLLM builds the
engine configuration, and carry it to the engine processes through the environment.

Why: vLLM builds `VllmConfig` inside `EngineArgs.create_engine_config`, and its
`__post_init__` calls the platform's `check_and_update_config`. On vllm-ascend 0.27 and later
that runs `init_ascend_config`, a pydantic model with `extra="forbid"` that refuses any
`additional_config` key it does not know (unless vLLM-Omni is importable), and it runs again
in the engine core, in every `NPUWorker.__init__` and in `BalanceScheduler.__init__`, all
reading the same pickled `additional_config`. So the key must never reach `VllmConfig`.

How it travels instead: after the configuration is built, the JSON object goes into
`VLLM_CPP_CONFIG` (`config.ENV_KEY`, also the operator's alternative to the flag). Every
process that needs it inherits the environment of this one: the engine core and its workers
(spawned), Ray actors (vLLM copies `VLLM_*` variables to them), and a headless node of a
multi-node launch runs this same hook on its own identical command line. The variable is set
only after `create_engine_config` returns: vLLM warns about unknown `VLLM_*` variables there
(and fails under `--fail-on-environ-validation`), and the spawned processes start later.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from vllm_ascend_cpp.config import (
    CONFIG_KEY,
    ENV_KEY,
    cpp_config_from_additional,
    parse_cpp_config,
    validate_for_engine,
)

_MARK = "_cpp_wrapped"


class _Carried:
    """What this process put into ENV_KEY for the last engine it configured, and what the
    operator had there before, so the next engine built in the same process (tests, notebooks)
    starts from the operator's environment, not from the previous engine's flag."""

    value: str | None = None
    previous: str | None = None


def validate_vllm_config(vllm_config: Any) -> None:
    cfg = cpp_config_from_additional(getattr(vllm_config, "additional_config", None))
    if cfg is not None and cfg.enabled:
        validate_for_engine(cfg, vllm_config)


def take_cpp_config(additional: Any) -> tuple[Any, str | None]:
    """(additional_config without `cpp_config`, the `cpp_config` as JSON text), or
    (additional_config unchanged, None) when the key is absent. A malformed `cpp_config` is
    refused here, before vLLM reads the model's config."""
    parsed = additional
    if isinstance(additional, str):
        try:
            parsed = json.loads(additional)
        except json.JSONDecodeError:
            return additional, None  # vLLM reports its own flag's syntax
    if not isinstance(parsed, dict) or CONFIG_KEY not in parsed:
        return additional, None
    raw = parsed[CONFIG_KEY]
    parse_cpp_config(raw)
    text = raw if isinstance(raw, str) else json.dumps(raw)
    return {k: v for k, v in parsed.items() if k != CONFIG_KEY}, text


def release_environment() -> None:
    """Undo what an earlier engine configured in this process put into ENV_KEY."""
    if _Carried.value is not None and os.environ.get(ENV_KEY) == _Carried.value:
        if _Carried.previous is None:
            os.environ.pop(ENV_KEY, None)
        else:
            os.environ[ENV_KEY] = _Carried.previous
    _Carried.value = None


def carry_in_environment(text: str) -> None:
    _Carried.previous = os.environ.get(ENV_KEY)
    os.environ[ENV_KEY] = text
    _Carried.value = text


def install() -> None:
    from vllm.engine.arg_utils import EngineArgs

    original = EngineArgs.create_engine_config
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def create_engine_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        release_environment()
        given = self.additional_config
        stripped, text = take_cpp_config(given)
        if text is None:
            vllm_config = original(self, *args, **kwargs)
        else:
            # The EngineArgs keep the operator's dict, so a second call sees the flag again.
            self.additional_config = stripped
            try:
                vllm_config = original(self, *args, **kwargs)
            finally:
                self.additional_config = given
            carry_in_environment(text)
        validate_vllm_config(vllm_config)
        return vllm_config

    setattr(create_engine_config, _MARK, True)
    EngineArgs.create_engine_config = create_engine_config
