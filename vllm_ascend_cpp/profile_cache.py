"""The fitted profile on disk, keyed by everything that changes step latency.

A restart with the same key (model, dtype, quantization, parallel sizes, token budget, block
size, device, software versions, sweep settings) loads the profile and skips the sweep.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any

from vllm_ascend_cpp.log import logger

SCHEMA = 1


def cache_key_fields(vllm_config: Any, cfg: Any, facts: Any) -> dict[str, Any]:
    from vllm_ascend_cpp import __version__, compat

    model = vllm_config.model_config
    hf = getattr(model, "hf_config", None)
    try:
        hf_json = hf.to_json_string() if hf is not None else ""
    except Exception:
        hf_json = repr(hf)
    versions = {"plugin": __version__}
    v = compat.vllm_version()
    versions["vllm"] = ".".join(map(str, v)) if v else "none"
    try:
        import torch

        versions["torch"] = torch.__version__
    except Exception:
        versions["torch"] = "none"
    return {
        "schema": SCHEMA,
        "model": str(getattr(model, "model", "")),
        "hf_config_sha": hashlib.sha256(hf_json.encode()).hexdigest()[:16],
        "dtype": str(getattr(model, "dtype", "")),
        "quantization": str(getattr(model, "quantization", None)),
        "tp": facts.tp_size,
        "pp": facts.pp_size,
        "max_num_batched_tokens": facts.max_num_batched_tokens,
        "base_chunk": cfg.base_chunk,
        # Under "auto" the sweep covers the step budget, not the base chunk.
        "target": cfg.target,
        "block_size": facts.block_size,
        "device": compat.platform_name(),
        # Compiled graphs and eager kernels cost differently per step.
        "enforce_eager": bool(getattr(model, "enforce_eager", False)),
        "compilation": str(getattr(getattr(vllm_config, "compilation_config", None), "mode", "")),
        "num_samples": cfg.num_samples,
        "sample_repeats": cfg.sample_repeats,
        "versions": versions,
    }


def cache_key(fields: dict[str, Any]) -> str:
    blob = json.dumps(fields, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def cache_path(cache_dir: str, key: str) -> str:
    return os.path.join(cache_dir, f"cpp-profile-{key}.json")


def load(cache_dir: str | None, key: str) -> dict | None:
    if not cache_dir:
        return None
    path = cache_path(cache_dir, key)
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        logger.warning("[CPP] ignoring unreadable profile cache %s (%s); profiling again", path, e)
        return None
    if data.get("key") != key or "profile" not in data:
        logger.warning("[CPP] ignoring profile cache %s: key mismatch; profiling again", path)
        return None
    return data


def save(cache_dir: str | None, key: str, fields: dict[str, Any], profile: dict) -> str | None:
    if not cache_dir:
        return None
    try:
        os.makedirs(cache_dir, exist_ok=True)
        path = cache_path(cache_dir, key)
        # Atomic: a crash mid-write must not leave a half file that the next start trusts.
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".cpp-profile-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"key": key, "fields": fields, "profile": profile}, fh, indent=2)
        os.replace(tmp, path)
        return path
    except OSError as e:
        logger.warning("[CPP] could not save the profile cache in %s (%s)", cache_dir, e)
        return None
