"""`--additional-config '{"cpp_config": ...}'` against vllm-ascend 0.27+'s strict AscendConfig.

vLLM's real `EngineArgs.create_engine_config` builds the `VllmConfig`; its `__post_init__` calls
the platform's `check_and_update_config`, which here first runs the fake of vllm-ascend's
strict `init_ascend_config` (tests/fakes/ascend.py: pydantic, `extra="forbid"`, the vLLM-Omni
exemption) and then the CPU platform's own. The engine-core and worker side is a spawned
process, as vLLM starts them: it unpickles the VllmConfig, runs the fake NPUWorker and
BalanceScheduler constructors (both call the strict init again), and asks the plugin for its
cpp_config the way the executor hook and the scheduler do. No engine is started.
"""

from __future__ import annotations

import importlib.machinery
import json
import multiprocessing
import os
import sys
import types
from typing import Any

import pytest

from tests.fakes import ascend as fk
from vllm_ascend_cpp.config import ENV_KEY
from vllm_ascend_cpp.patch import engine_args as hook

BUDGET = 2048
CPP = {"enabled": True, "smooth_factor": 0.8, "trace_file": "/tmp/cpp-strict-trace.jsonl"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from vllm_ascend_cpp.testing.tiny_model import write_tiny_llama

    return str(write_tiny_llama(tmp_path_factory.mktemp("strict") / "tiny-llama"))


@pytest.fixture
def strict_platform(monkeypatch: pytest.MonkeyPatch) -> fk.StrictAscendState:
    """vLLM's current platform, with vllm-ascend 0.27+'s strict config check run first."""
    from vllm.platforms import current_platform

    import vllm_ascend_cpp

    vllm_ascend_cpp.register()
    original = current_platform.check_and_update_config

    def check_and_update_config(vllm_config: Any) -> None:
        fk.StrictNPUPlatform.check_and_update_config(vllm_config)
        original(vllm_config)

    monkeypatch.setattr(current_platform, "check_and_update_config", check_and_update_config)
    monkeypatch.setattr(fk, "STRICT_STATE", fk.StrictAscendState())
    # setenv first: delenv of an absent variable records nothing, and the value a test's
    # engine carried would then outlive the test (and look like an operator's afterwards).
    monkeypatch.setenv(ENV_KEY, "")
    monkeypatch.delenv(ENV_KEY)
    monkeypatch.setattr(hook._Carried, "value", None)
    monkeypatch.setattr(hook._Carried, "previous", None)
    return fk.STRICT_STATE


def engine_args(model_dir: str, additional: dict) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=model_dir, load_format="dummy", skip_tokenizer_init=True,
        pipeline_parallel_size=2, enforce_eager=True, enable_chunked_prefill=True,
        max_num_batched_tokens=BUDGET, max_model_len=16384, distributed_executor_backend="mp",
        additional_config=additional,
    )


def engine_side(vllm_config: Any, queue: Any) -> None:
    """What a spawned engine-core / worker process does with the pickled VllmConfig."""
    try:
        from tests.fakes import ascend as fake
        from vllm_ascend_cpp.config import cpp_config_from_additional

        fake.StrictNPUWorker(vllm_config, 0, 0, "tcp://127.0.0.1:0", True)
        fake.StrictBalanceScheduler(vllm_config, None, None, 16)
        cfg = cpp_config_from_additional(vllm_config.additional_config)
        queue.put({"callers": fake.STRICT_STATE.callers,
                   "cfg": None if cfg is None else [cfg.enabled, cfg.smooth_factor,
                                                    cfg.trace_file]})
    except Exception as e:  # the parent asserts on it
        queue.put({"error": f"{type(e).__name__}: {e}"})


def run_engine_side(vllm_config: Any) -> dict:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=engine_side, args=(vllm_config, queue))
    proc.start()
    try:
        return queue.get(timeout=180)
    finally:
        proc.join(timeout=60)


def test_the_strict_fake_refuses_cpp_config_without_the_hook(
        model_dir: str, strict_platform: fk.StrictAscendState) -> None:
    # Negative control: the documented line reaches init_ascend_config when nothing takes
    # the key out first, and the strict config refuses it, naming the key.
    from vllm.engine.arg_utils import EngineArgs

    unhooked = EngineArgs.create_engine_config.__wrapped__
    with pytest.raises(Exception) as err:
        unhooked(engine_args(model_dir, {"cpp_config": CPP}))
    assert "cpp_config" in str(err.value) and "Unexpected keyword argument" in str(err.value)
    assert strict_platform.callers == ["platform"]


def test_vllm_omni_exemption_lets_unknown_keys_through(
        model_dir: str, strict_platform: fk.StrictAscendState,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The one case where main accepts unknown keys: vLLM-Omni importable.
    from vllm.engine.arg_utils import EngineArgs

    omni = types.ModuleType("vllm_omni")
    omni.__spec__ = importlib.machinery.ModuleSpec("vllm_omni", None)
    monkeypatch.setitem(sys.modules, "vllm_omni", omni)
    unhooked = EngineArgs.create_engine_config.__wrapped__
    config = unhooked(engine_args(model_dir, {"cpp_config": CPP, "omni_key": 1}))
    assert config.additional_config["omni_key"] == 1


def test_additional_config_line_passes_platform_worker_and_scheduler(
        model_dir: str, strict_platform: fk.StrictAscendState) -> None:
    args = engine_args(model_dir, {"cpp_config": CPP, "enable_kv_nz": True})
    config = args.create_engine_config()
    # The platform ran the strict check inside VllmConfig construction and passed.
    assert strict_platform.callers == ["platform"]
    assert "cpp_config" not in config.additional_config
    assert config.additional_config["enable_kv_nz"] is True  # Ascend's own keys stay
    assert json.loads(os.environ[ENV_KEY]) == CPP
    # The operator's EngineArgs still hold the flag (vLLM may build the config again).
    assert args.additional_config["cpp_config"] == CPP
    # Engine core and workers: a pickled copy, strict init again in the worker and the
    # scheduler, and the plugin finds its config there.
    reply = run_engine_side(config)
    assert "error" not in reply, reply
    assert reply["callers"] == ["worker", "scheduler"]
    assert reply["cfg"] == [True, 0.8, CPP["trace_file"]]


def test_next_engine_in_the_process_starts_from_the_operators_environment(
        model_dir: str, strict_platform: fk.StrictAscendState,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_ascend_cpp.config import cpp_config_from_additional

    engine_args(model_dir, {"cpp_config": CPP}).create_engine_config()
    assert ENV_KEY in os.environ
    plain = engine_args(model_dir, {}).create_engine_config()
    assert ENV_KEY not in os.environ
    assert cpp_config_from_additional(plain.additional_config) is None
    # An operator's own VLLM_CPP_CONFIG is put back, not dropped.
    operator = '{"enabled": true, "smooth_factor": 0.5}'
    monkeypatch.setenv(ENV_KEY, operator)
    engine_args(model_dir, {"cpp_config": CPP}).create_engine_config()
    assert json.loads(os.environ[ENV_KEY]) == CPP  # the flag wins, as before
    engine_args(model_dir, {}).create_engine_config()
    assert os.environ[ENV_KEY] == operator


def test_bad_cpp_config_is_refused_before_the_platform_reads_anything(
        model_dir: str, strict_platform: fk.StrictAscendState) -> None:
    with pytest.raises(ValueError, match=r"cpp_config\.smooth_factor"):
        engine_args(model_dir, {"cpp_config": {"enabled": True, "smooth_factor": 2}}) \
            .create_engine_config()
    assert strict_platform.callers == []
    assert ENV_KEY not in os.environ


def test_env_alternative_still_works(model_dir: str, strict_platform: fk.StrictAscendState,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_KEY, json.dumps(CPP))
    config = engine_args(model_dir, {}).create_engine_config()
    reply = run_engine_side(config)
    assert "error" not in reply, reply
    assert reply["cfg"] == [True, 0.8, CPP["trace_file"]]

