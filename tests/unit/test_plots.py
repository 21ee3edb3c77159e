"""Gantt charts: `vllm-cpp simulate --plot` and `vllm-cpp report --trace --plot` write PNGs."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("matplotlib")

from vllm_ascend_cpp.cli import main  # noqa: E402
from vllm_ascend_cpp.core.latency_model import LatencyModel  # noqa: E402
from vllm_ascend_cpp.sim import EngineSpec, Policy, Workload, simulate_policy  # noqa: E402
from vllm_ascend_cpp.sim.plots import PlotError, gantt  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MODEL = LatencyModel(a=2e-7, b=0.0064, c=18.0)


def is_png(path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(8) == PNG_MAGIC


def test_gantt_draws_one_panel_per_timeline(tmp_path):
    wl = Workload(prompt_len=40_000, num_requests=2, concurrency=2, output_len=4)
    panels = []
    for kind in ("fixed", "cpp-auto"):
        r = simulate_policy(EngineSpec(stages=4, model=MODEL), Policy(kind, 8192), wl,
                            record_timeline=True)
        panels.append((r.policy, r.timeline))
    out = tmp_path / "g.png"
    assert gantt(panels, str(out), title="t", subtitles=["a", "b"]) == str(out)
    assert is_png(out) and out.stat().st_size > 10_000
    with pytest.raises(PlotError):
        gantt(panels, str(tmp_path))  # a directory is not a PNG file
    with pytest.raises(PlotError):
        gantt([], str(out))


def test_cli_simulate_plot(tmp_path, capsys):
    out = tmp_path / "sim.png"
    assert main(["simulate", "--a", "2e-7", "--b", "0.0064", "--c", "18", "--pp", "4",
                 "--prompt-len", "65536", "--budget", "16384", "--requests", "2",
                 "--decode", "remote", "--policy", "fixed", "--policy", "cpp-auto",
                 "--plot", str(out)]) == 0
    assert "Gantt chart written" in capsys.readouterr().out
    assert is_png(out)
    assert main(["simulate", "--a", "2e-7", "--b", "0.0064", "--c", "18", "--prompt-len",
                 "4096", "--budget", "4096", "--requests", "1", "--plot",
                 str(tmp_path)]) == 2


def test_cli_report_plot_side_by_side(tmp_path, capsys):
    paths = []
    for name, chunks in (("fixed", [4096, 4096, 4096]), ("cpp", [6144, 3584, 2560])):
        lines, h, t = [], 0, 100.0
        for k, n in enumerate(chunks):
            ms = MODEL.request_ms(h, n)
            t += ms / 1000
            lines.append({"step": k + 1, "time": t, "state": "ready",
                          "requests": [{"id": "r0", "history": h, "chunk": n}], "decodes": 0,
                          "predicted_ms": ms, "measured_ms": ms})
            h += n
        path = tmp_path / f"{name}.jsonl"
        path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
        paths.append(str(path))
    out = tmp_path / "report.png"
    assert main(["report", "--trace", paths[0], "--trace", paths[1], "--label", "fixed",
                 "--label", "dynamic", "--pp", "2", "--plot", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Gantt chart written" in text and text.count("trace ") == 2
    assert is_png(out)
    assert main(["report", "--trace", paths[0], "--label", "a", "--label", "b"]) == 2
