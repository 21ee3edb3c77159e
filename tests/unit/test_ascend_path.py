"""The Ascend path, checked without the hardware.

NPU, CANN, torch-npu and vllm-ascend cannot run on this machine, so these tests drive the
plugin's worker and validation code through tests/fakes/ascend.py, whose signatures are copied
from the vllm-ascend 0.23.0 source distribution (each fake names its file). vLLM itself is
kept out of the process (sys.modules["vllm"] = None) where the code would otherwise import it:
on a real NPU worker vLLM is there, but it would only add seconds here, and the platform it
would report is this machine's CPU.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.fakes import ascend as fk
from vllm_ascend_cpp import compat
from vllm_ascend_cpp.config import parse_cpp_config, validate_for_engine
from vllm_ascend_cpp.patch.engine_args import validate_vllm_config
from vllm_ascend_cpp.worker.extension import CppWorkerExtension

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "vllm_ascend_cpp"
BLOCKED = ("torch_npu", "vllm_ascend")


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)


@pytest.fixture
def npu(monkeypatch: pytest.MonkeyPatch) -> tuple[fk.FakeNpuModule, fk.EventLog]:
    """A process that looks like a vllm-ascend worker: torch.npu registered, the NPU platform
    current, vLLM's distributed groups not reachable (worker_ranks falls back to rank 0)."""
    log = fk.EventLog()
    device = fk.install_torch_npu(monkeypatch, log)
    monkeypatch.setattr(compat, "current_platform", lambda: fk.FakeNPUPlatform)
    monkeypatch.setitem(sys.modules, "vllm", None)
    return device, log


# ----- imports ------------------------------------------------------------------------------


def test_import_and_register_without_vllm_ascend_or_vllm() -> None:
    blocked = ", ".join(repr(m) for m in (*BLOCKED, "vllm"))
    proc = _run(
        "import sys\n"
        f"for m in ({blocked}):\n"
        "    sys.modules[m] = None\n"
        "import vllm_ascend_cpp\n"
        "vllm_ascend_cpp.register()\n"
        "vllm_ascend_cpp.register()\n"
        "print('registered', vllm_ascend_cpp._registered)\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "registered True" in proc.stdout
    # Logged once (the second call is a no-op), and it says why nothing was installed.
    assert proc.stderr.count("[CPP] plugin not installed: vLLM is not importable") == 1


def test_no_module_imports_torch_npu_or_vllm_ascend_at_import_time() -> None:
    blocked = ", ".join(repr(m) for m in BLOCKED)
    proc = _run(
        "import importlib, pkgutil, sys\n"
        f"for m in ({blocked}):\n"
        "    sys.modules[m] = None\n"
        "import vllm_ascend_cpp\n"
        "names = [m.name for m in pkgutil.walk_packages(vllm_ascend_cpp.__path__,\n"
        "                                              'vllm_ascend_cpp.')]\n"
        "skipped = {'vllm_ascend_cpp.scheduler'}  # subclasses vLLM's Scheduler\n"
        "for name in names:\n"
        "    if name not in skipped:\n"
        "        importlib.import_module(name)\n"
        "print(len(names))\n"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split()[-1]) >= 20


def test_no_module_names_torch_npu_or_vllm_ascend_at_top_level() -> None:
    """scheduler.py cannot be imported without vLLM; read every module's top-level imports."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n.split(".")[0] in BLOCKED for n in names):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


# ----- device synchronize -------------------------------------------------------------------


def test_npu_platform_picks_torch_npu_synchronize(npu: tuple) -> None:
    device, _ = npu
    name, sync = compat.device_synchronize_fn()
    assert name == "torch.npu.synchronize"
    sync()
    assert device.synchronize_calls == 1
    assert compat.platform_name() == "npu"


def test_npu_sync_found_through_torch_npu_when_torch_has_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    device = fk.install_torch_npu(monkeypatch, register_on_torch=False)
    name, sync = compat.device_synchronize_fn(fk.FakeNPUPlatform)
    assert name == "torch.npu.synchronize" and sync == device.synchronize


def test_cpu_platform_has_no_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    fk.install_torch_npu(monkeypatch)
    name, sync = compat.device_synchronize_fn(SimpleNamespace(device_type="cpu"))
    assert name == "none" and sync() is None


# ----- the startup sweep on an NPU worker -----------------------------------------------------


def test_sweep_on_npu_worker_uses_profile_cpp_and_npu_sync(npu: tuple) -> None:
    device, log = npu
    worker = fk.make_worker(CppWorkerExtension, fk.FakeNPUModelRunner, log)
    sizes, repeats = [1024, 512, 128], 2
    result = worker.cpp_profile_sweep(sizes, repeats)
    assert "error" not in result, result
    assert result["dummy_run"] == "profile_cpp"
    assert result["sync"] == "torch.npu.synchronize"
    assert len(result["latencies_ms"]) == len(sizes)
    runs = worker.model_runner.dummy_runs
    # One warm-up at the largest size, then repeats per size; each one request, attention on,
    # called as vllm-ascend calls it itself (profile_cpp, no is_profile).
    assert [r["num_tokens"] for r in runs] == [1024] + [n for n in sizes for _ in range(repeats)]
    assert all(r["num_reqs"] == 1 and r["attention"] and r["profile_cpp"] for r in runs)
    assert not any(r["is_profile"] for r in runs)
    # Every timed run sits between two device syncs.
    kinds = log.kinds()
    assert kinds[0] == "dummy_run"
    assert kinds[1:] == ["npu.synchronize", "dummy_run", "npu.synchronize"] * (3 * repeats)
    assert device.synchronize_calls == 2 * 3 * repeats


def test_prepare_on_npu_worker_installs_a_timer_that_syncs_only_timed_steps(npu: tuple) -> None:
    device, log = npu
    worker = fk.make_worker(CppWorkerExtension, fk.FakeNPUModelRunner, log)
    reply = worker.cpp_prepare_worker(timing=True)
    assert reply == {"pp_rank": 0, "tp_rank": 0, "dummy_run": "profile_cpp",
                     "sync": "torch.npu.synchronize", "timer": True}
    before = device.synchronize_calls
    worker.execute_model(SimpleNamespace())  # not marked: runs exactly as without CPP
    assert device.synchronize_calls == before
    worker.execute_model(SimpleNamespace(**{compat.TIME_STEP_ATTR: True}))
    assert device.synchronize_calls == before + 2
    assert log.kinds()[-3:] == ["npu.synchronize", "execute_model", "npu.synchronize"]


@pytest.mark.parametrize(("runner_cls", "how"), [
    (fk.FakeNPUModelRunnerV2, "V2 runner: max_num_reqs=1, attention built (skip_attn=False)"),
    (fk.FakeNPUModelRunner310, "max_num_seqs=1, force_attention"),
])
def test_sweep_on_other_npu_runners_still_times_one_request(
        npu: tuple, runner_cls: type, how: str) -> None:
    worker = fk.make_worker(CppWorkerExtension, runner_cls, npu[1], max_num_seqs=64)
    result = worker.cpp_profile_sweep([256, 64], 1)
    assert "error" not in result, result
    assert result["dummy_run"] == how
    runs = worker.model_runner.dummy_runs
    assert runs and all(r["num_reqs"] == 1 and r["attention"] for r in runs)
    assert all(r.get("swallowed", []) == [] for r in runs)
    assert worker.model_runner.scheduler_config.max_num_seqs == 64
    assert getattr(worker.model_runner, "max_num_reqs", 64) == 64


def test_sweep_errors_come_back_as_data(npu: tuple) -> None:
    worker = fk.make_worker(CppWorkerExtension, fk.FakeNPUModelRunner, npu[1])

    def fail(*a: object, **k: object) -> None:
        raise RuntimeError("ACL error 507011")

    worker.model_runner._dummy_run = fail  # signature lost: compat takes the unknown path
    result = worker.cpp_profile_sweep([128], 1)
    assert result["error"] == "RuntimeError: ACL error 507011"


# ----- configuration rules --------------------------------------------------------------------


def ascend_vllm_config(additional: dict, scheduler_cls: str | None = None) -> SimpleNamespace:
    """A VllmConfig as vllm-ascend 0.23.0's NPUPlatform.check_and_update_config leaves it
    (platform.py): it sets scheduler_cls itself when profiling_chunk_config is enabled."""
    return SimpleNamespace(
        additional_config={"cpp_config": {"enabled": True}, **additional},
        scheduler_config=SimpleNamespace(max_num_batched_tokens=8192, max_num_seqs=64,
                                         enable_chunked_prefill=True,
                                         scheduler_cls=scheduler_cls),
        parallel_config=SimpleNamespace(pipeline_parallel_size=2, tensor_parallel_size=1,
                                        worker_extension_cls="",
                                        worker_cls="vllm_ascend.worker.worker.NPUWorker"),
        cache_config=SimpleNamespace(block_size=128),
        model_config=SimpleNamespace(max_model_len=32768),
    )


PROFILING_CHUNK_SCHEDULER = "vllm_ascend.core.scheduler_profiling_chunk.ProfilingChunkScheduler"


@pytest.mark.parametrize(("additional", "where"), [
    ({"profiling_chunk_config": {"enabled": True}}, "vllm-ascend's profiling_chunk_config"),
    ({"scheduler_config": {"profiling_chunk_config": {"enabled": True}}},
     "vllm-ascend's scheduler_config.profiling_chunk_config"),
])
def test_cpp_config_with_ascend_profiling_chunk_fails_clearly(
        monkeypatch: pytest.MonkeyPatch, additional: dict, where: str) -> None:
    monkeypatch.delenv(compat.ASCEND_BALANCE_ENV, raising=False)
    config = ascend_vllm_config(additional, PROFILING_CHUNK_SCHEDULER)
    with pytest.raises(ValueError) as err:
        validate_vllm_config(config)  # the front-end hook, before any process starts
    text = str(err.value)
    assert text.startswith("[CPP] cpp_config and " + where + " are both enabled")
    assert "Keep only cpp_config" in text


def test_ascend_profiling_chunk_present_but_disabled_is_fine(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(compat.ASCEND_BALANCE_ENV, raising=False)
    config = ascend_vllm_config({"profiling_chunk_config": {"enabled": False}})
    validate_vllm_config(config)


@pytest.mark.parametrize(("additional", "env", "needle"), [
    ({"scheduler_config": {"enable_balance_scheduling": True}}, None,
     "additional_config.scheduler_config.enable_balance_scheduling"),
    ({"enable_balance_scheduling": True}, None, "additional_config.enable_balance_scheduling"),
    ({}, "1", "VLLM_ASCEND_BALANCE_SCHEDULING=1"),
    ({}, "2", "VLLM_ASCEND_BALANCE_SCHEDULING=2"),  # bool(int("2")) in vllm-ascend
])
def test_balance_scheduling_by_key_or_env_fails(
        monkeypatch: pytest.MonkeyPatch, additional: dict, env: str | None,
        needle: str) -> None:
    if env is None:
        monkeypatch.delenv(compat.ASCEND_BALANCE_ENV, raising=False)
    else:
        monkeypatch.setenv(compat.ASCEND_BALANCE_ENV, env)
    with pytest.raises(ValueError, match="balance scheduling") as err:
        validate_for_engine(parse_cpp_config({"enabled": True}), ascend_vllm_config(additional))
    assert needle in str(err.value)


@pytest.mark.parametrize(("additional", "env"), [
    ({"enable_balance_scheduling": False}, "1"),  # 0.23.0: an explicit key wins over the env
    ({}, "0"),
    ({"scheduler_config": {"enable_balance_scheduling": False}}, None),
])
def test_balance_scheduling_off_is_accepted(
        monkeypatch: pytest.MonkeyPatch, additional: dict, env: str | None) -> None:
    if env is None:
        monkeypatch.delenv(compat.ASCEND_BALANCE_ENV, raising=False)
    else:
        monkeypatch.setenv(compat.ASCEND_BALANCE_ENV, env)
    validate_for_engine(parse_cpp_config({"enabled": True}), ascend_vllm_config(additional))


# ----- the fakes mirror the real signatures ----------------------------------------------------

FACTS = Path(__file__).resolve().parents[1] / "fakes"


def params_of(fn: object) -> list[str]:
    """inspect's view of a signature in tools/vllm_surfaces.params() form (no self, `*args`,
    a bare `*` before keyword-only parameters, `**kwargs`)."""
    import inspect

    out: list[str] = []
    star = False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            out.append("*" + p.name)
            star = True
        elif p.kind is p.KEYWORD_ONLY and not star:
            out += ["*", p.name]
            star = True
        elif p.kind is p.VAR_KEYWORD:
            out.append("**" + p.name)
        else:
            out.append(p.name)
    return out


def test_fakes_have_the_signatures_read_from_the_vllm_ascend_sdist() -> None:
    """tests/fakes/ascend_surfaces.json is written by `tools/check_vllm_compat.py --ascend
    0.23.0 --write-facts ...` from the unpacked sdist; the fakes must match it exactly."""
    import json

    facts = json.loads((FACTS / "ascend_surfaces.json").read_text())["0.23.0"]
    vllm = json.loads((FACTS / "vllm_surfaces.json").read_text())["0.23.0"]

    def sig(cls: type, name: str) -> list[str]:
        return params_of(getattr(cls, name))[1:]  # without self

    worker, runner = facts["ascend.worker"], facts["ascend.runner_v1"]
    pairs = [
        (sig(fk.FakeNPUWorker, "__init__"), worker["sig __init__"]),
        (sig(fk.FakeNPUWorker, "execute_model"), worker["sig execute_model"]),
        (sig(fk.FakeNPUWorker, "sample_tokens"), worker["sig sample_tokens"]),
        (sig(fk.FakeNPUWorker, "execute_dummy_batch"), worker["sig execute_dummy_batch"]),
        (sig(fk.FakeNPUWorker, "profile_prefill_latency"),
         facts["ascend.worker.profile"]["sig profile_prefill_latency"]),
        (sig(fk.FakeNPUModelRunner, "__init__"), runner["sig __init__"]),
        (sig(fk.FakeNPUModelRunner, "_dummy_run"), runner["sig _dummy_run"]),
        (sig(fk.FakeNPUModelRunner, "execute_model"), runner["sig execute_model"]),
        (sig(fk.FakeNPUModelRunner, "sample_tokens"), runner["sig sample_tokens"]),
        (sig(fk.FakeNPUModelRunner310, "_dummy_run"),
         facts["ascend.runner_310p"]["sig _dummy_run"]),
        (sig(fk.FakeNPUModelRunnerV2, "__init__"), facts["ascend.runner_v2"]["sig __init__"]),
        # The V2 NPU runner does not override _dummy_run: vLLM 0.23.0's V2 one is inherited.
        (sig(fk.FakeNPUModelRunnerV2, "_dummy_run"), vllm["runner.v2_dummy_run"]["params"]),
    ]
    for fake, real in pairs:
        assert fake == real
    assert facts["ascend.runner_v2"]["overrides _dummy_run"] is False
    assert facts["ascend.worker"]["base_modules"] == {"WorkerBase": "vllm.v1.worker.worker_base"}
    assert facts["ascend.platform"]["device_type"] == "field: str = 'npu'"
    assert facts["ascend.worker.profile"]["synchronize_calls"] == ["torch.npu.synchronize"]
    assert facts["ascend.worker.profile"]["dummy_run_keywords"] == [
        "force_attention", "num_tokens", "profile_cpp"]


def test_extension_names_do_not_clash_with_npu_worker() -> None:
    """vLLM's WorkerWrapperBase.init_worker asserts that no non-dunder attribute of the
    extension already exists on the worker class; NPUWorker's methods are from the sdist."""
    import json

    facts = json.loads((FACTS / "ascend_surfaces.json").read_text())["0.23.0"]
    ours = {a for a in dir(CppWorkerExtension) if not a.startswith("__")}
    assert ours and not ours & set(facts["ascend.worker"]["methods"])
    assert "profile_prefill_latency" in facts["ascend.worker"]["methods"]
