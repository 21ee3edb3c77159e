"""The CPU quick start of docs/quickstart.md, copied from the page and run on this machine.

The page's CPU section has three fenced blocks whose first line is `# cpu-quickstart k/3`:
write the tiny model, start the OpenAI server with CPP on, send one completion. This test
takes them from the page as they are, changes only the model directory (a temporary one) and
the port (a free one), and runs each block with bash. The server block runs under
`tests/serving.py:ServerProcess` (shared with the serve tests): wait for /health, then stop by PID
and check that no process of the server's tree is left.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.serving import ServerProcess, ServerSpec, free_port

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "quickstart.md"
MARK = re.compile(r"^# cpu-quickstart (\d)/(\d)")
PAGE_MODEL_DIR = "/tmp/cpp-tiny-llama"
PAGE_PORT = "8000"
# The 2-core test machine is often shared; the first start profiles (about a minute when quiet).
START_TIMEOUT_S = 600


def quickstart_blocks(page: Path = PAGE) -> list[str]:
    """The `# cpu-quickstart k/n` blocks of the page, in order; fails if any is missing."""
    text = page.read_text(encoding="utf-8")
    found: dict[int, str] = {}
    total = None
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.M | re.S):
        m = MARK.match(block)
        if m:
            found[int(m.group(1))] = block
            total = int(m.group(2))
    assert total is not None, f"{page}: no '# cpu-quickstart k/n' blocks"
    assert sorted(found) == list(range(1, total + 1)), f"{page}: blocks {sorted(found)} of {total}"
    return [found[k] for k in range(1, total + 1)]


def _adapt(block: str, model_dir: Path, port: int) -> str:
    """The block with the temporary model directory and the free port put in."""
    return (block.replace(PAGE_MODEL_DIR, str(model_dir))
            .replace(f"--port {PAGE_PORT}", f"--port {port}")
            .replace(f"localhost:{PAGE_PORT}", f"localhost:{port}"))


def _bash(block: str) -> list[str]:
    # A single command as the whole script: bash execs it, so the PID is the server's own.
    return ["bash", "-euo", "pipefail", "-c", block]


def _env(home: Path) -> dict[str, str]:
    # The page says `python` and `vllm-cpp`: the interpreter running the tests is the one
    # with vLLM and the plugin. A private HOME keeps the default profile cache out of the real
    # one; nothing else is added, so the page's own environment variables are what the server
    # gets.
    bindir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
            "HOME": str(home), "PYTHONUNBUFFERED": "1"}


def test_page_has_the_three_cpu_blocks() -> None:
    model, server, client = quickstart_blocks()
    assert "vllm-cpp serve-model" in model and PAGE_MODEL_DIR in model
    assert "python -m vllm.entrypoints.openai.api_server" in server
    assert '"cpp_config": {"enabled": true}' in server
    assert "--pipeline-parallel-size 2" in server and f"--port {PAGE_PORT}" in server
    assert PAGE_MODEL_DIR in server
    assert "/v1/completions" in client and f"localhost:{PAGE_PORT}/" in client


def test_cpu_quickstart_runs(tmp_path: Path) -> None:
    model_block, server_block, client_block = quickstart_blocks()
    port = free_port()
    model_dir = tmp_path / "cpp-tiny-llama"
    home = tmp_path / "home"
    home.mkdir()
    env = _env(home)

    made = subprocess.run(_bash(_adapt(model_block, model_dir, port)), env=env, timeout=120,
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    assert (model_dir / "config.json").is_file() and (model_dir / "tokenizer.json").is_file()

    server = ServerProcess(ServerSpec(model_dir=str(model_dir), port=port), tmp_path,
                           name="quickstart")
    server.cmd = _bash(_adapt(server_block, model_dir, port))
    server.env = env
    server.start()
    try:
        server.wait_healthy(START_TIMEOUT_S)
        done = subprocess.run(_bash(_adapt(client_block, model_dir, port)), env=env,
                              timeout=120, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        reply = json.loads(done.stdout)
        assert reply["model"] == "tiny"
        assert reply["usage"]["completion_tokens"] == 8
        assert reply["choices"][0]["text"].strip()
    finally:
        stopped = server.stop()

    log = server.log_text()
    # CPP really ran: the sweep's report (a fresh HOME has no cached profile), no fallback.
    assert "[CPP] startup profiling report (source: sweep" in log, server.log_tail()
    assert "[CPP] dynamic chunking is off" not in log
    assert stopped.leftovers == [], f"processes left after the stop: {stopped}"
