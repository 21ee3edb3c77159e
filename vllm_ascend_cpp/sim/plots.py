"""Gantt charts of the pipeline: stages x time, one colour per request, bubbles visible.

Used by ``vllm-cpp simulate --plot`` and ``vllm-cpp report --trace FILE --plot``. Panels share
one time axis so a faster policy is visibly shorter. matplotlib is imported lazily (Agg
backend, no display needed); it is in the ``dev`` extra.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .timeline import Timeline, merge_intervals

__all__ = ["gantt", "PlotError"]

_DECODE_COLOUR = "#b0b0b0"
_BUBBLE_COLOUR = "#f4c7c3"


class PlotError(RuntimeError):
    """matplotlib is missing or the figure could not be written."""


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # ImportError, or a broken backend
        raise PlotError(f"matplotlib is needed for --plot ({exc}); pip install matplotlib") \
            from None
    return plt


def _colour_map(panels: Sequence[tuple[str, Timeline]]) -> dict[str, object]:
    """Request id -> colour, the same request the same colour in every panel."""
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    order: dict[str, int] = {}
    for _, tl in panels:
        for step in tl.steps:
            for rid, _, _, pre in step.items:
                if pre and rid not in order:
                    order[rid] = len(order)
    return {rid: cmap((2 * i) % 20 + (i // 10) % 2) for rid, i in order.items()}


def gantt(panels: Sequence[tuple[str, Timeline]], out_path: str, *,
          window_ms: float | None = None, title: str | None = None,
          subtitles: Sequence[str] | None = None) -> str:
    """Draw one panel per ``(label, timeline)`` into ``out_path`` (PNG); returns the path.

    Bars are steps on each stage, coloured by the request owning most of the step's prefill
    tokens (grey: decode only). Light red behind the bars marks time when some request was
    waiting for its first token; where it shows through, a stage sat idle: a bubble.
    ``window_ms`` limits the time axis (default: the longest panel).
    """
    if not panels:
        raise PlotError("nothing to plot")
    plt = _pyplot()
    colours = _colour_map(panels)
    end = window_ms or max((tl.end_ms for _, tl in panels), default=1.0) or 1.0
    scale, unit = (1000.0, "s") if end >= 5000 else (1.0, "ms")
    n = len(panels)
    height = max(2.2, 0.45 * max(tl.stages for _, tl in panels) + 1.3)
    fig, axes = plt.subplots(n, 1, figsize=(13, height * n), sharex=True, squeeze=False)
    for k, (label, tl) in enumerate(panels):
        ax = axes[k][0]
        S = tl.stages
        for a, b in merge_intervals(tl.prefill_windows):
            if a >= end:
                continue
            ax.axvspan(a / scale, min(b, end) / scale, color=_BUBBLE_COLOUR, lw=0, zorder=0)
        for step in tl.steps:
            if step.starts[0] >= end:
                continue
            lead = step.lead
            colour = colours.get(lead, _DECODE_COLOUR) if lead else _DECODE_COLOUR
            for s in range(S):
                a, b = step.starts[s], min(step.ends[s], end)
                if b <= a:
                    continue
                ax.broken_barh([(a / scale, (b - a) / scale)], (S - 1 - s + 0.1, 0.8),
                               facecolors=colour, edgecolors="white", linewidth=0.4, zorder=2)
        ax.set_yticks([S - 1 - s + 0.5 for s in range(S)])
        ax.set_yticklabels([f"stage {s}" for s in range(S)])
        ax.set_ylim(0, S)
        text = label
        if subtitles is not None and k < len(subtitles) and subtitles[k]:
            text = f"{label}  —  {subtitles[k]}"
        ax.set_title(text, loc="left", fontsize=10)
        ax.grid(axis="x", alpha=0.3, zorder=1)
    axes[-1][0].set_xlim(0, end / scale)
    axes[-1][0].set_xlabel(f"time ({unit}); colour = request, grey = decode only, "
                           "light red showing through = idle stage while a prefill waits")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    try:
        fig.savefig(out_path, dpi=110, format="png")
    except OSError as exc:
        raise PlotError(f"cannot write {out_path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    return out_path


def describe(mean_ttft_ms: float, cv: float, bubble: float) -> str:
    """The figures printed under each panel's label."""
    parts = []
    if math.isfinite(mean_ttft_ms):
        parts.append(f"mean TTFT {mean_ttft_ms / 1000:.2f} s" if mean_ttft_ms >= 1000
                     else f"mean TTFT {mean_ttft_ms:.1f} ms")
    if math.isfinite(cv):
        parts.append(f"prefill step CV {cv:.2f}")
    if math.isfinite(bubble):
        parts.append(f"bubbles {100 * bubble:.0f}%")
    return ", ".join(parts)
