"""The vllm-ascend surfaces vllm_ascend_cpp relies on, probed with `ast` alone.

vllm-ascend cannot be installed here (its build and its torch-npu need CANN), so its source
distribution is read instead, exactly as tools/vllm_surfaces.py reads vLLM wheels. The facts
recorded here are what tests/fakes/ascend.py mirrors (signatures) and what compat.py's Ascend
rules rest on (config keys, env var, platform-set classes, the executor and scheduler that
vllm-ascend patches into vLLM). tests/unit/test_ascend_path.py compares the fakes' signatures
with the JSON this produces (tests/fakes/ascend_surfaces.json).
"""

from __future__ import annotations

import ast

from vllm_surfaces import (
    MODULE,
    CheckFn,
    FunctionNode,
    Probe,
    Surface,
    attributes,
    calls,
    check_long_prefill,
    check_queues,
    check_token_budget,
    class_shape,
    dotted,
    find_method,
    find_top_level,
    method_names,
    params,
    walk_scope,
)

PKG = "vllm_ascend/"
PLATFORM = "vllm_ascend/platform.py"
WORKER = "vllm_ascend/worker/worker.py"
RUNNER_V1 = "vllm_ascend/worker/model_runner_v1.py"
RUNNER_310P = "vllm_ascend/_310p/model_runner_310p.py"
RUNNER_V2 = "vllm_ascend/worker/v2/model_runner.py"
CONFIG = "vllm_ascend/ascend_config.py"
ENVS = "vllm_ascend/envs.py"
PATCH_PLATFORM = "vllm_ascend/patch/platform/__init__.py"
EXECUTOR = "vllm_ascend/patch/platform/patch_multiproc_executor.py"
BALANCE = "vllm_ascend/patch/platform/patch_balance_schedule.py"


def signatures(*methods: str) -> CheckFn:
    """Parameter lists of the methods the fakes copy (recorded as facts `sig <name>`)."""

    def check(p: Probe) -> None:
        for name in methods:
            fn = find_method(p.cls, name)
            p.fact(f"sig {name}", params(fn) if fn is not None else None, fn)
            p.expect(fn is not None, f"no method {name}")

    return check


def both(*checks: CheckFn) -> CheckFn:
    def check(p: Probe) -> None:
        for c in checks:
            c(p)

    return check


def super_calls(fn: FunctionNode | None, method: str) -> list[ast.Call]:
    """`super().method(...)` calls in fn (dotted() cannot name a chain that starts at a call)."""
    return [
        c for c in (walk_scope(fn) if fn else [])
        if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
        and c.func.attr == method and isinstance(c.func.value, ast.Call)
        and dotted(c.func.value.func) == "super"
    ]


def sub_check(p: Probe, check: CheckFn, prefix: str) -> None:
    """Run a vllm_surfaces check on the same class, keeping its facts under a prefix (two
    checks use the same fact names)."""
    sub = Probe(p.module, p.node)
    check(sub)
    for key, value in sub.facts.items():
        p.facts[f"{prefix}{key}"] = value
    p.evidence += [e for e in sub.evidence if e not in p.evidence]
    p.problems += sub.problems


def check_npu_dummy_run(p: Probe) -> None:
    """compat uses profile_cpp=True (one request of num_tokens) with force_attention=True."""
    fn = p.method("_dummy_run")
    names = p.signature("sig _dummy_run", fn, "num_tokens", "force_attention")
    if fn is None:
        return
    p.fact("profile_cpp", "profile_cpp" in names)
    reqs = [s for s in walk_scope(fn) if isinstance(s, ast.Assign)
            and any(dotted(t) == "num_reqs" for t in s.targets)]
    p.fact("num_reqs", [ast.unparse(s.value) for s in reqs], *reqs)
    limit = [n for n in walk_scope(fn) if dotted(n) == "self.scheduler_config.max_num_seqs"]
    p.fact("reads_scheduler_config_max_num_seqs", bool(limit), *limit[:1])
    attn = calls(fn, "self._should_build_dummy_attn_metadata")
    p.fact("attention_metadata_if", [ast.unparse(c) for c in attn], *attn[:1])
    forwards = super_calls(fn, "_dummy_run")
    p.fact("forwards_to_super", bool(forwards), *forwards[:1])


def check_profile_prefill_latency(p: Probe) -> None:
    """vllm-ascend's own sweep step: compat calls _dummy_run the same way and syncs the same
    device API around it."""
    fn = p.method("profile_prefill_latency")
    p.signature("sig profile_prefill_latency", fn, "num_tokens")
    if fn is None:
        return
    syncs = [c for c in walk_scope(fn) if isinstance(c, ast.Call)
             and (dotted(c.func) or "").endswith(".synchronize")]
    p.fact("synchronize_calls", sorted({dotted(c.func) or "" for c in syncs}), *syncs)
    runs = calls(fn, "self.model_runner._dummy_run")
    p.fact("dummy_run_keywords",
           sorted({k.arg or "**" for c in runs for k in c.keywords}), *runs)


def check_worker_runners(p: Probe) -> None:
    """Which runner classes the worker builds (compat must handle each one's _dummy_run), and
    its method names (vLLM refuses an extension whose names the worker already has)."""
    p.fact("methods", method_names(p.cls))
    built = sorted({
        dotted(s.value.func) or ""
        for m in p.cls.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)
        for s in walk_scope(m)
        if isinstance(s, ast.Assign) and isinstance(s.value, ast.Call)
        and any(dotted(t) == "self.model_runner" for t in s.targets)
    })
    p.fact("model_runner_classes", built)
    calls_init_ascend_config(p, find_method(p.cls, "__init__"), "__init__ calls init_ascend_config")


def _string_assignments(fn: FunctionNode | None, suffix: str) -> list[ast.Assign]:
    return [
        s for s in (walk_scope(fn) if fn else [])
        if isinstance(s, ast.Assign)
        and any((dotted(t) or "").endswith(suffix) for t in s.targets)
    ]


def check_platform_config(p: Probe) -> None:
    """check_and_update_config runs before our hooks: the scheduler and worker classes it sets,
    and whether it touches worker_extension_cls (our worker methods ride on it)."""
    fn = p.method("check_and_update_config")
    if fn is None:
        return
    for field in ("scheduler_cls", "worker_cls"):
        stmts = _string_assignments(fn, "." + field)
        values = sorted({ast.unparse(s.value) for s in stmts})
        p.fact(f"sets {field}", values, *stmts)
    ext = [n for n in walk_scope(fn) if (dotted(n) or "").endswith("worker_extension_cls")]
    p.fact("touches worker_extension_cls", bool(ext), *ext[:1])
    calls_init_ascend_config(p, fn, "calls init_ascend_config")
    p.fact("scheduler classes named in platform.py", scheduler_class_names(p.module.tree))
    p.expect(not ext, "check_and_update_config sets worker_extension_cls")


def check_additional_config_keys(p: Probe) -> None:
    """Where the switches compat refuses are read (top-level key, nested key, env var)."""
    strict_config(p)
    fn = find_method(p.cls, "__init__")
    if fn is None:
        return
    gets = [c for c in calls(fn, "additional_config.get")
            if c.args and isinstance(c.args[0], ast.Constant)]
    wanted = ("profiling_chunk_config", "scheduler_config", "enable_balance_scheduling")
    found = [c for c in gets if c.args[0].value in wanted]
    p.fact("additional_config keys read", sorted({c.args[0].value for c in found}), *found)
    pairs = []
    for c in calls(fn, "self._get_config_value"):
        consts = [a.value for a in c.args if isinstance(a, ast.Constant)]
        if len(consts) >= 2 and consts[0] == "enable_balance_scheduling":
            pairs.append(consts[:2])
            p.cite(c)
    p.fact("balance: key, env fallback", pairs)
    getter = find_method(p.cls, "_get_config_value")
    order = None
    if getter is not None:
        first_if = next((st for st in getter.body if isinstance(st, ast.If)), None)
        order = ast.unparse(first_if.test) if first_if is not None else None
        p.cite(first_if)
    p.fact("a present key wins over the env var", order == "config_key in additional_config")


def strict_config(p: Probe) -> None:
    """Whether AscendConfig refuses unknown keys (pydantic `extra="forbid"`, 0.27+), which
    is why the front-end hook takes cpp_config out of additional_config."""
    forbid = [st for st in p.cls.body if isinstance(st, ast.Assign)
              and any(dotted(t) == "model_config" for t in st.targets)
              and "extra='forbid'" in ast.unparse(st.value)]
    p.fact("unknown keys", "refused (extra='forbid')" if forbid else "ignored", *forbid[:1])
    p.fact("switch values parsed", "pydantic (lax bool)" if forbid
           else "plain Python (raw value, bool(...))")


def check_init_ascend_config(p: Probe) -> None:
    """init_ascend_config: the vLLM-Omni exemption and the keys it resolves itself."""
    fn = p.node
    assert fn is not None and not isinstance(fn, ast.ClassDef)
    omni = [c for c in walk_scope(fn) if isinstance(c, ast.Call)
            and (dotted(c.func) or "").endswith("find_spec")
            and any(isinstance(a, ast.Constant) and a.value == "vllm_omni" for a in c.args)]
    p.fact("unknown keys dropped when vllm_omni importable", bool(omni), *omni[:1])
    stripped: list[str] = []
    for st in walk_scope(fn):
        if isinstance(st, ast.Assign) and any(dotted(t) == "_NON_USER_INPUT_KEYS"
                                              for t in st.targets):
            if isinstance(st.value, ast.Set):
                stripped = sorted(e.value for e in st.value.elts
                                  if isinstance(e, ast.Constant))
            p.cite(st)
    p.fact("scheduler keys it resolves itself", [k for k in stripped if k in SCHEDULER_KEYS])


SCHEDULER_KEYS = ("enable_balance_scheduling", "recompute_scheduler_enable",
                  "short_request_first_config", "profiling_chunk_config",
                  "batch_job_sched_config", "dyntra_lb_config", "SLO_limits_for_dynamic_batch")


def check_config_switches(p: Probe) -> None:
    """Which scheduler switches the release reads, whether a nested `scheduler_config`
    section exists, and whether the balance env var is still a fallback."""
    assert not isinstance(p.node, ast.ClassDef)
    consts = {n.value for n in ast.walk(p.module.tree)
              if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    p.fact("switch keys", sorted(k for k in SCHEDULER_KEYS if k in consts))
    nested = [c for c in ast.walk(p.module.tree) if isinstance(c, ast.Call)
              and (dotted(c.func) or "").endswith("additional_config.get") and c.args
              and isinstance(c.args[0], ast.Constant) and c.args[0].value == "scheduler_config"]
    p.fact("reads additional_config.scheduler_config", bool(nested), *nested[:1])
    env = [n for n in ast.walk(p.module.tree) if isinstance(n, ast.Constant)
           and n.value == "VLLM_ASCEND_BALANCE_SCHEDULING"]
    p.fact("balance env var fallback", bool(env), *env[:1])


def scheduler_class_names(tree: ast.Module) -> list[str]:
    return sorted({n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
                   and isinstance(n.value, str) and n.value.startswith("vllm_ascend.core.")
                   and "Scheduler" in n.value.rsplit(".", 1)[-1]})


def calls_init_ascend_config(p: Probe, fn: FunctionNode | None, key: str) -> None:
    found = calls(fn, "init_ascend_config") if fn is not None else []
    p.fact(key, bool(found), *found[:1])


def own_dummy_run(p: Probe) -> None:
    """The V2 NPU runner's own _dummy_run where it has one (0.27+), else null."""
    fn = find_method(p.cls, "_dummy_run")
    p.fact("sig own _dummy_run", params(fn) if fn is not None else None, fn)


def check_envs(p: Probe) -> None:
    assert not isinstance(p.node, ast.ClassDef)
    keys = []
    for node in ast.walk(p.module.tree):
        if isinstance(node, ast.Dict):
            keys += [k.value for k in node.keys if isinstance(k, ast.Constant)
                     and isinstance(k.value, str) and k.value.startswith("VLLM_ASCEND_BALANCE")]
    p.fact("balance env vars", sorted(set(keys)))


def check_executor(p: Probe) -> None:
    """Our Executor.__init__ wrapper runs if nothing between the class and vLLM's Executor
    defines __init__ without calling up; the workers must come from vLLM's WorkerProc (which
    builds WorkerWrapperBase, which applies worker_extension_cls)."""
    class_shape("__init__", "_init_executor")(p)
    targets = [k.value for c in ast.walk(p.module.tree) if isinstance(c, ast.Call)
               for k in c.keywords if k.arg == "target"]
    p.fact("worker process target", sorted({ast.unparse(t) for t in targets}), *targets[:1])
    replaced = [
        st for st in p.module.tree.body if isinstance(st, ast.Assign)
        and any((dotted(t) or "").startswith("vllm.") for t in st.targets)
    ]
    p.fact("replaces", sorted(dotted(t) or "" for st in replaced for t in st.targets),
           *replaced)


def check_patch_platform(p: Probe) -> None:
    """Which of vllm-ascend's global patches are imported, and under which condition."""
    assert not isinstance(p.node, ast.ClassDef)
    gated: dict[str, str] = {}
    plain: list[str] = []
    wanted = ("patch_multiproc_executor", "patch_balance_schedule")

    def visit(body: list[ast.stmt], cond: str | None) -> None:
        for stmt in body:
            if isinstance(stmt, ast.If):
                test = ast.unparse(stmt.test)
                visit(stmt.body, test if cond is None else f"{cond} and {test}")
                visit(stmt.orelse, f"not ({test})")
            elif isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    name = alias.name.rsplit(".", 1)[-1]
                    if cond is None:
                        plain.append(name)
                    else:
                        gated[name] = cond
                    if name in wanted:
                        p.cite(stmt)

    visit(p.module.tree.body, None)
    p.fact("unconditional", sorted(n for n in plain if n in wanted))
    p.fact("conditional", {n: c for n, c in gated.items() if n in wanted})


def check_balance_scheduler(p: Probe) -> None:
    """vllm-ascend replaces vLLM's Scheduler with this subclass in every process; our
    CppScheduler then subclasses it. Where it runs its own copy of schedule() (balance on, or a
    PD prefill node on vLLM 0.23), that copy must still read the budget and cap compat sets."""
    class_shape("schedule")(p)
    fn = p.method("schedule")
    p.signature("sig schedule", fn)
    delegate = super_calls(fn, "schedule")
    guard = next((st for st in (fn.body if fn else []) if isinstance(st, ast.If)), None)
    p.fact("delegates to vLLM when", ast.unparse(guard.test) if guard else None, guard)
    p.fact("delegates", bool(delegate), *delegate[:1])
    sub_check(p, check_token_budget, "own copy: ")
    sub_check(p, check_long_prefill, "own copy: cap ")
    sub_check(p, check_queues, "own copy: ")
    # 0.23 assigns `vllm.v1.core.sched.scheduler.Scheduler`; later releases import that
    # module under an alias (`import vllm.v1.core.sched.scheduler as _sched_mod`).
    names = {"vllm.v1.core.sched.scheduler"} | {
        a.asname for st in p.module.tree.body if isinstance(st, ast.Import)
        for a in st.names if a.name == "vllm.v1.core.sched.scheduler" and a.asname}
    replaced = [
        st for st in p.module.tree.body if isinstance(st, ast.Assign)
        and any(dotted(t) in {f"{n}.Scheduler" for n in names} for t in st.targets)
    ]
    p.fact("replaces vllm Scheduler", bool(replaced), *replaced[:1])
    preempt = find_top_level(p.module.tree, "_disable_preemption_on_prefill_node")
    rets = [st for st in walk_scope(preempt) if isinstance(st, ast.Return)] if preempt else []
    p.fact("own copy also when", [ast.unparse(r.value) for r in rets if r.value], *rets)
    init = find_method(p.cls, "__init__")
    calls_init_ascend_config(p, init, "__init__ calls init_ascend_config")
    srf = calls(init, "install_short_request_first_waiting_queue") if init else []
    p.fact("__init__ installs a short-request-first queue", bool(srf), *srf[:1])


# fmt: off
ASCEND_SURFACES: list[Surface] = [
    Surface("ascend.platform", "NPUPlatform device_type / device_name", (PLATFORM,),
            ("NPUPlatform",), attributes("device_type", "device_name", "dispatch_key"), PKG),
    Surface("ascend.platform.config", "NPUPlatform.check_and_update_config: classes it sets",
            (PLATFORM,), ("NPUPlatform",), check_platform_config, PKG),
    Surface("ascend.worker", "NPUWorker: base, methods, runners it builds", (WORKER,),
            ("NPUWorker",),
            both(class_shape("execute_model", "sample_tokens"),
                 signatures("__init__", "execute_model", "sample_tokens",
                            "execute_dummy_batch"),
                 check_worker_runners), PKG),
    Surface("ascend.worker.profile", "NPUWorker.profile_prefill_latency (its own sweep step)",
            (WORKER,), ("NPUWorker",), check_profile_prefill_latency, PKG),
    Surface("ascend.runner_v1", "NPUModelRunner._dummy_run (V1, profile_cpp)", (RUNNER_V1,),
            ("NPUModelRunner",),
            both(check_npu_dummy_run,
                 signatures("__init__", "execute_model", "sample_tokens")), PKG),
    Surface("ascend.runner_310p", "NPUModelRunner310._dummy_run (310P)", (RUNNER_310P,),
            ("NPUModelRunner310",), check_npu_dummy_run, None),
    Surface("ascend.runner_v2", "NPUModelRunner (V2): inherits vLLM's V2 _dummy_run",
            (RUNNER_V2,), ("NPUModelRunner",),
            both(class_shape("_dummy_run", "execute_model"), signatures("__init__"),
                 own_dummy_run), None),
    Surface("ascend.config", "AscendConfig: strictness, profiling_chunk_config, balance switch",
            (CONFIG,), ("AscendConfig",), check_additional_config_keys, PKG),
    Surface("ascend.config.init", "init_ascend_config: unknown keys, vLLM-Omni exemption",
            (CONFIG,), ("init_ascend_config",), check_init_ascend_config, None),
    Surface("ascend.config.switches", "ascend_config.py: scheduler switches and where",
            (CONFIG,), (MODULE,), check_config_switches, None),
    Surface("ascend.envs", "envs.py: balance scheduling env var", (ENVS,), (MODULE,),
            check_envs, None),
    Surface("ascend.patch_platform", "patch/platform: which global patches load, when",
            (PATCH_PLATFORM,), (MODULE,), check_patch_platform, None),
    Surface("ascend.executor", "AscendMultiprocExecutor (executor hook point)", (EXECUTOR,),
            ("AscendMultiprocExecutor",), check_executor, PKG),
    Surface("ascend.balance_scheduler", "BalanceScheduler (replaces vLLM's Scheduler)",
            (BALANCE,), ("BalanceScheduler",), check_balance_scheduler, PKG),
]
# fmt: on
