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
    # Submodules another test module already imported would still resolve without the parent.
    for name in [m for m in sys.modules if m.startswith("vllm.")]:
        monkeypatch.setitem(sys.modules, name, None)
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
                     "sync": "torch.npu.synchronize", "timer": True, "probe_ms": None}
    worker.cpp_stage_times()  # start from an empty ring
    before = device.synchronize_calls
    worker.execute_model(SimpleNamespace())  # not marked: runs exactly as without CPP
    assert device.synchronize_calls == before
    worker.execute_model(SimpleNamespace(**{compat.TIME_STEP_ATTR: 7}))
    assert device.synchronize_calls == before + 2
    assert log.kinds()[-3:] == ["npu.synchronize", "execute_model", "npu.synchronize"]
    # Every worker keeps its own time of the marked step for the engine to fetch, once.
    times = worker.cpp_stage_times()["times"]
    assert [step for step, _ in times] == [7] and times[0][1] >= 0
    assert worker.cpp_stage_times()["times"] == []


def test_prepare_with_a_probe_times_one_run_of_that_size(npu: tuple) -> None:
    worker = fk.make_worker(CppWorkerExtension, fk.FakeNPUModelRunner, npu[1])
    reply = worker.cpp_prepare_worker(timing=False, probe_tokens=512)
    assert reply["probe_ms"] is not None and reply["probe_ms"] >= 0
    assert reply["timer"] is False


@pytest.mark.parametrize(("runner_cls", "how"), [
    (fk.FakeNPUModelRunnerV2, "V2 runner: max_num_reqs=1, attention built (skip_attn=False)"),
    (fk.FakeNPUModelRunnerV2_029,
     "V2 runner: max_num_reqs=1, attention built (skip_attn=False)"),
    (fk.FakeNPUModelRunner310, "NPU runner without profile_cpp: max_num_seqs=1, force_attention"),
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
    assert not any(r["is_profile"] for r in runs)  # in_profile_run on Ascend
    assert worker.model_runner.scheduler_config.max_num_seqs == 64
    assert getattr(worker.model_runner, "max_num_reqs", 64) == 64


def test_sweep_on_310p_runs_as_profile_cpp_would_without_is_profile(
        npu: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    # The 310P runner has no profile_cpp; is_profile would set in_profile_run (forced MoE
    # load balancing). One request, attention and eager execution come from its own
    # parameters instead, so each run is the one profile_cpp makes on the V1 runner.
    monkeypatch.setattr(compat, "cudagraph_mode_none", lambda: fk.CUDAGRAPH_NONE)
    worker = fk.make_worker(CppWorkerExtension, fk.FakeNPUModelRunner310, npu[1],
                            max_num_seqs=64)
    result = worker.cpp_profile_sweep([512, 128], 1)
    assert result["dummy_run"].endswith("force_attention, eager"), result
    v1 = fk.make_worker(CppWorkerExtension, fk.FakeNPUModelRunner, fk.EventLog(),
                        max_num_seqs=64)
    v1.cpp_profile_sweep([512, 128], 1)
    keys = ("num_tokens", "num_reqs", "attention", "eager", "in_profile_run")
    runs_310 = [{k: r[k] for k in keys} for r in worker.model_runner.dummy_runs]
    runs_v1 = [{k: r[k] for k in keys} for r in v1.model_runner.dummy_runs]
    assert runs_310 == runs_v1
    assert not any(r["in_profile_run"] for r in runs_310)
    assert all(r["eager"] and r["num_reqs"] == 1 for r in runs_310)


def test_cpu_runner_keeps_is_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    # Off the NPU, vLLM's own runner shape keeps is_profile (real dummy tokens, eager).
    monkeypatch.setattr(compat, "current_platform", lambda: SimpleNamespace(device_type="cpu"))
    runner = fk.FakeNPUModelRunner310(fk.FakeVllmConfig(), "cpu")
    how, run = compat.one_request_dummy_run(runner)
    run(64)
    assert how == "max_num_seqs=1, force_attention"
    assert runner.dummy_runs[0]["is_profile"] is True


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
    ({"profiling_chunk_config": {"enabled": True}},
     "vllm-ascend's profiling chunk (profiling_chunk_config.enabled = true)"),
    ({"scheduler_config": {"profiling_chunk_config": {"enabled": True}}},
     "vllm-ascend's profiling chunk (scheduler_config.profiling_chunk_config.enabled = true)"),
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


# Every vllm-ascend scheduler feature CPP refuses: (additional_config, the Ascend key the
# message must name, words of the reason). Each one is on in every release that has it.
SCHEDULER_FEATURES = [
    ({"scheduler_config": {"short_request_first_config": {"enabled": True}}},
     "additional_config.scheduler_config.short_request_first_config.enabled",
     "reorders the waiting queue"),
    ({"short_request_first_config": {"enabled": True}},
     "additional_config.short_request_first_config.enabled", "reorders the waiting queue"),
    ({"scheduler_config": {"batch_job_sched_config": {"enabled": True}}},
     "additional_config.scheduler_config.batch_job_sched_config.enabled",
     "installs its own scheduler class"),
    ({"batch_job_sched_config": {"enabled": True}},
     "additional_config.batch_job_sched_config.enabled", "installs its own scheduler class"),
    ({"scheduler_config": {"dyntra_lb_config": {"enabled": True}}},
     "additional_config.scheduler_config.dyntra_lb_config.enabled", "DyntraLB"),
    ({"scheduler_config": {"recompute_scheduler_enable": True}},
     "additional_config.scheduler_config.recompute_scheduler_enable", "recompute scheduler"),
    ({"recompute_scheduler_enable": True}, "additional_config.recompute_scheduler_enable",
     "recompute scheduler"),
    ({"SLO_limits_for_dynamic_batch": 50}, "additional_config.SLO_limits_for_dynamic_batch",
     "dynamic batch"),
]


@pytest.mark.parametrize(("additional", "key", "reason"), SCHEDULER_FEATURES,
                         ids=[c[1].rsplit(".", 2)[-2] + ("" if "scheduler_config." in c[1]
                                                         else "-top") for c in
                              SCHEDULER_FEATURES])
def test_ascend_scheduler_features_are_refused_by_their_key(
        monkeypatch: pytest.MonkeyPatch, additional: dict, key: str, reason: str) -> None:
    monkeypatch.delenv(compat.ASCEND_BALANCE_ENV, raising=False)
    with pytest.raises(ValueError) as err:
        validate_for_engine(parse_cpp_config({"enabled": True}), ascend_vllm_config(additional))
    text = str(err.value)
    assert text.startswith("[CPP] cpp_config cannot run with vllm-ascend's"), text
    assert key in text and reason in text, text
    assert "--scheduler-cls" not in text


@pytest.mark.parametrize("additional", [
    {"scheduler_config": {"short_request_first_config": {"enabled": False}}},
    {"short_request_first_config": {"threshold": 512}},
    {"scheduler_config": {"dyntra_lb_config": {"enabled": False}}},
    {"dyntra_lb_config": {"enabled": True}},  # never read at the top level
    {"SLO_limits_for_dynamic_batch": -1},
])
def test_ascend_scheduler_features_off_are_accepted(
        monkeypatch: pytest.MonkeyPatch, additional: dict) -> None:
    monkeypatch.delenv(compat.ASCEND_BALANCE_ENV, raising=False)
    validate_for_engine(parse_cpp_config({"enabled": True}), ascend_vllm_config(additional))


# scheduler_cls values vllm-ascend's platform sets (read from platform.py of 0.23.0-0.30.0rc2)
# and the key the message must point at instead of --scheduler-cls.
ASCEND_SET_CLASSES = [
    ("vllm_ascend.core.scheduler_dynamic_batch.SchedulerDynamicBatch",
     "SLO_limits_for_dynamic_batch"),
    ("vllm_ascend.core.scheduler_profiling_chunk.ProfilingChunkAsyncScheduler",
     "profiling_chunk_config.enabled"),
    ("vllm_ascend.core.recompute_scheduler.AsyncRecomputeScheduler",
     "recompute_scheduler_enable"),
    ("vllm_ascend.core.batch_job_aware_scheduler.BatchJobAwareScheduler",
     "batch_job_sched_config.enabled"),
    ("vllm_ascend.core.dyntra_lb_scheduler.AsyncDyntraLBScheduler", "dyntra_lb_config.enabled"),
    ("vllm_ascend.core.short_request_first_scheduler.ShortRequestFirstAsyncScheduler",
     "short_request_first_config.enabled"),
]


@pytest.mark.parametrize(("cls", "key"), ASCEND_SET_CLASSES,
                         ids=[c[0].rsplit(".", 1)[-1] for c in ASCEND_SET_CLASSES])
def test_scheduler_cls_set_by_vllm_ascend_names_its_feature(
        monkeypatch: pytest.MonkeyPatch, cls: str, key: str) -> None:
    # The platform set the class; the additional_config the check sees holds no key we know
    # (e.g. a release that reads it from a place not listed in compat).
    monkeypatch.delenv(compat.ASCEND_BALANCE_ENV, raising=False)
    with pytest.raises(ValueError) as err:
        validate_for_engine(parse_cpp_config({"enabled": True}), ascend_vllm_config({}, cls))
    text = str(err.value)
    assert "vllm-ascend set scheduler_cls" in text and key in text, text
    assert "--scheduler-cls" not in text


def test_operator_scheduler_cls_still_says_remove_the_flag(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(compat.ASCEND_BALANCE_ENV, raising=False)
    with pytest.raises(ValueError, match="remove --scheduler-cls"):
        validate_for_engine(parse_cpp_config({"enabled": True}),
                            ascend_vllm_config({}, "my_pkg.sched.MyScheduler"))


# The string "false": on for 0.23-0.26 (raw value / bool(...)), off for 0.27+ (pydantic).
@pytest.mark.parametrize(("version", "refused"), [
    ((0, 23, 0), True), ((0, 26, 0), True), ((0, 27, 1), False), ((0, 30, 0), False),
    (None, True),  # release unknown: refused if any release reads it as on
])
@pytest.mark.parametrize("additional", [
    {"enable_balance_scheduling": "false"},
    {"profiling_chunk_config": {"enabled": "false"}},
    {"short_request_first_config": {"enabled": "false"}},
])
def test_switches_are_read_as_the_installed_release_reads_them(
        monkeypatch: pytest.MonkeyPatch, version: tuple | None, refused: bool,
        additional: dict) -> None:
    monkeypatch.delenv(compat.ASCEND_BALANCE_ENV, raising=False)
    monkeypatch.setattr(compat, "ascend_version", lambda: version)
    config = ascend_vllm_config(additional)
    if not refused:
        validate_for_engine(parse_cpp_config({"enabled": True}), config)
        return
    with pytest.raises(ValueError) as err:
        validate_for_engine(parse_cpp_config({"enabled": True}), config)
    assert "'false' (a string: vllm-ascend 0.23-0.26 read any non-empty string as on" \
        in str(err.value)


@pytest.mark.parametrize(("version", "refused"), [
    ((0, 23, 0), True), ((0, 26, 0), True), ((0, 27, 1), False), (None, True)])
def test_balance_env_var_counts_only_where_the_release_reads_it(
        monkeypatch: pytest.MonkeyPatch, version: tuple | None, refused: bool) -> None:
    monkeypatch.setenv(compat.ASCEND_BALANCE_ENV, "1")
    monkeypatch.setattr(compat, "ascend_version", lambda: version)
    found = compat.ascend_balance_scheduling({}, os.environ, compat.ascend_version())
    assert (found is not None) is refused


@pytest.mark.parametrize(("version", "where"), [
    # 0.25+: a nested key hides the deprecated top-level one; 0.23/0.24 read only the top.
    ((0, 27, 1), None), ((0, 24, 0), "additional_config.short_request_first_config.enabled"),
])
def test_nested_key_wins_from_025(monkeypatch: pytest.MonkeyPatch, version: tuple,
                                  where: str | None) -> None:
    additional = {"scheduler_config": {"short_request_first_config": {"enabled": False}},
                  "short_request_first_config": {"enabled": True}}
    found = compat.ascend_scheduler_feature(additional, version)
    assert (found[0].split(" =")[0] if found else None) == where


# ----- PD prefill node on vllm-ascend 0.23.0: BalanceScheduler's own schedule() ---------------

OWN_COPY_FACTS = [  # (fact in ascend.balance_scheduler, the same fact of vLLM 0.23.0's schedule)
    ("own copy: token_budget_init", "scheduler.token_budget", "token_budget_init"),
    ("own copy: input_budget_init", "scheduler.token_budget", "input_budget_init"),
    ("own copy: cap running_loop", "scheduler.long_prefill", "running_loop"),
    ("own copy: cap waiting_loop", "scheduler.long_prefill", "waiting_loop"),
    ("own copy: cap hoisted", "scheduler.long_prefill", "hoisted"),
    ("own copy: queues", "scheduler.queues", "queues"),
    ("own copy: queue_pick", "scheduler.queues", "queue_pick"),
    ("own copy: waiting_admission_limits", "scheduler.queues", "waiting_admission_limits"),
    ("own copy: running_loop", "scheduler.queues", "running_loop"),
    ("own copy: waiting_loop", "scheduler.queues", "waiting_loop"),
]


def test_prefill_node_copy_of_schedule_reads_what_step_limits_sets() -> None:
    """Read from the sdist by AST: on a kv_producer node (vLLM 0.23.0) vllm-ascend 0.23's
    BalanceScheduler runs its own schedule(); the budget it starts from, where it reads the
    prefill cap, its queues and admission limit are exactly vLLM 0.23.0's, which is what
    compat.step_limits steers (self.max_num_scheduled_tokens and
    scheduler_config.long_prefill_token_threshold)."""
    import json

    ascend = json.loads((FACTS / "ascend_surfaces.json").read_text())["0.23.0"]
    vllm = json.loads((FACTS / "vllm_surfaces.json").read_text())["0.23.0"]
    bal = ascend["ascend.balance_scheduler"]
    assert "getattr(kv_transfer_config, 'kv_role', None) == 'kv_producer'" \
        in bal["own copy also when"]
    assert bal["delegates to vLLM when"] == \
        "not self._balance_enabled and (not self._disable_preemption)"
    for own, surface, key in OWN_COPY_FACTS:
        assert bal[own] == vllm[surface][key], own
    assert bal["own copy: token_budget_init"] == "self.max_num_scheduled_tokens"
    assert bal["own copy: cap running_loop"]["direct_reads"] >= 1
    assert bal["own copy: cap waiting_loop"]["alias_reads"] >= 1


@pytest.mark.parametrize("kv_role", ["kv_producer", None])
def test_step_limits_steer_the_prefill_node_copy_as_planned(kv_role: str | None) -> None:
    from tests.fakes import vllm_shapes as vs
    from vllm_ascend_cpp.config import CppConfig, EngineFacts
    from vllm_ascend_cpp.core import simulate
    from vllm_ascend_cpp.runtime import CppRuntime

    cls = fk._balance_scheduler_023()
    cfg = vs.SchedulerConfig023(max_num_batched_tokens=4096)
    running = [vs.Req("long", 12000, num_computed_tokens=6000)]
    waiting = [vs.Req("a", 5000), vs.Req("b", 700)]
    sched = cls(cfg, kv_role=kv_role, running=running, waiting=waiting)
    facts = EngineFacts(pp_size=2, tp_size=1, max_num_batched_tokens=4096, max_num_seqs=8,
                        block_size=128, max_model_len=32768)
    cands = CppRuntime(CppConfig(enabled=True, profile_cache_dir=None), facts).candidates(sched)
    for budget, cap in ((1800, 1000), (2500, 0), (3000, 640)):
        with compat.step_limits(sched, budget, cap):
            got = sched.schedule(False)
        assert got == {i.req_id: i.tokens for i in simulate(cands, budget, cap)}
        assert sum(got.values()) <= budget
        assert sched.max_num_scheduled_tokens == 4096
        assert cfg.long_prefill_token_threshold == 0
    assert sched.own_copy_steps == (3 if kv_role == "kv_producer" else 0)


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


def _release_facts() -> dict[str, dict]:
    import json

    return json.loads((FACTS / "ascend_surfaces.json").read_text())


RELEASES = sorted(_release_facts(), key=compat.parse_version)


def test_every_claimed_release_is_read() -> None:
    assert RELEASES[0] == "0.23.0" and len(RELEASES) >= 8
    assert {"0.24.0rc1", "0.25.1rc1", "0.26.0rc1"} <= set(RELEASES)


@pytest.mark.parametrize("release", RELEASES)
def test_compat_rules_match_what_each_release_does(release: str) -> None:
    """The release rules in compat.py (strict config, nested keys, env fallback, sweep call,
    scheduler classes) against the facts read from that release's sdist."""
    facts = _release_facts()[release]
    version = compat.parse_version(release)
    strict = facts["ascend.config"]["unknown keys"] == "refused (extra='forbid')"
    assert strict == (version[:2] >= compat.ASCEND_PYDANTIC_FROM)
    assert facts["ascend.config"]["switch values parsed"].startswith(
        "pydantic" if strict else "plain Python")
    if strict:  # the only way unknown keys pass: vLLM-Omni importable (the fake does the same)
        assert facts["ascend.config.init"]["unknown keys dropped when vllm_omni importable"]
    switches = facts["ascend.config.switches"]
    assert switches["reads additional_config.scheduler_config"] == \
        (version[:2] >= compat.ASCEND_NESTED_FROM)
    assert switches["balance env var fallback"] == (version[:2] < compat.ASCEND_PYDANTIC_FROM)
    known = {k for k, *_ in compat.ASCEND_SCHEDULER_FEATURES} | {
        "enable_balance_scheduling", compat.ASCEND_PROFILING_KEY}
    assert set(switches["switch keys"]) <= known
    for name in facts["ascend.platform.config"]["scheduler classes named in platform.py"]:
        assert compat.ascend_scheduler_cls_origin(name) is not None, name
    # The sweep: the V1 runner always has profile_cpp; the 310P runner never, but always has
    # what compat uses instead; a V2 override keeps the keywords compat passes.
    assert "profile_cpp" in facts["ascend.runner_v1"]["sig _dummy_run"]
    p310 = facts["ascend.runner_310p"]["sig _dummy_run"]
    assert "profile_cpp" not in p310
    assert {"force_attention", "cudagraph_runtime_mode"} <= set(p310)
    own_v2 = facts["ascend.runner_v2"]["sig own _dummy_run"]
    if own_v2 is not None:
        fake = fk.FakeNPUModelRunnerV2_029 if version[:2] >= (0, 29) \
            else fk.FakeNPUModelRunnerV2_027
        assert own_v2 == params_of(fake._dummy_run)[1:]
    # BalanceScheduler replaces vLLM's Scheduler in every release (so CppScheduler subclasses
    # it); only 0.23 runs its own schedule() on a kv_producer node, later ones only with
    # balance scheduling, which the plugin refuses.
    bal = facts["ascend.balance_scheduler"]
    assert bal["replaces vllm Scheduler"] is True
    producer = any("kv_producer" in c for c in bal["own copy also when"])
    assert producer == (version[:2] == (0, 23))
    if not producer:
        assert bal["delegates to vLLM when"] == "not self._balance_enabled"
    # Short-request-first reorders the queue from inside BalanceScheduler.__init__ (0.25+):
    # the plugin refuses the key wherever the release reads it.
    if facts["ascend.balance_scheduler"]["__init__ installs a short-request-first queue"]:
        on = {"scheduler_config": {"short_request_first_config": {"enabled": True}}}
        assert compat.ascend_scheduler_feature(on, version) is not None


def test_extension_names_do_not_clash_with_npu_worker() -> None:
    """vLLM's WorkerWrapperBase.init_worker asserts that no non-dunder attribute of the
    extension already exists on the worker class; NPUWorker's methods are from the sdist."""
    import json

    facts = json.loads((FACTS / "ascend_surfaces.json").read_text())["0.23.0"]
    ours = {a for a in dir(CppWorkerExtension) if not a.startswith("__")}
    assert ours and not ours & set(facts["ascend.worker"]["methods"])
    assert "profile_prefill_latency" in facts["ascend.worker"]["methods"]
