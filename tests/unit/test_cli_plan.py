"""``vllm-cpp plan``: the chunk plan and predicted TTFT from coefficients or a profile."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from vllm_ascend_cpp.cli import main
from vllm_ascend_cpp.core.latency_model import LatencyModel
from vllm_ascend_cpp.core.manager import ProfilingChunkManager
from vllm_ascend_cpp.core.settings import CoreSettings

EXAMPLE = ["plan", "--a", "1e-7", "--b", "0.02", "--c", "30", "--gamma", "0",
           "--prompt-len", "131072", "--budget", "16384", "--pp", "4"]


def run_json(capsys, argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_example_chunks_shrink_and_dynamic_beats_fixed(capsys):
    out = run_json(capsys, EXAMPLE)
    chunks = [c["chunk"] for c in out["chunks"]]
    assert sum(chunks) == 131072
    assert chunks[0] == 16384 and all(x >= y for x, y in zip(chunks, chunks[1:], strict=False))
    assert chunks[-1] < chunks[0]
    assert out["ttft_dynamic_ms"] < out["ttft_fixed_ms"]
    assert [c["chunk"] for c in out["fixed_chunks"]] == [16384] * 8
    assert {"history", "chunk", "predicted_ms"} <= set(out["chunks"][0])
    assert out["min_chunk"] == 4096


def test_example_text_output(capsys):
    assert main(EXAMPLE) == 0
    text = capsys.readouterr().out
    assert "predicted TTFT at pp=4" in text and "fixed" in text and "dynamic" in text
    assert "16384" in text


def test_module_entry_point_runs():
    proc = subprocess.run([sys.executable, "-m", "vllm_ascend_cpp.cli", *EXAMPLE],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "predicted TTFT" in proc.stdout


def test_min_chunk_defaults_to_the_budget_when_smaller(capsys):
    out = run_json(capsys, ["plan", "--a", "1e-7", "--b", "0.02", "--c", "30",
                            "--prompt-len", "10000", "--budget", "2048"])
    assert out["min_chunk"] == 2048 and out["pp_size"] == 2


def test_profile_input(tmp_path, capsys):
    m = ProfilingChunkManager(CoreSettings(base_chunk=8192))
    m.begin_profiling()
    sizes = m.sample_sizes()
    true = LatencyModel(a=1e-7, b=0.02, c=30.0)
    rng = np.random.default_rng(0)
    m.finish_profiling(sizes, [true.request_ms(0, s) * (1 + 0.01 * rng.standard_normal())
                               for s in sizes])
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(m.profile_dict()))
    out = run_json(capsys, ["plan", "--profile", str(path), "--prompt-len", "65536"])
    assert out["budget"] == 8192  # from the profile's base chunk
    assert sum(c["chunk"] for c in out["chunks"]) == 65536
    assert out["model"] == m.model.to_dict()


@pytest.mark.parametrize("argv, message", [
    (["--prompt-len", "0"], "--prompt-len"),
    (["--prompt-len", "-5"], "--prompt-len"),
    (["--budget", "0"], "--budget"),
    (["--smooth", "0"], "--smooth"),
    (["--smooth", "1.5"], "--smooth"),
    (["--pp", "0"], "--pp"),
    (["--min-chunk", "-1"], "--min-chunk"),
    (["--a", "-1e-7"], "--a"),
    (["--b", "nan"], "--b"),
    (["--prompt-len", "abc"], "--prompt-len"),
])
def test_bad_arguments_exit_2_with_one_line(capsys, argv, message):
    base = {"--a": "1e-7", "--b": "0.02", "--c": "30", "--prompt-len": "1000",
            "--budget": "4096"}
    args = dict(base)
    args.update(dict(zip(argv[::2], argv[1::2], strict=True)))
    flat = ["plan"] + [x for kv in args.items() for x in kv]
    assert main(flat) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vllm-cpp: error:") and message in err[0]


def test_missing_coefficients_and_profiles(tmp_path, capsys):
    cases = [
        ["plan", "--prompt-len", "100", "--budget", "64"],
        ["plan", "--a", "1e-7", "--prompt-len", "100", "--budget", "64"],
        ["plan", "--profile", str(tmp_path / "missing.json"), "--prompt-len", "100"],
        ["plan", "--a", "0", "--b", "0", "--c", "1", "--prompt-len", "100", "--budget", "64"],
    ]
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    cases.append(["plan", "--profile", str(garbage), "--prompt-len", "100"])
    nomodel = tmp_path / "nomodel.json"
    nomodel.write_text(json.dumps({"version": 1, "model": None}))
    cases.append(["plan", "--profile", str(nomodel), "--prompt-len", "100", "--budget", "64"])
    for argv in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("vllm-cpp: error:"), (argv, err)


def test_no_subcommand_and_help(capsys):
    assert main([]) == 2
    assert capsys.readouterr().err.startswith("vllm-cpp: error:")
    assert main(["plan", "--help"]) == 0
    assert "--prompt-len" in capsys.readouterr().out
