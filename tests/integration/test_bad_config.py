"""Bad configuration is refused where vLLM builds its engine configuration, in seconds.

Each case builds the real `VllmConfig` through vLLM's own `EngineArgs(...).create_engine_config()`
in this process (constructing EngineArgs loads the plugin, whose wrapper validates
`cpp_config`); no engine is started. Every malformed value and every engine rule CPP needs
must raise ValueError with a message that names the offending key.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

BUDGET = 2048


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from vllm_ascend_cpp.testing.tiny_model import write_tiny_llama

    return str(write_tiny_llama(tmp_path_factory.mktemp("bad-config") / "tiny-llama"))


def engine_config(model_dir: str, additional: Any, **kw: Any) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    args: dict[str, Any] = dict(
        model=model_dir, load_format="dummy", skip_tokenizer_init=True,
        pipeline_parallel_size=2, enforce_eager=True, enable_chunked_prefill=True,
        max_num_batched_tokens=BUDGET, max_model_len=16384, distributed_executor_backend="mp",
        additional_config=additional,
    )
    args.update(kw)
    return EngineArgs(**args).create_engine_config()


def on(**keys: Any) -> dict:
    return {"cpp_config": {"enabled": True, **keys}}


# (additional_config, the key the message must name). Each value is malformed on its own.
MALFORMED: list[tuple[Any, str]] = [
    ({"cpp_config": {"enabled": "yes"}}, "cpp_config.enabled"),
    ({"cpp_config": {"enabled": 1}}, "cpp_config.enabled"),
    ({"cpp_config": {"enabled": None}}, "cpp_config.enabled"),
    (on(smooth_factor=0), "cpp_config.smooth_factor"),
    (on(smooth_factor=1.01), "cpp_config.smooth_factor"),
    (on(smooth_factor="0.8"), "cpp_config.smooth_factor"),
    (on(smooth_factor=[0.8]), "cpp_config.smooth_factor"),
    (on(min_chunk=0), "cpp_config.min_chunk"),
    (on(min_chunk=-64), "cpp_config.min_chunk"),
    (on(min_chunk=512.0), "cpp_config.min_chunk"),
    (on(base_chunk=0), "cpp_config.base_chunk"),
    (on(base_chunk=2 * BUDGET), "cpp_config.base_chunk"),  # above max_num_batched_tokens
    (on(base_chunk=True), "cpp_config.base_chunk"),
    (on(target="fastest"), "cpp_config.target"),
    (on(target=1), "cpp_config.target"),
    (on(num_samples=7), "cpp_config.num_samples"),
    (on(num_samples=1025), "cpp_config.num_samples"),
    (on(sample_repeats=0), "cpp_config.sample_repeats"),
    (on(calibration_window=15), "cpp_config.calibration_window"),
    (on(max_failed_fits=0), "cpp_config.max_failed_fits"),
    (on(online_calibration="false"), "cpp_config.online_calibration"),
    (on(profile_cache_dir=5), "cpp_config.profile_cache_dir"),
    (on(trace_file=["trace.jsonl"]), "cpp_config.trace_file"),
    (on(log_interval_s=0), "cpp_config.log_interval_s"),
    (on(log_interval_s=float("inf")), "cpp_config.log_interval_s"),
    (on(smoothfactor=0.5), "cpp_config.smoothfactor"),  # a typo is an unknown key
    ({"cpp_config": {"enabled": True, "sweep": {"samples": 64}}}, "cpp_config.sweep"),
    ({"cpp_config": '{"enabled": true, "num_samples": "64"}'}, "cpp_config.num_samples"),
    # JSON that is not an object, or not JSON at all.
    ({"cpp_config": "[1, 2]"}, "cpp_config"),
    ({"cpp_config": '"enabled"'}, "cpp_config"),
    ({"cpp_config": "{enabled: true}"}, "cpp_config"),
    ({"cpp_config": 5}, "cpp_config"),
    ({"cpp_config": ["enabled"]}, "cpp_config"),
]


def _id(case: tuple[Any, str]) -> str:
    return json.dumps(case[0], default=str)[:60]


@pytest.mark.parametrize("additional,key", MALFORMED, ids=[_id(c) for c in MALFORMED])
def test_malformed_cpp_config_is_rejected_naming_the_key(
    model_dir: str, additional: Any, key: str
) -> None:
    with pytest.raises(ValueError) as err:
        engine_config(model_dir, additional)
    message = str(err.value)
    assert message.startswith("[CPP]"), message
    assert key in message, message


def test_at_least_twenty_malformed_values() -> None:
    assert len(MALFORMED) >= 20


# (engine arguments, additional_config extras, env, what the message must name)
ENGINE_RULES: list[tuple[str, dict, dict, dict, str]] = [
    ("pp=1", {"pipeline_parallel_size": 1}, {}, {}, "pipeline_parallel_size"),
    # vLLM itself requires budget >= max_model_len without chunked prefill.
    ("chunked prefill off", {"enable_chunked_prefill": False, "max_model_len": BUDGET}, {}, {},
     "enable_chunked_prefill"),
    ("user scheduler_cls", {"scheduler_cls": "my_pkg.sched.MyScheduler"}, {}, {},
     "scheduler_cls"),
    ("user worker_extension_cls", {"worker_extension_cls": "my_pkg.ext.MyExtension"}, {}, {},
     "worker_extension_cls"),
    ("ascend balance scheduling key", {},
     {"scheduler_config": {"enable_balance_scheduling": True}}, {}, "enable_balance_scheduling"),
    ("ascend balance scheduling key (old place)", {}, {"enable_balance_scheduling": True}, {},
     "enable_balance_scheduling"),
    ("ascend balance scheduling env", {}, {}, {"VLLM_ASCEND_BALANCE_SCHEDULING": "1"},
     "VLLM_ASCEND_BALANCE_SCHEDULING"),
    ("ascend profiling chunk", {},
     {"scheduler_config": {"profiling_chunk_config": {"enabled": True}}}, {},
     "profiling_chunk_config"),
    ("ascend profiling chunk (old place)", {}, {"profiling_chunk_config": {"enabled": True}},
     {}, "profiling_chunk_config"),
    ("ascend short-request-first", {},
     {"scheduler_config": {"short_request_first_config": {"enabled": True}}}, {},
     "scheduler_config.short_request_first_config.enabled"),
    ("ascend short-request-first (old place)", {},
     {"short_request_first_config": {"enabled": True}}, {},
     "additional_config.short_request_first_config.enabled"),
    ("ascend batch-job", {}, {"scheduler_config": {"batch_job_sched_config": {"enabled": True}}},
     {}, "batch_job_sched_config.enabled"),
    ("ascend dyntra_lb", {}, {"scheduler_config": {"dyntra_lb_config": {"enabled": True}}}, {},
     "dyntra_lb_config.enabled"),
    ("ascend recompute scheduler", {}, {"scheduler_config": {"recompute_scheduler_enable": True}},
     {}, "recompute_scheduler_enable"),
    ("ascend dynamic batch", {}, {"SLO_limits_for_dynamic_batch": 50}, {},
     "SLO_limits_for_dynamic_batch"),
]


@pytest.mark.parametrize("name,args,extra,env,key", ENGINE_RULES,
                         ids=[r[0] for r in ENGINE_RULES])
def test_engine_rules_are_enforced_naming_the_setting(
    model_dir: str, monkeypatch: pytest.MonkeyPatch, name: str, args: dict, extra: dict,
    env: dict, key: str,
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError) as err:
        engine_config(model_dir, {**on(), **extra}, **args)
    message = str(err.value)
    assert message.startswith("[CPP]"), message
    assert key in message, message


def test_valid_configs_pass_and_rules_apply_only_when_enabled(model_dir: str) -> None:
    # Positive controls: without them every case above could pass for the wrong reason.
    cfg = engine_config(model_dir, on(smooth_factor=0.8, min_chunk=512, target="auto"))
    # The front-end hook carries cpp_config in the environment, never in VllmConfig (strict
    # platform configs refuse unknown keys: tests/integration/test_ascend_strict.py).
    assert "cpp_config" not in cfg.additional_config
    assert json.loads(os.environ["VLLM_CPP_CONFIG"])["smooth_factor"] == 0.8
    engine_config(model_dir, {"cpp_config": {"enabled": False}}, pipeline_parallel_size=1)
    engine_config(model_dir, {"cpp_config": '{"enabled": true}'})
    engine_config(model_dir, {}, pipeline_parallel_size=1)


def test_validation_needs_no_model_weights(model_dir: str) -> None:
    # Only config.json exists: the check happens before anything is loaded.
    assert sorted(p.name for p in Path(model_dir).iterdir()) == ["config.json"]
    with pytest.raises(ValueError, match=r"cpp_config\.num_samples"):
        engine_config(model_dir, on(num_samples=0))
