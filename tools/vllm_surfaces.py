"""The vLLM surfaces vllm_ascend_cpp relies on, probed with `ast` alone.

vLLM is never imported here: a wheel of another version (or another platform's build) cannot
be imported beside the installed one, and importing it would pull torch in. Every probe reads
the source text of one module and records *facts* (compared across versions) and *evidence*
(the exact source lines, shown to the reader but not compared, because line numbers move in
every release).

Adding a surface is one `Surface(...)` entry in `SURFACES`; most entries use one of the small
check factories (`signature`, `fields`, `class_shape`) and a few carry their own function
because the fact they look for is about what a method body does, not what it declares.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

# --------------------------------------------------------------------------------------------
# Source access


class SourceTree(Protocol):
    """Read-only view of a vLLM source tree (a wheel, a directory or an in-memory dict)."""

    def read(self, path: str) -> str | None: ...

    def paths(self) -> Iterable[str]: ...


@dataclass
class Module:
    path: str
    source: str
    tree: ast.Module
    lines: list[str]

    def where(self, node: ast.AST) -> str:
        """`path:line: source`, with a multi-line statement joined onto one line (a hoisted
        `x = (` alone says nothing) and a compound statement cut after its header."""
        lineno = getattr(node, "lineno", 0)
        if not 0 < lineno <= len(self.lines):
            return f"{self.path}:{lineno}"
        if isinstance(node, ast.While | ast.If):
            end = node.test.end_lineno or lineno
        elif isinstance(node, ast.For | ast.AsyncFor):
            end = node.iter.end_lineno or lineno
        elif isinstance(node, ast.stmt) and not hasattr(node, "body"):
            end = node.end_lineno or lineno
        else:
            end = lineno
        text = " ".join(line.strip() for line in self.lines[lineno - 1 : end])
        text = re.sub(r"([(\[{]) ", r"\1", text).replace(" )", ")").replace(",)", ")")
        if len(text) > 240:
            text = text[:237] + "..."
        return f"{self.path}:{lineno}: {text}"


class ModuleCache:
    """Parses each module at most once: several surfaces share a file (scheduler.py has six)."""

    def __init__(self, tree: SourceTree) -> None:
        self.tree = tree
        self._modules: dict[str, Module | None] = {}
        self.parse_errors: dict[str, str] = {}

    def get(self, path: str) -> Module | None:
        if path not in self._modules:
            self._modules[path] = self._parse(path)
        return self._modules[path]

    def _parse(self, path: str) -> Module | None:
        source = self.tree.read(path)
        if source is None:
            return None
        try:
            parsed = ast.parse(source, filename=path)
        except SyntaxError as exc:
            # A future vLLM may use syntax newer than this interpreter; say so instead of
            # reporting the surface as absent.
            self.parse_errors[path] = f"{exc.msg} (line {exc.lineno})"
            return None
        return Module(path, source, parsed, source.splitlines())


# --------------------------------------------------------------------------------------------
# AST helpers (pure functions, unit-tested on inline sources)

_NESTED_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def dotted(node: ast.AST) -> str | None:
    """`self.scheduler_config.x` for an Attribute/Name chain, None for anything else."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def walk_scope(node: ast.AST) -> Iterator[ast.AST]:
    """Like ast.walk, but stays out of nested defs: a helper closure inside schedule() is not
    part of the scheduling loop even though it sits in the same function."""
    stack = list(reversed(list(ast.iter_child_nodes(node))))
    while stack:
        child = stack.pop()
        if isinstance(child, _NESTED_SCOPES):
            continue
        yield child
        # Reversed so the pop order is source order: "the first assignment" means the first
        # one in the file.
        stack.extend(reversed(list(ast.iter_child_nodes(child))))


def find_top_level(tree: ast.Module, name: str) -> ast.ClassDef | FunctionNode | None:
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            if stmt.name == name:
                return stmt
    return None


def _is_overload(fn: FunctionNode) -> bool:
    return any((dotted(d) or "").endswith("overload") for d in fn.decorator_list)


def find_method(cls: ast.ClassDef, name: str) -> FunctionNode | None:
    """The definition Python would bind: the last one, skipping typing.overload stubs."""
    defs = [
        s
        for s in cls.body
        if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and s.name == name
    ]
    real = [d for d in defs if not _is_overload(d)]
    if real:
        return real[-1]
    return defs[-1] if defs else None


def method_names(cls: ast.ClassDef) -> list[str]:
    return sorted(
        {s.name for s in cls.body if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)}
    )


def params(fn: FunctionNode) -> list[str]:
    """Parameter names in call order, `*` marking where keyword-only ones start, without the
    leading self/cls: that is what decides whether a positional call still lands."""
    a = fn.args
    out = [p.arg for p in a.posonlyargs + a.args]
    is_static = any(dotted(d) == "staticmethod" for d in fn.decorator_list)
    if out and not is_static and out[0] in ("self", "cls"):
        out = out[1:]
    if a.vararg:
        out.append("*" + a.vararg.arg)
    elif a.kwonlyargs:
        out.append("*")
    out.extend(p.arg for p in a.kwonlyargs)
    if a.kwarg:
        out.append("**" + a.kwarg.arg)
    return out


def signature_text(fn: FunctionNode) -> str:
    ret = f" -> {ast.unparse(fn.returns)}" if fn.returns is not None else ""
    return f"def {fn.name}({ast.unparse(fn.args)}){ret}"


def reads(scope: ast.AST, chain: str) -> list[ast.AST]:
    """Loads of exactly `chain` (e.g. `self.max_num_scheduled_tokens`) inside scope."""
    return [
        n
        for n in walk_scope(scope)
        if isinstance(n, ast.Attribute | ast.Name)
        and isinstance(n.ctx, ast.Load)
        and dotted(n) == chain
    ]


def _targets(stmt: ast.stmt) -> list[ast.expr]:
    if isinstance(stmt, ast.Assign):
        return list(stmt.targets)
    if isinstance(stmt, ast.AnnAssign | ast.AugAssign):
        return [stmt.target]
    return []


def assignments(scope: ast.AST, chain: str) -> list[ast.Assign | ast.AnnAssign | ast.AugAssign]:
    """Statements inside scope that assign `chain` (a local name or `self.attr`)."""
    found = []
    for n in walk_scope(scope):
        if isinstance(n, ast.Assign | ast.AnnAssign | ast.AugAssign):
            if any(dotted(t) == chain for t in _targets(n)):
                found.append(n)
    return found


def calls(scope: ast.AST, name: str) -> list[ast.Call]:
    """Calls whose callee is `name` exactly, or ends in `.name` when name has no dot."""
    out = []
    for n in walk_scope(scope):
        if isinstance(n, ast.Call):
            callee = dotted(n.func) or ""
            if callee == name or ("." not in name and callee.endswith("." + name)):
                out.append(n)
    return out


def self_attrs(scope: ast.AST, *, include_calls: bool = False) -> set[str]:
    """Names X of every `self.X` touched in scope; without include_calls, `self.X(...)` method
    calls are left out, so what remains is state (queues, limits), not helpers."""
    called = set()
    if not include_calls:
        called = {id(n.func) for n in walk_scope(scope) if isinstance(n, ast.Call)}
    return {
        n.attr
        for n in walk_scope(scope)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and n.value.id == "self"
        and id(n) not in called
    }


def outer_loops(scope: ast.AST) -> list[ast.While | ast.For | ast.AsyncFor]:
    """Loops not nested in another loop of the same scope, in source order."""
    found: list[ast.While | ast.For | ast.AsyncFor] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _NESTED_SCOPES):
                continue
            if isinstance(child, ast.While | ast.For | ast.AsyncFor):
                found.append(child)
            else:
                visit(child)

    visit(scope)
    return sorted(found, key=lambda n: n.lineno)


def class_fields(cls: ast.ClassDef) -> dict[str, str]:
    """Annotated class-level fields as `annotation[ = default]` (dataclass / pydantic style)."""
    out: dict[str, str] = {}
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            text = ast.unparse(stmt.annotation)
            if stmt.value is not None:
                text += " = " + ast.unparse(stmt.value)
            out[stmt.target.id] = text
    return out


def decorator_names(node: ast.ClassDef | FunctionNode) -> list[str]:
    names = []
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        names.append(dotted(target) or ast.unparse(target))
    return names


def _decorator_flag(cls: ast.ClassDef, decorator_suffix: str, keyword: str) -> bool:
    for d in cls.decorator_list:
        if isinstance(d, ast.Call) and (dotted(d.func) or "").endswith(decorator_suffix):
            for kw in d.keywords:
                if kw.arg == keyword and isinstance(kw.value, ast.Constant):
                    return bool(kw.value.value)
    return False


def is_dataclass(cls: ast.ClassDef) -> bool:
    return any(name.endswith("dataclass") for name in decorator_names(cls))


def uses_slots(cls: ast.ClassDef) -> bool:
    """True when instances have no __dict__, so setattr of a new attribute raises."""
    if _decorator_flag(cls, "dataclass", "slots"):
        return True
    return any(dotted(t) == "__slots__" for s in cls.body for t in _targets(s))


def is_frozen(cls: ast.ClassDef) -> bool:
    return _decorator_flag(cls, "dataclass", "frozen")


def imported_from(tree: ast.Module, name: str) -> str | None:
    """Module that a `from X import name [as name]` anywhere in the file brings `name` from
    (CPUWorker imports the V2 runner inside a method)."""
    for stmt in ast.walk(tree):
        if isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if (alias.asname or alias.name) == name:
                    return "." * stmt.level + (stmt.module or "")
    return None


def module_constants(tree: ast.Module) -> dict[str, Any]:
    """Top-level `NAME = <literal>` assignments, for resolving names like DEFAULT_PLUGINS_GROUP."""
    out: dict[str, Any] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant):
            for t in stmt.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = stmt.value.value
    return out


# --------------------------------------------------------------------------------------------
# Probe: what a check function records


@dataclass
class Probe:
    module: Module
    node: ast.ClassDef | FunctionNode | None
    facts: dict[str, Any] = field(default_factory=dict)
    evidence: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def cls(self) -> ast.ClassDef:
        assert isinstance(self.node, ast.ClassDef), "surface symbol is not a class"
        return self.node

    def fact(self, key: str, value: Any, *nodes: ast.AST | None) -> None:
        self.facts[key] = value
        self.cite(*nodes)

    def cite(self, *nodes: ast.AST | None) -> None:
        """Keep the source lines a fact came from, for the reader (never compared)."""
        for n in nodes:
            if n is not None:
                line = self.module.where(n)
                if line not in self.evidence:
                    self.evidence.append(line)

    def expect(self, condition: bool, message: str) -> bool:
        if not condition:
            self.problems.append(message)
        return condition

    def method(self, name: str) -> FunctionNode | None:
        fn = find_method(self.cls, name)
        self.expect(fn is not None, f"no method {name}")
        return fn

    def signature(self, key: str, fn: FunctionNode | None, *expected: str) -> list[str]:
        if fn is None:
            self.fact(key, None)
            return []
        names = params(fn)
        self.facts[key] = names
        self.evidence.append(f"{self.module.path}:{fn.lineno}: {signature_text(fn)}")
        bare = {n.lstrip("*") for n in names}
        for name in expected:
            self.expect(name in bare, f"{fn.name}() has no parameter {name}")
        return names


CheckFn = Callable[[Probe], None]

# A Surface symbol meaning "the module itself" (module-level statements, no class or def).
MODULE = "<module>"


@dataclass(frozen=True)
class Surface:
    key: str
    title: str
    paths: tuple[str, ...]
    symbols: tuple[str, ...]
    check: CheckFn
    # Where to scan when no candidate path has the symbol. None where the name is ambiguous
    # (two CPUModelRunner classes exist side by side), so a scan would find the wrong one.
    fallback_under: str | None = "vllm/"


# --------------------------------------------------------------------------------------------
# Check factories: the common shapes


def signature(method: str, *expected: str) -> CheckFn:
    def check(p: Probe) -> None:
        p.signature("params", p.method(method), *expected)

    return check


def fields(
    *required: str, optional: tuple[str, ...] = (), dataclass_required: bool = True
) -> CheckFn:
    """Required fields must exist; optional ones come and go between releases, so they are
    reported (None when absent) without counting as a problem."""

    def check(p: Probe) -> None:
        declared = class_fields(p.cls)
        stmts = {dotted(s.target): s for s in p.cls.body if isinstance(s, ast.AnnAssign)}
        p.fact("decorators", decorator_names(p.cls), p.cls)
        if dataclass_required:
            p.expect(is_dataclass(p.cls), "not a dataclass")
        for name in required + optional:
            p.fact(name, declared.get(name), stmts.get(name))
        for name in required:
            p.expect(name in declared, f"no field {name}")

    return check


def class_shape(*overrides: str) -> CheckFn:
    """Bases (with the module each is imported from) and which of `overrides` the class
    defines itself rather than inheriting."""

    def check(p: Probe) -> None:
        bases = [ast.unparse(b) for b in p.cls.bases]
        p.fact("bases", bases, p.cls)
        p.fact(
            "base_modules",
            {b: imported_from(p.module.tree, b.split(".")[0]) for b in bases},
        )
        for name in overrides:
            fn = find_method(p.cls, name)
            p.fact(f"overrides {name}", fn is not None, fn)

    return check


def _init_assignments(cls: ast.ClassDef) -> dict[str, ast.stmt]:
    """`self.X = ...` statements in __init__ (first one per name)."""
    init = find_method(cls, "__init__")
    found: dict[str, ast.stmt] = {}
    for n in walk_scope(init) if init else []:
        if isinstance(n, ast.Assign | ast.AnnAssign | ast.AugAssign):
            for t in _targets(n):
                name = dotted(t) or ""
                if name.startswith("self.") and name.count(".") == 1:
                    found.setdefault(name[5:], n)
    return found


def attributes(*required: str, optional: tuple[str, ...] = ()) -> CheckFn:
    """Names compat reads by attribute: where each comes from (`init: <value>` when __init__
    assigns it, `property`, `method`, `field: <annotation>`), None when absent. Required ones
    must exist; optional ones are release-specific and handled with getattr defaults."""

    def check(p: Probe) -> None:
        inits = _init_assignments(p.cls)
        declared = class_fields(p.cls)
        for name in required + optional:
            fn = find_method(p.cls, name)
            if fn is not None:
                kind = "property" if "property" in decorator_names(fn) else "method"
                p.fact(name, kind, fn)
            elif name in inits:
                stmt = inits[name]
                value = getattr(stmt, "value", None)
                p.fact(name, "init: " + (ast.unparse(value) if value is not None else "?"),
                       stmt)
            elif name in declared:
                p.fact(name, "field: " + declared[name])
            else:
                p.fact(name, None)
        for name in required:
            p.expect(p.facts.get(name) is not None, f"no attribute {name}")

    return check


# --------------------------------------------------------------------------------------------
# Scheduler internals: what schedule() does with the budget the plugin sets

LONG_PREFILL = "self.scheduler_config.long_prefill_token_threshold"


def _scheduling_loops(fn: FunctionNode) -> tuple[ast.AST | None, ast.AST | None]:
    """(running loop, waiting loop) of Scheduler.schedule().

    The running loop is the outer `while` whose test reads self.running. The waiting loop is
    the next outer loop touching a `*waiting*` queue; its test changed from
    `(self.waiting or self.skipped_waiting) and token_budget > 0` to `token_budget > 0`, so
    the test alone cannot identify it.
    """
    loops = [lp for lp in outer_loops(fn) if isinstance(lp, ast.While)]
    running = next((lp for lp in loops if reads(lp.test, "self.running")), None)
    waiting = next(
        (
            lp
            for lp in loops
            if lp is not running
            and (running is None or lp.lineno > running.lineno)
            and any("waiting" in a for a in self_attrs(lp))
        ),
        None,
    )
    return running, waiting


def check_max_num_scheduled_tokens(p: Probe) -> None:
    fn = p.method("__init__")
    found = assignments(fn, "self.max_num_scheduled_tokens") if fn else []
    p.fact("assigned_in_init", bool(found), *found)
    p.fact("value", ast.unparse(found[0].value) if found and found[0].value else None)
    p.expect(bool(found), "__init__ does not assign self.max_num_scheduled_tokens")


def _first_plain_assignment(scope: ast.AST, name: str) -> ast.Assign | ast.AnnAssign | None:
    """The initialisation of a local: its first `=` in source order (not a later `-=`)."""
    for stmt in assignments(scope, name):
        if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
            return stmt
    return None


def check_token_budget(p: Probe) -> None:
    fn = p.method("schedule")
    if fn is None:
        return
    first = _first_plain_assignment(fn, "token_budget")
    init_text = ast.unparse(first.value) if first is not None and first.value else None
    p.fact("token_budget_init", init_text, first)
    p.expect(
        init_text == "self.max_num_scheduled_tokens",
        "token_budget is not initialised from self.max_num_scheduled_tokens",
    )
    # A second, independent cap (0.30+) means lowering token_budget alone still bounds the
    # step, but raising it above max_num_batched_tokens does not.
    inputs = _first_plain_assignment(fn, "input_budget")
    p.fact(
        "input_budget_init",
        ast.unparse(inputs.value) if inputs is not None and inputs.value else None,
        inputs,
    )


def _threshold_aliases(fn: FunctionNode) -> tuple[list[str], list[ast.Assign]]:
    """Locals that hold the long-prefill threshold.

    A name counts when every assignment to it derives from the threshold or from itself:
    `threshold = self.scheduler_config.long_prefill_token_threshold` (up to 0.30) and the
    hoisted `long_prefill_token_threshold = (... if num_eligible_reqs > 1 else 0)` followed by
    `= max(long_prefill_token_threshold, ...)` (0.32) do; the clamp
    `num_new_tokens = self.scheduler_config.long_prefill_token_threshold` does not, because
    num_new_tokens is assigned from other things too.
    """
    by_name: dict[str, list[ast.Assign]] = {}
    for n in walk_scope(fn):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            by_name.setdefault(n.targets[0].id, []).append(n)
    names: list[str] = []
    stmts: list[ast.Assign] = []
    for name, assigns in by_name.items():
        sourced = [reads(ast.Expression(body=a.value), LONG_PREFILL) for a in assigns]
        if not any(sourced):
            continue
        if all(
            src or reads(ast.Expression(body=a.value), name) for a, src in zip(assigns, sourced)
        ):
            names.append(name)
            stmts += assigns
    return sorted(names), sorted(stmts, key=lambda s: s.lineno)


def check_long_prefill(p: Probe) -> None:
    """Where the long-prefill clamp applies: the planner must apply the same clamp in the same
    loops, or its predicted chunk differs from what vLLM schedules."""
    fn = p.method("schedule")
    if fn is None:
        return
    direct = reads(fn, LONG_PREFILL)
    alias_names, alias_stmts = _threshold_aliases(fn)
    running, waiting = _scheduling_loops(fn)

    def uses(loop: ast.AST | None) -> dict[str, int] | None:
        if loop is None:
            return None
        compares = [
            n
            for n in walk_scope(loop)
            if isinstance(n, ast.Compare)
            and (reads(n, LONG_PREFILL) or any(reads(n, name) for name in alias_names))
        ]
        p.cite(*compares)
        return {
            "clamps": len(compares),
            "direct_reads": len(reads(loop, LONG_PREFILL)),
            "alias_reads": sum(len(reads(loop, name)) for name in alias_names),
        }

    in_loops = {id(n) for loop in (running, waiting) if loop for n in walk_scope(loop)}
    hoisted = [s for s in alias_stmts if id(s) not in in_loops]
    p.fact("direct_reads", len(direct), *direct)
    p.fact("aliases", alias_names, *alias_stmts)
    p.fact("running_loop", uses(running))
    p.fact("waiting_loop", uses(waiting))
    p.fact("hoisted", [ast.unparse(s) for s in hoisted])
    p.expect(running is not None, "running loop not found")
    p.expect(waiting is not None, "waiting loop not found")


def check_queues(p: Probe) -> None:
    """The planner walks the same queues in the same order; a new queue is a new source of
    work it would not predict."""
    fn = p.method("schedule")
    if fn is None:
        return
    running, waiting = _scheduling_loops(fn)
    p.fact("running_loop", ast.unparse(running.test) if running else None, running)
    p.fact("waiting_loop", ast.unparse(waiting.test) if waiting else None, waiting)
    p.fact(
        "queues",
        sorted(a for a in self_attrs(fn) if re.search(r"waiting|running", a) and "num" not in a),
    )
    limits = sorted(a for a in self_attrs(waiting) if a.startswith("max_num_")) if waiting else []
    p.fact("waiting_admission_limits", limits)
    # compat.waiting_requests walks the queues in this order, compat.admission_slots counts
    # what this loop counts.
    picks = assignments(waiting, "request_queue") if waiting else []
    first_pick = next((s for s in picks if s.value is not None), None)
    p.fact(
        "queue_pick",
        ast.unparse(first_pick.value) if first_pick is not None and first_pick.value else None,
        first_pick,
    )
    streaming = reads(waiting, "self.num_waiting_for_streaming_input") if waiting else []
    p.fact("admission_counts_streaming_sessions", bool(streaming), *streaming[:1])


def check_scheduler_config_reads(p: Probe) -> None:
    fn = p.method("schedule")
    if fn is None:
        return
    prefix = "self.scheduler_config."
    first_read: dict[str, ast.AST] = {}
    for n in walk_scope(fn):
        chain = dotted(n) if isinstance(n, ast.Attribute) else None
        if chain and chain.startswith(prefix):
            first_read.setdefault(chain[len(prefix) :].split(".")[0], n)
    names = sorted(first_read)
    p.fact("fields", names, *(first_read[n] for n in names))


# --------------------------------------------------------------------------------------------
# EngineCore


def _executor_calls(fn: FunctionNode) -> list[str]:
    prefix = "self.model_executor."
    return sorted(
        {
            (dotted(c.func) or "")[len(prefix) :]
            for c in walk_scope(fn)
            if isinstance(c, ast.Call) and (dotted(c.func) or "").startswith(prefix)
        }
    )


def check_engine_init(p: Probe) -> None:
    fn = p.method("__init__")
    p.signature("params", fn)
    if fn is None:
        return
    getter = calls(fn, "get_scheduler_cls")
    direct = [
        n for n in walk_scope(fn) if (dotted(n) or "").endswith("scheduler_config.scheduler_cls")
    ]
    source = "get_scheduler_cls()" if getter else ("scheduler_cls" if direct else None)
    p.fact("scheduler_from", source, *(getter or direct)[:1])
    p.expect(source is not None, "__init__ does not take the scheduler class from scheduler_config")
    made = assignments(fn, "self.scheduler")
    ctor = next((s.value for s in made if isinstance(s.value, ast.Call)), None)
    p.fact(
        "scheduler_ctor_kwargs",
        sorted(k.arg for k in ctor.keywords if k.arg) if ctor else None,
        ctor,
    )
    p.fact("scheduler_ctor_positional", len(ctor.args) if ctor else None)
    loads = calls(fn, "load_general_plugins")
    p.fact("loads_general_plugins", bool(loads), *loads[:1])


def engine_step(name: str) -> CheckFn:
    """How the engine drives the scheduler and executor in one step: the plugin's scheduler
    must accept the exact call, and the timing hook wraps these executor calls."""

    def check(p: Probe) -> None:
        fn = p.method(name)
        p.signature("params", fn)
        if fn is None:
            return
        sched = calls(fn, "self.scheduler.schedule")
        p.fact("schedule_calls", sorted({ast.unparse(c) for c in sched}), *sched)
        upd = calls(fn, "self.scheduler.update_from_output")
        p.fact("update_from_output_calls", sorted({ast.unparse(c) for c in upd}))
        p.fact("executor_calls", _executor_calls(fn))

    return check


def check_initialize_kv_caches(p: Probe) -> None:
    fn = p.method("_initialize_kv_caches")
    p.signature("params", fn)
    if fn is not None:
        p.fact("returns", ast.unparse(fn.returns) if fn.returns else None)
        p.fact("executor_calls", _executor_calls(fn))


def check_get_scheduler_cls(p: Probe) -> None:
    fn = p.method("get_scheduler_cls")
    if fn is None:
        return
    async_reads = reads(fn, "self.async_scheduling")
    p.fact("default_async_scheduler", bool(async_reads) and "AsyncScheduler" in ast.unparse(fn))
    p.fact("accepts_class_object", "isinstance(self.scheduler_cls, str)" in ast.unparse(fn))
    resolve = calls(fn, "resolve_obj_by_qualname")
    p.fact("resolves_qualname", bool(resolve), *resolve)


# --------------------------------------------------------------------------------------------
# Model runners and workers


def dummy_run(attention_param: str, request_limit: str) -> CheckFn:
    """The startup sweep needs one request of num_tokens with attention computed. compat sets
    the request limit to 1 where `_dummy_run` reads it and, on V1 runners, passes
    force_attention=True; V2 runners build attention unless skip_attn=True. Record both, and
    expect the ones compat relies on for this runner generation."""

    def check(p: Probe) -> None:
        fn = p.method("_dummy_run")
        names = p.signature("params", fn, "num_tokens", attention_param, "is_profile")
        if fn is None:
            return
        bare = {n.lstrip("*") for n in names}
        p.fact("force_attention", "force_attention" in bare)
        p.fact("swallows_unknown_kwargs", fn.args.kwarg is not None)
        limit_reads = [
            n
            for n in walk_scope(fn)
            if isinstance(n, ast.Attribute)
            and isinstance(n.ctx, ast.Load)
            and n.attr in ("max_num_seqs", "max_num_reqs")
        ]
        limits = sorted({dotted(n) or n.attr for n in limit_reads})
        p.fact("request_limit", limits, *limit_reads[:1])
        p.expect(
            request_limit in limits,
            f"_dummy_run() does not read {request_limit} (compat lowers it to 1)",
        )
        spread = [s for s in assignments(fn, "num_reqs") if s.value is not None]
        p.fact("num_reqs", [ast.unparse(s.value) for s in spread if s.value], *spread)

    return check


def check_use_v2_model_runner(p: Probe) -> None:
    fn = p.method("use_v2_model_runner")
    if fn is None:
        return
    text = ast.unparse(fn)
    p.fact("is_property", "property" in decorator_names(fn), fn)
    p.fact("env_override", "VLLM_USE_V2_MODEL_RUNNER" in text)
    arch = calls(fn, "self._is_default_v2_model_runner_model")
    p.fact("architecture_allowlist", bool(arch), *arch)
    p.fact("needs_triton", "HAS_TRITON" in text)
    last = next((s for s in reversed(fn.body) if isinstance(s, ast.Return)), None)
    p.fact("final_return", ast.unparse(last.value) if last and last.value else None, last)


def check_cpu_worker(p: Probe) -> None:
    class_shape("_dummy_run", "execute_model")(p)
    p.fact("methods", method_names(p.cls))
    runners = sorted(
        {
            dotted(s.value.func) or ""
            for m in p.cls.body
            if isinstance(m, ast.FunctionDef)
            for s in assignments(m, "self.model_runner")
            if isinstance(s.value, ast.Call)
        }
    )
    p.fact("model_runner_classes", runners)
    # Methods are nested scopes, so walk each one rather than the class body.
    branch = [
        n
        for m in p.cls.body
        if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)
        for n in walk_scope(m)
        if dotted(n) == "self.use_v2_model_runner"
    ]
    p.fact("branches_on_use_v2_model_runner", bool(branch), *branch[:1])


def check_worker_wrapper(p: Probe) -> None:
    p.signature("execute_model", p.method("execute_model"), "scheduler_output")
    p.fact("has___getattr__", find_method(p.cls, "__getattr__") is not None)
    init = find_method(p.cls, "init_worker")
    ext = (
        [n for n in walk_scope(init) if (dotted(n) or "").endswith("worker_extension_cls")]
        if init
        else []
    )
    p.fact("honours_worker_extension_cls", bool(ext), *ext[:1])
    loads = calls(init, "load_general_plugins") if init else []
    p.fact("init_worker_loads_general_plugins", bool(loads), *loads[:1])


def _super_init_calls(fn: FunctionNode) -> list[ast.Call]:
    return [
        c for c in walk_scope(fn)
        if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
        and c.func.attr == "__init__" and isinstance(c.func.value, ast.Call)
        and dotted(c.func.value.func) == "super"
    ]


def check_executor_init(p: Probe) -> None:
    """patch/executor.py wraps the base Executor.__init__: it must start the workers (through
    _init_executor) after our wrapper has chosen the classes, and every executor class must
    reach it (define no __init__, or call super().__init__)."""
    init = find_method(p.cls, "__init__")
    if p.cls.name == "Executor":
        p.signature("params", init, "vllm_config")
        starts = calls(init, "self._init_executor") if init else []
        p.fact("calls _init_executor", bool(starts), *starts[:1])
        p.expect(bool(starts), "Executor.__init__ does not call _init_executor")
        return
    p.fact("bases", [ast.unparse(b) for b in p.cls.bases], p.cls)
    p.fact("defines __init__", init is not None, init)
    ups = _super_init_calls(init) if init else []
    p.fact("calls super().__init__", bool(ups) if init else None, *ups[:1])
    p.expect(init is None or bool(ups), "__init__ does not call super().__init__")


def check_worker_proc(p: Probe) -> None:
    """Worker processes must be built through WorkerWrapperBase.init_worker, which appends
    parallel_config.worker_extension_cls (our worker methods) to the platform's worker class."""
    init = p.method("__init__")
    wrappers = calls(init, "WorkerWrapperBase") if init else []
    p.fact("builds WorkerWrapperBase", bool(wrappers), *wrappers[:1])
    inits = [c for c in (walk_scope(init) if init else []) if isinstance(c, ast.Call)
             and isinstance(c.func, ast.Attribute) and c.func.attr == "init_worker"]
    p.fact("calls init_worker", bool(inits), *inits[:1])
    p.expect(bool(wrappers) and bool(inits), "workers are not built through WorkerWrapperBase")


def check_collective_rpc(p: Probe) -> None:
    fn = p.method("collective_rpc")
    p.signature("params", fn, "method")
    if fn is not None:
        p.fact("abstract", any(n.endswith("abstractmethod") for n in decorator_names(fn)))


def check_model_runner_output(p: Probe) -> None:
    p.fact("dataclass", is_dataclass(p.cls), p.cls)
    p.fact("slots", uses_slots(p.cls))
    p.fact("frozen", is_frozen(p.cls))
    p.expect(not p.facts["slots"], "__slots__: a timing attribute cannot be attached")
    p.expect(not p.facts["frozen"], "frozen: a timing attribute cannot be attached")
    # A shared module-level instance: setting a timing attribute on it would leak to every
    # later step that returns it.
    empty = assignments(p.module.tree, "EMPTY_MODEL_RUNNER_OUTPUT")
    p.fact("shared_empty_instance", bool(empty), *empty[:1])


def check_message_queue(p: Probe) -> None:
    """Worker results cross processes through this queue; an extra attribute on the output
    survives only if the queue pickles (msgspec/dataclass-field encoders would drop it)."""
    fn = p.method("enqueue")
    if fn is None:
        return
    pickles = [n for n in walk_scope(fn) if (dotted(n) or "").startswith("pickle.")]
    p.fact("serializer", "pickle" if pickles else "other", *pickles[:1])


def check_general_plugins(p: Probe) -> None:
    assert not isinstance(p.node, ast.ClassDef)
    fn = p.node
    p.fact("params", params(fn) if fn else None, fn)
    constants = module_constants(p.module.tree)
    group = None
    for call in calls(fn, "load_plugins_by_group") if fn else []:
        arg = next((k.value for k in call.keywords if k.arg == "group"), None)
        if arg is None and call.args:
            arg = call.args[0]
        if isinstance(arg, ast.Constant):
            group = arg.value
        elif isinstance(arg, ast.Name):
            group = constants.get(arg.id)
        p.fact("group", group, call)
    p.facts.setdefault("group", None)
    p.expect(group == "vllm.general_plugins", "entry-point group is not vllm.general_plugins")


def check_additional_config(p: Probe) -> None:
    fields("additional_config", dataclass_required=False)(p)


# --------------------------------------------------------------------------------------------
# The surfaces (one entry each)

SCHED = "vllm/v1/core/sched/scheduler.py"
ENGINE = "vllm/v1/engine/core.py"
OUTPUT = "vllm/v1/core/sched/output.py"
GPU_RUNNER = "vllm/v1/worker/gpu_model_runner.py"
GPU_RUNNER_V2 = "vllm/v1/worker/gpu/model_runner.py"
WORKER_BASE = ("vllm/v1/worker/worker_base.py", "vllm/worker/worker_base.py")
VLLM_CONFIG = ("vllm/config/vllm.py", "vllm/config/__init__.py", "vllm/config.py")

# fmt: off
SURFACES: list[Surface] = [
    Surface("scheduler.init", "Scheduler.__init__ params", (SCHED,), ("Scheduler",),
            signature("__init__", "vllm_config", "kv_cache_config")),
    Surface("scheduler.max_num_scheduled_tokens",
            "Scheduler.__init__ sets self.max_num_scheduled_tokens", (SCHED,), ("Scheduler",),
            check_max_num_scheduled_tokens),
    Surface("scheduler.schedule", "Scheduler.schedule params", (SCHED,), ("Scheduler",),
            signature("schedule")),
    Surface("scheduler.token_budget",
            "schedule(): token_budget = self.max_num_scheduled_tokens", (SCHED,),
            ("Scheduler",), check_token_budget),
    Surface("scheduler.long_prefill",
            "schedule(): long_prefill_token_threshold in running/waiting loops", (SCHED,),
            ("Scheduler",), check_long_prefill),
    Surface("scheduler.queues", "schedule(): queues walked", (SCHED,), ("Scheduler",),
            check_queues),
    Surface("scheduler.config_reads", "schedule(): scheduler_config fields read", (SCHED,),
            ("Scheduler",), check_scheduler_config_reads),
    Surface("scheduler.init_state", "Scheduler.__init__: queues and limits compat reads",
            (SCHED,), ("Scheduler",),
            attributes("running", "waiting", "requests", "max_num_running_reqs",
                       "max_num_scheduled_tokens", "scheduler_config", "policy",
                       optional=("skipped_waiting", "kv_holding_waiting", "deferred_waiting",
                                 "max_num_active_reqs", "adaptive_long_prefill_threshold",
                                 "num_waiting_for_streaming_input"))),
    Surface("request.fields", "Request: progress fields and ordering",
            ("vllm/v1/request.py",), ("Request",),
            attributes("request_id", "num_prompt_tokens", "num_computed_tokens", "num_tokens",
                       "__lt__", optional=("num_tokens_with_spec",
                                           "num_output_placeholders"))),
    Surface("scheduler.update_from_output", "Scheduler.update_from_output params", (SCHED,),
            ("Scheduler",), signature("update_from_output", "scheduler_output")),
    Surface("scheduler.async", "AsyncScheduler (default with async_scheduling)",
            ("vllm/v1/core/sched/async_scheduler.py",), ("AsyncScheduler",),
            class_shape("schedule", "update_from_output")),
    Surface("output.scheduler_output", "SchedulerOutput fields", (OUTPUT,),
            ("SchedulerOutput",),
            fields("scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens",
                   "total_num_scheduled_tokens", optional=("preempted_req_ids",))),
    Surface("output.new_request_data", "NewRequestData fields", (OUTPUT,), ("NewRequestData",),
            fields("req_id", "num_computed_tokens")),
    Surface("output.cached_request_data", "CachedRequestData fields", (OUTPUT,),
            ("CachedRequestData",), fields("req_ids", "num_computed_tokens")),
    Surface("engine.init", "EngineCore.__init__ (params, scheduler class)", (ENGINE,),
            ("EngineCore",), check_engine_init),
    Surface("engine.step", "EngineCore.step", (ENGINE,), ("EngineCore",), engine_step("step")),
    Surface("engine.step_with_batch_queue", "EngineCore.step_with_batch_queue", (ENGINE,),
            ("EngineCore",), engine_step("step_with_batch_queue")),
    Surface("engine.initialize_kv_caches", "EngineCore._initialize_kv_caches", (ENGINE,),
            ("EngineCore",), check_initialize_kv_caches),
    Surface("config.scheduler", "SchedulerConfig fields",
            ("vllm/config/scheduler.py", "vllm/config/__init__.py", "vllm/config.py"),
            ("SchedulerConfig",),
            fields("scheduler_cls", "max_num_batched_tokens", "long_prefill_token_threshold",
                   "enable_chunked_prefill", "max_num_seqs",
                   optional=("async_scheduling", "max_num_scheduled_tokens",
                             "max_num_partial_prefills", "max_num_active_seqs",
                             "long_prefill_token_threshold_adaptive"),
                   dataclass_required=False)),
    Surface("config.get_scheduler_cls", "SchedulerConfig.get_scheduler_cls",
            ("vllm/config/scheduler.py", "vllm/config/__init__.py", "vllm/config.py"),
            ("SchedulerConfig",), check_get_scheduler_cls),
    Surface("config.additional_config", "VllmConfig.additional_config", VLLM_CONFIG,
            ("VllmConfig",), check_additional_config),
    Surface("config.use_v2_model_runner", "VllmConfig.use_v2_model_runner", VLLM_CONFIG,
            ("VllmConfig",), check_use_v2_model_runner),
    Surface("runner.v1_dummy_run", "GPUModelRunner._dummy_run (V1 runner)", (GPU_RUNNER,),
            ("GPUModelRunner",),
            dummy_run("force_attention", "self.scheduler_config.max_num_seqs"), None),
    Surface("runner.v2_dummy_run", "GPUModelRunner._dummy_run (V2 runner, worker/gpu/)",
            (GPU_RUNNER_V2,), ("GPUModelRunner",), dummy_run("skip_attn", "self.max_num_reqs"),
            None),
    Surface("runner.cpu", "CPUModelRunner (V1, cpu_model_runner.py)",
            ("vllm/v1/worker/cpu_model_runner.py",), ("CPUModelRunner",),
            class_shape("_dummy_run", "execute_model"), None),
    Surface("runner.cpu_v2", "CPUModelRunner (V2, worker/cpu/model_runner.py)",
            ("vllm/v1/worker/cpu/model_runner.py",), ("CPUModelRunner",),
            class_shape("_dummy_run", "execute_model"), None),
    Surface("worker.cpu", "CPUWorker", ("vllm/v1/worker/cpu_worker.py",), ("CPUWorker",),
            check_cpu_worker),
    Surface("worker.gpu", "Worker.execute_model (gpu_worker.py)",
            ("vllm/v1/worker/gpu_worker.py",), ("Worker",),
            signature("execute_model", "scheduler_output"), None),
    Surface("worker.base", "WorkerBase.execute_model", WORKER_BASE, ("WorkerBase",),
            signature("execute_model", "scheduler_output")),
    Surface("worker.wrapper", "WorkerWrapperBase", WORKER_BASE, ("WorkerWrapperBase",),
            check_worker_wrapper),
    Surface("worker.async_intermediate_tensors",
            "AsyncIntermediateTensors.wait_for_comm (PP input)",
            ("vllm/v1/worker/gpu_worker.py",), ("AsyncIntermediateTensors",),
            attributes("wait_for_comm")),
    Surface("platform.interface", "Platform.device_type / device_name",
            ("vllm/platforms/interface.py",), ("Platform",),
            attributes("device_type", "device_name")),
    Surface("distributed.group", "GroupCoordinator (pp/tp rank, last rank)",
            ("vllm/distributed/parallel_state.py",), ("GroupCoordinator",),
            attributes("rank_in_group", "is_last_rank")),
    Surface("executor.init", "Executor.__init__ starts workers via _init_executor",
            ("vllm/v1/executor/abstract.py",), ("Executor",), check_executor_init),
    Surface("executor.multiproc", "MultiprocExecutor reaches Executor.__init__",
            ("vllm/v1/executor/multiproc_executor.py",), ("MultiprocExecutor",),
            check_executor_init),
    Surface("executor.uniproc", "UniProcExecutor reaches Executor.__init__",
            ("vllm/v1/executor/uniproc_executor.py",), ("UniProcExecutor",),
            check_executor_init),
    Surface("executor.ray", "RayDistributedExecutor reaches Executor.__init__",
            ("vllm/v1/executor/ray_executor.py",), ("RayDistributedExecutor",),
            check_executor_init),
    Surface("executor.worker_proc", "WorkerProc builds workers via WorkerWrapperBase",
            ("vllm/v1/executor/multiproc_executor.py",), ("WorkerProc",), check_worker_proc),
    Surface("executor.collective_rpc", "Executor.collective_rpc",
            ("vllm/v1/executor/abstract.py", "vllm/executor/executor_base.py"),
            ("Executor", "ExecutorBase"), check_collective_rpc),
    Surface("outputs.model_runner_output", "ModelRunnerOutput (attribute can be attached)",
            ("vllm/v1/outputs.py",), ("ModelRunnerOutput",), check_model_runner_output),
    Surface("ipc.message_queue", "MessageQueue.enqueue serializer (worker -> engine)",
            ("vllm/distributed/device_communicators/shm_broadcast.py",), ("MessageQueue",),
            check_message_queue),
    Surface("plugins.general", "load_general_plugins / vllm.general_plugins",
            ("vllm/plugins/__init__.py",), ("load_general_plugins",), check_general_plugins),
]
# fmt: on


# How the plugin copes where a release differs from the reference (the table's last column).
# Each entry names the code that handles it; tests/unit/test_compat.py has a test per entry.
HANDLING: dict[str, str] = {
    "scheduler.schedule": "CppScheduler.schedule(*args, **kwargs) forwards whatever the "
    "engine passes (no throttle_prefills before 0.25)",
    "scheduler.token_budget": "compat.step_limits only lowers max_num_scheduled_tokens; "
    "0.30+'s input_budget (max_num_batched_tokens) never binds below it",
    "scheduler.long_prefill": "compat.step_limits sets the cap before schedule() (read per "
    "loop up to 0.30, once at the top in 0.32) and turns 0.32's adaptive floor off for the "
    "call; 0.32 drops the cap for a single eligible request, whose budget is its chunk",
    "scheduler.queues": "compat.waiting_requests: skipped_waiting first (FCFS) or merged "
    "(priority) up to 0.30, kv_holding_waiting first in 0.32; compat.admission_slots: "
    "max_num_active_reqs if present, streaming sessions counted from 0.25",
    "scheduler.config_reads": "informational: the input budget (see token_budget)",
    "scheduler.init_state": "compat reads optional ones with getattr (admission_limit, "
    "waiting_requests, step_limits)",
    "engine.step": "as Scheduler.schedule params",
    "engine.step_with_batch_queue": "as Scheduler.schedule params",
    "engine.initialize_kv_caches": "informational: the startup sweep runs from the scheduler "
    "constructor, after these calls in every release",
    "config.scheduler": "compat.scheduler_config_value (getattr with the release default); "
    "writes use object.__setattr__ (pydantic validate-on-assignment)",
    "config.use_v2_model_runner": "informational: which runner a worker builds; both are "
    "handled by compat.one_request_dummy_run",
    "runner.v1_dummy_run": "compat.one_request_dummy_run passes only named parameters "
    "(randomize_inputs from 0.27)",
    "runner.v2_dummy_run": "compat.one_request_dummy_run: max_num_reqs=1 for the call, "
    "attention built by default (skip_attn=False), no force_attention passed",
    "worker.cpu": "informational: the plugin adds methods through worker_extension_cls and "
    "wraps the model runner, not the worker",
}


def surface_by_key(key: str) -> Surface:
    for s in SURFACES:
        if s.key == key:
            return s
    raise KeyError(key)
