"""cpp_config parsing and engine validation, without vLLM (a duck-typed VllmConfig)."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from vllm_ascend_cpp.config import (
    CppConfig,
    config_keys,
    cpp_config_from_additional,
    parse_cpp_config,
    validate_for_engine,
)


def fake_vllm_config(
    pp: int = 2,
    chunked: bool = True,
    budget: int = 2048,
    scheduler_cls: object = None,
    extension: str = "",
    additional: dict | None = None,
) -> SimpleNamespace:
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(
            max_num_batched_tokens=budget,
            max_num_seqs=16,
            enable_chunked_prefill=chunked,
            scheduler_cls=scheduler_cls,
            long_prefill_token_threshold=0,
        ),
        parallel_config=SimpleNamespace(
            pipeline_parallel_size=pp,
            tensor_parallel_size=1,
            worker_extension_cls=extension,
        ),
        cache_config=SimpleNamespace(block_size=16),
        model_config=SimpleNamespace(max_model_len=16384),
        additional_config=additional if additional is not None else {},
    )


def test_defaults() -> None:
    cfg = parse_cpp_config({"enabled": True})
    assert cfg.enabled and cfg.smooth_factor == 1.0 and cfg.min_chunk is None
    assert cfg.num_samples == 64 and cfg.online_calibration and cfg.base_chunk is None


def test_absent_and_disabled() -> None:
    assert cpp_config_from_additional(None) is None
    assert cpp_config_from_additional({}) is None
    assert cpp_config_from_additional({"other": 1}) is None
    assert cpp_config_from_additional({"cpp_config": {}}) == CppConfig()
    assert not cpp_config_from_additional({"cpp_config": {"enabled": False}}).enabled


def test_json_string_accepted() -> None:
    cfg = parse_cpp_config('{"enabled": true, "smooth_factor": 0.8}')
    assert cfg.enabled and cfg.smooth_factor == pytest.approx(0.8)


# At least 20 malformed values, each rejected with a message naming the key.
MALFORMED = [
    ({"enabled": "yes"}, "enabled"),
    ({"enabled": 1}, "enabled"),
    ({"smooth_factor": 0}, "smooth_factor"),
    ({"smooth_factor": 1.5}, "smooth_factor"),
    ({"smooth_factor": -0.1}, "smooth_factor"),
    ({"smooth_factor": "0.5"}, "smooth_factor"),
    ({"smooth_factor": float("nan")}, "smooth_factor"),
    ({"smooth_factor": True}, "smooth_factor"),
    ({"min_chunk": 0}, "min_chunk"),
    ({"min_chunk": -64}, "min_chunk"),
    ({"min_chunk": 64.5}, "min_chunk"),
    ({"base_chunk": 0}, "base_chunk"),
    ({"base_chunk": "2048"}, "base_chunk"),
    ({"num_samples": 4}, "num_samples"),
    ({"num_samples": 100000}, "num_samples"),
    ({"sample_repeats": 0}, "sample_repeats"),
    ({"online_calibration": "true"}, "online_calibration"),
    ({"calibration_window": 2}, "calibration_window"),
    ({"max_failed_fits": 0}, "max_failed_fits"),
    ({"profile_cache_dir": 5}, "profile_cache_dir"),
    ({"trace_file": ["a"]}, "trace_file"),
    ({"target": "fastest"}, "target"),
    ({"log_interval_s": 0}, "log_interval_s"),
    ({"smoothing": 0.5}, "smoothing"),  # unknown key (typo)
    ({"enable": True}, "enable"),  # unknown key (typo)
]


@pytest.mark.parametrize("raw,key", MALFORMED, ids=[k for _, k in MALFORMED])
def test_malformed_rejected_naming_key(raw: dict, key: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_cpp_config({"enabled": True, **raw})
    assert key in str(e.value)
    assert "[CPP]" in str(e.value)


@pytest.mark.parametrize("raw", [[1, 2], 3, "not json", '"a string"', True])
def test_not_an_object(raw: object) -> None:
    with pytest.raises(ValueError, match="cpp_config"):
        parse_cpp_config(raw)


def test_engine_rules() -> None:
    cfg = parse_cpp_config({"enabled": True})
    resolved, facts = validate_for_engine(cfg, fake_vllm_config())
    assert resolved.base_chunk == 2048 and resolved.min_chunk == 512  # base // 4
    big, _ = validate_for_engine(cfg, fake_vllm_config(budget=32768))
    assert big.min_chunk == 4096
    auto, _ = validate_for_engine(parse_cpp_config({"enabled": True, "target": "auto"}),
                                  fake_vllm_config(budget=32768))
    assert auto.min_chunk == 256  # the auto search weighs c itself
    tiny, _ = validate_for_engine(parse_cpp_config({"enabled": True, "target": "auto"}),
                                  fake_vllm_config(budget=128))
    assert tiny.min_chunk == 128
    chosen, _ = validate_for_engine(
        parse_cpp_config({"enabled": True, "target": "auto", "min_chunk": 1024}),
        fake_vllm_config(budget=32768))
    assert chosen.min_chunk == 1024
    assert facts.pp_size == 2 and facts.block_size == 16

    rules = [
        (dict(pp=1), "pipeline_parallel_size"),
        (dict(chunked=False), "enable_chunked_prefill"),
        (dict(scheduler_cls="my.Scheduler"), "scheduler_cls"),
        (dict(extension="my.Ext"), "worker_extension_cls"),
        (
            dict(additional={"scheduler_config": {"enable_balance_scheduling": True}}),
            "balance",
        ),
        (
            dict(additional={"scheduler_config": {"profiling_chunk_config": {"enabled": True}}}),
            "profiling_chunk_config",
        ),
        (dict(additional={"profiling_chunk_config": {"enabled": True}}), "profiling_chunk_config"),
    ]
    for kwargs, needle in rules:
        with pytest.raises(ValueError, match=needle):
            validate_for_engine(cfg, fake_vllm_config(**kwargs))


def test_balance_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_ASCEND_BALANCE_SCHEDULING", "1")
    with pytest.raises(ValueError, match="VLLM_ASCEND_BALANCE_SCHEDULING"):
        validate_for_engine(parse_cpp_config({"enabled": True}), fake_vllm_config())


def test_base_chunk_above_budget_rejected_and_min_chunk_clamped() -> None:
    with pytest.raises(ValueError, match="base_chunk"):
        validate_for_engine(parse_cpp_config({"enabled": True, "base_chunk": 4096}),
                            fake_vllm_config(budget=2048))
    resolved, _ = validate_for_engine(
        parse_cpp_config({"enabled": True, "base_chunk": 1024, "min_chunk": 4096}),
        fake_vllm_config(),
    )
    assert resolved.base_chunk == 1024 and resolved.min_chunk == 1024


def test_our_own_scheduler_is_not_a_user_scheduler() -> None:
    cfg = parse_cpp_config({"enabled": True})
    ours = fake_vllm_config(scheduler_cls="vllm_ascend_cpp.scheduler.CppScheduler")
    validate_for_engine(cfg, ours)


def test_config_keys_listed() -> None:
    keys = config_keys()
    assert "enabled" in keys and "given" not in keys and len(keys) == len(set(keys))


def test_env_var_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_CPP_CONFIG", '{"enabled": true, "smooth_factor": 0.5}')
    cfg = cpp_config_from_additional({})
    assert cfg is not None and cfg.enabled and cfg.smooth_factor == 0.5
    # additional_config wins where both are given
    assert not cpp_config_from_additional({"cpp_config": {"enabled": False}}).enabled
    monkeypatch.setenv("VLLM_CPP_CONFIG", '{"enabled": "yes"}')
    with pytest.raises(ValueError, match="enabled"):
        cpp_config_from_additional(None)


def test_unknown_test_fault_stops_startup(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_ascend_cpp import faults

    monkeypatch.setenv(faults.ENV, "sweep_nann")
    faults.active.cache_clear()
    try:
        with pytest.raises(ValueError, match="sweep_nann.*known: sweep_raise, sweep_nan,"):
            validate_for_engine(parse_cpp_config({"enabled": True}), fake_vllm_config())
        monkeypatch.setenv(faults.ENV, "calib_noise")
        faults.active.cache_clear()
        validate_for_engine(parse_cpp_config({"enabled": True}), fake_vllm_config())
        # Read once: a later change of the variable does not reach this process.
        monkeypatch.setenv(faults.ENV, "sweep_nann")
        assert faults.active() == "calib_noise"
        assert faults.step_ms_filter() is not None
    finally:
        monkeypatch.delenv(faults.ENV)
        faults.active.cache_clear()
    assert faults.step_ms_filter() is None


def test_step_leak_fault_keeps_1k_per_call_and_is_off_by_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_ascend_cpp import faults

    monkeypatch.delenv(faults.ENV, raising=False)
    faults.active.cache_clear()
    assert faults.step_hook() is None
    monkeypatch.setenv(faults.ENV, "step_leak_1k")
    monkeypatch.setattr(faults, "_leaked", [])
    faults.active.cache_clear()
    try:
        hook = faults.step_hook()
        assert hook is not None
        for _ in range(3):
            hook()
        assert [len(b) for b in faults._leaked] == [faults.LEAK_BYTES] * 3
    finally:
        monkeypatch.delenv(faults.ENV)
        faults.active.cache_clear()


# ----- the front-end hook's hand-over (patch/engine_args.py) ---------------------------------


def test_take_cpp_config_strips_the_key_and_keeps_the_rest() -> None:
    from vllm_ascend_cpp.patch.engine_args import take_cpp_config

    given = {"cpp_config": {"enabled": True, "smooth_factor": 0.5}, "enable_kv_nz": True}
    stripped, text = take_cpp_config(given)
    assert stripped == {"enable_kv_nz": True}
    assert json.loads(text) == {"enabled": True, "smooth_factor": 0.5}
    assert "cpp_config" in given  # the operator's dict is not changed
    # A JSON string for the whole flag, or for the cpp_config value, works the same way.
    stripped, text = take_cpp_config('{"cpp_config": "{\\"enabled\\": true}", "x": 1}')
    assert stripped == {"x": 1} and json.loads(text) == {"enabled": True}
    plain = {"x": 1}
    assert take_cpp_config(plain) == (plain, None)
    assert take_cpp_config(None) == (None, None)
    with pytest.raises(ValueError, match=r"cpp_config\.min_chunk"):
        take_cpp_config({"cpp_config": {"enabled": True, "min_chunk": 0}})


def test_environment_is_handed_back_to_the_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_ascend_cpp.patch import engine_args as ea

    monkeypatch.setenv("VLLM_CPP_CONFIG", "operator")
    monkeypatch.setattr(ea._Carried, "value", None)
    monkeypatch.setattr(ea._Carried, "previous", None)
    ea.carry_in_environment('{"enabled": true}')
    assert os.environ["VLLM_CPP_CONFIG"] == '{"enabled": true}'
    ea.release_environment()
    assert os.environ["VLLM_CPP_CONFIG"] == "operator"
    # Changed by someone else meanwhile: left alone.
    ea.carry_in_environment("ours")
    monkeypatch.setenv("VLLM_CPP_CONFIG", "theirs")
    ea.release_environment()
    assert os.environ["VLLM_CPP_CONFIG"] == "theirs"
