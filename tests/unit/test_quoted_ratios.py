"""Every ratio quoted in README.md and docs/tuning.md (both languages) comes from a results file.

The format (benchmarks/ratio_stats.py, `Ratio.quoted`): a measured ratio is written with three
decimals and an `x`, optionally followed by its bootstrap interval: `0.968x` or
`0.968x [0.905-1.070]`. Any other decimal number followed by `x` or `倍` in these pages is an
error (it would be a ratio nobody can trace), and a quoted ratio must appear verbatim, interval
included, in a Markdown file under benchmarks/results/. Simulated ratios written without an `x`
(e.g. "ratio 0.858" from `vllm-cpp plan`) are not measured figures and are not checked here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs/tuning.md", "docs/zh/tuning.md")
RESULTS = ROOT / "benchmarks" / "results"

# Anything that reads as a decimal ratio: "0.97x", "1.5 倍", "0.968x".
ANY_RATIO = re.compile(r"(?<![\w.])\d+\.\d+\s*(?:x|倍)(?![A-Za-z0-9])")
QUOTED = re.compile(r"\d+\.\d{3}x(?: \[\d+\.\d{3}-\d+\.\d{3}\])?")


def problems(text: str, results: str) -> list[str]:
    """Ratios in ``text`` that break the format or are missing from ``results``."""
    out = []
    for m in ANY_RATIO.finditer(text):
        q = QUOTED.match(text, m.start())
        if q is None:
            out.append(f"{m.group(0)!r} is not in the quoted form 0.968x [0.905-1.070]")
        elif q.group(0) not in results:
            out.append(f"{q.group(0)!r} appears in no file under benchmarks/results/")
    return out


def results_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(RESULTS.glob("*.md")))


def test_every_quoted_ratio_is_in_a_results_file() -> None:
    results = results_text()
    found = {page: problems((ROOT / page).read_text(encoding="utf-8"), results)
             for page in PAGES}
    assert not any(found.values()), found


def test_english_and_chinese_tuning_quote_the_same_ratios() -> None:
    en, zh = ((ROOT / p).read_text(encoding="utf-8") for p in PAGES[1:])
    assert QUOTED.findall(en) == QUOTED.findall(zh)


def test_the_checker_catches_what_it_should() -> None:
    results = "| a | 0.968x [0.905-1.070] |"
    assert problems("about 0.968x [0.905-1.070] here", results) == []
    assert problems("about 0.968x [0.905-1.071] here", results)  # interval differs
    assert problems("CPP at 0.97x the fixed", results)  # two decimals: untraceable
    assert problems("为固定分块的 0.861 倍", results)
    assert problems("up to 2x and a 1.5-fold", results) == []  # no decimal ratio
