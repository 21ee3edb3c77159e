"""Validate `cpp_config` where the engine configuration is created (front-end process)."""

from __future__ import annotations

import functools
from typing import Any

from vllm_ascend_cpp.config import cpp_config_from_additional, validate_for_engine

_MARK = "_cpp_wrapped"


def validate_vllm_config(vllm_config: Any) -> None:
    cfg = cpp_config_from_additional(getattr(vllm_config, "additional_config", None))
    if cfg is not None and cfg.enabled:
        validate_for_engine(cfg, vllm_config)


def install() -> None:
    from vllm.engine.arg_utils import EngineArgs

    original = EngineArgs.create_engine_config
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def create_engine_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        vllm_config = original(self, *args, **kwargs)
        validate_vllm_config(vllm_config)
        return vllm_config

    setattr(create_engine_config, _MARK, True)
    EngineArgs.create_engine_config = create_engine_config
