"""The operator docs stay complete and the two languages stay twins.

- every page in docs/ has a twin in docs/zh/ and the other way round, both in the mkdocs nav;
- twins have the same headings (count and levels), the same fenced code blocks in the same
  order, and the same set of inline code spans (commands, keys, values, log lines);
- Chinese pages are written in Chinese (their prose is mostly CJK characters);
- every `cpp_config` key is in the key table of both configuration pages, with its real
  default;
- every "[CPP]" warning or error the package can emit (logger.warning/error/exception/
  critical calls, and exceptions built with a "[CPP]" message) appears in both troubleshooting
  pages: every literal piece of its template that is long enough to grep for, verbatim and in
  English, because operators search logs with them.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

from vllm_ascend_cpp.config import CppConfig, config_keys

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
ZH = DOCS / "zh"
PACKAGE = ROOT / "vllm_ascend_cpp"

LOG_LEVELS = {"warning", "error", "exception", "critical"}
# Literal pieces shorter than this (after stripping) are too generic to find a message by.
MIN_PIECE = 6
_FENCE = re.compile(r"^(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+\S")
_INLINE = re.compile(r"(`+)(.+?)\1")
_PRINTF = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[sdifgeExXr%]")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")
_LATIN = re.compile(r"[A-Za-z]")


# -- Markdown parsing ---------------------------------------------------------------------

@dataclass
class Page:
    headings: list[int]
    blocks: list[str]
    spans: set[str]
    prose: str


def parse(path: Path) -> Page:
    headings: list[int] = []
    blocks: list[str] = []
    spans: set[str] = set()
    prose: list[str] = []
    fence: str | None = None
    block: list[str] = []
    paragraph: list[str] = []

    def end_paragraph() -> None:
        # A code span may wrap onto the next line; Markdown reads the line break as a space.
        text = " ".join(paragraph)
        for span in _INLINE.finditer(text):
            spans.add(" ".join(span.group(2).split()))
        prose.append(_INLINE.sub(" ", text))
        paragraph.clear()

    for line in path.read_text(encoding="utf-8").splitlines():
        m = _FENCE.match(line.strip())
        if fence is None and m:
            end_paragraph()
            fence = m.group(1)
            block = []
            continue
        if fence is not None:
            if line.strip().startswith(fence) and line.strip().strip(fence[0]) == "":
                blocks.append("\n".join(block))
                fence = None
            else:
                block.append(line)
            continue
        h = _HEADING.match(line)
        if h:
            headings.append(len(h.group(1)))
        if not line.strip() or h:
            end_paragraph()
        # Table rows are paragraphs of their own: a row never continues onto the next line.
        if line.lstrip().startswith("|"):
            end_paragraph()
            paragraph.append(line.strip())
            end_paragraph()
        else:
            paragraph.append(line.strip())
    end_paragraph()
    assert fence is None, f"{path}: unclosed code fence"
    return Page(headings, blocks, spans, "\n".join(prose))


def page_names(folder: Path) -> set[str]:
    return {p.name for p in folder.glob("*.md")}


PAGES = sorted(page_names(DOCS) | page_names(ZH))


def test_pages_exist() -> None:
    expected = {"index.md", "quickstart.md", "configuration.md", "how-it-works.md", "report.md",
                "tuning.md", "troubleshooting.md", "compatibility.md", "multinode.md",
                "faq.md"}
    assert expected <= page_names(DOCS)


@pytest.mark.parametrize("name", PAGES)
def test_every_page_has_its_twin(name: str) -> None:
    assert (DOCS / name).is_file(), f"docs/zh/{name} has no English twin docs/{name}"
    assert (ZH / name).is_file(), f"docs/{name} has no Chinese twin docs/zh/{name}"


@pytest.mark.parametrize("name", PAGES)
def test_twins_have_the_same_sections(name: str) -> None:
    en, zh = parse(DOCS / name), parse(ZH / name)
    assert len(en.headings) == len(zh.headings), (
        f"{name}: {len(en.headings)} headings in English, {len(zh.headings)} in Chinese")
    assert en.headings == zh.headings, f"{name}: heading levels differ"


@pytest.mark.parametrize("name", PAGES)
def test_twins_show_the_same_code(name: str) -> None:
    en, zh = parse(DOCS / name), parse(ZH / name)
    assert len(en.blocks) == len(zh.blocks), (
        f"{name}: {len(en.blocks)} code blocks in English, {len(zh.blocks)} in Chinese")
    for i, (a, b) in enumerate(zip(en.blocks, zh.blocks, strict=True)):
        assert a == b, f"{name}: code block {i + 1} differs between the languages"
    assert en.spans - zh.spans == set(), f"{name}: only in English: {sorted(en.spans - zh.spans)}"
    assert zh.spans - en.spans == set(), f"{name}: only in Chinese: {sorted(zh.spans - en.spans)}"


@pytest.mark.parametrize("name", PAGES)
def test_chinese_pages_are_chinese(name: str) -> None:
    prose = parse(ZH / name).prose
    # Link targets, URLs and file names are Latin in every language.
    prose = re.sub(r"\]\([^)]*\)", "]", prose)
    cjk, latin = len(_CJK.findall(prose)), len(_LATIN.findall(prose))
    assert cjk > 100, f"docs/zh/{name}: only {cjk} Chinese characters"
    assert cjk >= latin, f"docs/zh/{name}: {cjk} Chinese characters vs {latin} Latin letters"


def test_nav_lists_both_languages() -> None:
    yaml = pytest.importorskip("yaml")

    class Loader(yaml.SafeLoader):
        pass

    # mkdocs.yml names a Python function (the toc slugify); the nav is all this test reads.
    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)

    def files(node: object) -> Iterator[str]:
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for item in node:
                yield from files(item)
        elif isinstance(node, dict):
            for value in node.values():
                yield from files(value)

    listed = set(files(config["nav"]))
    for name in PAGES:
        assert name in listed, f"docs/{name} is not in the mkdocs nav"
        assert f"zh/{name}" in listed, f"docs/zh/{name} is not in the mkdocs nav"


# -- configuration keys -------------------------------------------------------------------

def key_rows(path: Path) -> dict[str, list[str]]:
    """Rows of the key table: first cell a code span naming a key -> the cells."""
    rows: dict[str, list[str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.fullmatch(r"`([a-z_]+)`", cells[0])
        if m and len(cells) >= 5 and m.group(1) not in rows:
            rows[m.group(1)] = cells
    return rows


DEFAULTS = {f.name: f.default for f in fields(CppConfig)}


@pytest.mark.parametrize("folder", [DOCS, ZH], ids=["en", "zh"])
@pytest.mark.parametrize("key", config_keys())
def test_every_key_is_documented_with_its_default(folder: Path, key: str) -> None:
    rows = key_rows(folder / "configuration.md")
    assert key in rows, f"{folder / 'configuration.md'}: no table row for cpp_config.{key}"
    default = rows[key][2]
    m = re.fullmatch(r"`(.+)`", default)
    assert m, f"cpp_config.{key}: default cell {default!r} is not one code span"
    assert json.loads(m.group(1)) == DEFAULTS[key], (
        f"cpp_config.{key}: docs say {m.group(1)}, the code says {DEFAULTS[key]!r}")


def test_no_key_table_row_for_a_key_that_does_not_exist() -> None:
    for folder in (DOCS, ZH):
        extra = set(key_rows(folder / "configuration.md")) - set(config_keys())
        assert not extra, f"{folder / 'configuration.md'}: documents unknown keys {extra}"


# -- messages -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Message:
    where: str
    template: str  # literal text, with "\0" where a value is filled in at run time

    @property
    def pieces(self) -> list[str]:
        parts = [p.strip() for p in self.template.split("\0")]
        parts = [p for p in parts if len(p) >= MIN_PIECE]
        # The head of the message is what a grep for it starts with, however short.
        head = self.template.split("\0")[0].strip()
        if head and head not in parts:
            parts.insert(0, head)
        return parts


def _module_strings(tree: ast.Module) -> dict[str, str]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = node.value.value
    return out


def _template(node: ast.AST, names: dict[str, str]) -> str | None:
    """The literal text of a message expression, placeholders as "\\0"; None if unknown."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _PRINTF.sub("\0", node.value)
    if isinstance(node, ast.JoinedStr):
        out = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                out.append(str(part.value))
            elif isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name) \
                    and part.value.id in names and part.format_spec is None \
                    and part.conversion == -1:
                out.append(names[part.value.id])
            else:
                out.append("\0")
        return "".join(out)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left = _template(node.left, names)
        right = _template(node.right, names)
        return None if left is None else left + (right if right is not None else "\0")
    return None


def _is_logger_call(call: ast.Call) -> bool:
    f = call.func
    return isinstance(f, ast.Attribute) and f.attr in LOG_LEVELS \
        and isinstance(f.value, ast.Name) and f.value.id == "logger"


def _is_exception_call(call: ast.Call) -> bool:
    f = call.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    return name.endswith("Error") or name.endswith("Exception")


def emitted_messages() -> list[Message]:
    found: list[Message] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = _module_strings(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            if not (_is_logger_call(node) or _is_exception_call(node)):
                continue
            text = _template(node.args[0], names)
            if text is None or not text.startswith("[CPP]"):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            found.append(Message(where, text))
    return found


MESSAGES = emitted_messages()


def test_the_scan_finds_the_known_messages() -> None:
    # Guards the scanner itself: if it stopped finding these, the test below would pass
    # vacuously.
    heads = {m.template.split("\0")[0] for m in MESSAGES}
    assert "[CPP] plugin not installed: " in heads
    assert any(h.startswith("[CPP] cpp_config requires pipeline parallelism") for h in heads)
    assert any(h.startswith("[CPP] dynamic chunking is off") for h in heads)
    assert len(MESSAGES) >= 15


@pytest.mark.parametrize("folder", [DOCS, ZH], ids=["en", "zh"])
@pytest.mark.parametrize("message", MESSAGES, ids=[m.where for m in MESSAGES])
def test_every_message_is_in_troubleshooting(folder: Path, message: Message) -> None:
    page = (folder / "troubleshooting.md").read_text(encoding="utf-8")
    missing = [p for p in message.pieces if p not in page]
    assert not missing, (
        f"{folder / 'troubleshooting.md'} lacks the message from {message.where}: "
        f"{message.template.replace(chr(0), '<...>')!r}; missing text {missing}")
