"""vllm-ascend-cpp: Dynamic Chunked Pipeline Parallelism (CPP) for vLLM and vllm-ascend.

`register()` is the `vllm.general_plugins` entry point. vLLM calls it in every process it
starts (front end, engine core, workers), possibly more than once. It only installs two thin
wrappers; they do nothing unless `cpp_config` (from `--additional-config`, which the front-end
wrapper moves into the env var VLLM_CPP_CONFIG, or that variable set directly) is enabled.
Importing this package never imports vLLM or torch.
"""

from __future__ import annotations

from vllm_ascend_cpp.log import logger

__version__ = "0.1.0"

_registered = False


def register() -> None:
    """Install the CPP hooks into vLLM (idempotent; a no-op where vLLM is absent or too old)."""
    global _registered
    if _registered:
        return
    from vllm_ascend_cpp import compat

    problem = compat.check_vllm()
    if problem is not None:
        logger.warning("[CPP] plugin not installed: %s", problem)
        _registered = True
        return
    from vllm_ascend_cpp.patch import install

    install()
    _registered = True
