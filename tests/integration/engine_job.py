"""Run one real vLLM engine job in its own process and write the results as JSON.

Usage: python engine_job.py SPEC.json RESULT.json

Each job is a fresh process, so engines never overlap on the 2 cores, nothing leaks between
tests, and vLLM's spawn rules are met (this file has the `__main__` guard). SPEC keys:

- engine: EngineSpec fields (extra engine arguments go in engine.extra, e.g.
  {"num_gpu_blocks_override": 600} for a small KV cache).
- env: extra environment (e.g. VLLM_CPP_TEST_FAULT, VLLM_CPU_KVCACHE_SPACE).
- driver: "sync" (default, `LLM.generate`) or "async" (vLLM's AsyncLLM, the serving engine:
  per-request arrival times and aborts).
- batches: a list of {"lengths", "seed", "max_tokens" (an int or one per request),
  "prompt_logprobs", "concurrent", "shared_prefix" (the first N tokens are the same in every
  prompt of the batch, and of every batch with the same "prefix_seed": prefix-cache hits),
  "env" (sync driver: environment set for this batch only; it reaches the scheduler when the
  engine core runs in this process, VLLM_ENABLE_V1_MULTIPROCESSING=0)}. A line
  "=== engine_job batch K" goes to the log before batch K (sync driver).
  With driver "async" also "arrivals" (seconds after the batch starts, one per request) and
  "abort_mid_prefill" (indices of requests to abort once the trace shows their first prefill
  chunk; needs cpp_config.trace_file).
- bench_policy (driver "sync", in-process engine core): {"mode", "budget"} passed to
  CppRuntime.set_bench_policy before the batch (the benchmark-only policy switch).
- bench_clients (driver "sync", in-process engine core): serve the batch with the engine
  benchmark's step-driven clients instead of `LLM.generate`, {"k": N} closed loop or
  {"arrivals": [...]} open loop (benchmarks/bench_engine.py); the batch result is their
  figures under "bench".
- rss_every_s (driver "async"): also sample resident memory every so many seconds.
- tracemalloc_from (driver "sync", in-process engine core): the index of the first batch
  whose memory counts; `tracemalloc` in the result holds the bytes that the plugin's own
  code allocated from then on and still holds at the end, and the scheduler steps taken
  (leak_check.py).
- runs (instead of engine/batches): several engines one after another in this process, each
  {"label", "engine", "batches", "env"} (see run_many).

Each output: prompt_len, token_ids, finish_reason, num_cached_tokens (prefix-cache hits),
prompt_logprobs when asked; with driver "async" also the request id and submit / first token /
finish wall times (time.time()). `rss` holds resident memory of the engine-core and worker
processes at startup and after every batch.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any


def dump(path: str, data: Any) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2)


def _prompts(batch: dict) -> list[list[int]]:
    from vllm_ascend_cpp.testing import engine as harness

    seed = batch.get("seed", 0) * 100003
    prefix_len = int(batch.get("shared_prefix", 0))
    prefix_seed = batch.get("prefix_seed", batch.get("seed", 0)) * 100003 - 1
    prefix = harness.token_prompt(prefix_len, seed=prefix_seed) if prefix_len else []
    out = []
    for i, n in enumerate(batch["lengths"]):
        if prefix_len:
            assert n > prefix_len, "shared_prefix must be shorter than every prompt"
            out.append(prefix + harness.token_prompt(n - prefix_len, seed=seed + i))
        else:
            out.append(harness.token_prompt(n, seed=seed + i))
    return out


def _max_tokens(batch: dict, n: int) -> list[int]:
    value = batch.get("max_tokens", 8)
    if isinstance(value, list):
        assert len(value) == n, "max_tokens list must have one entry per prompt"
        return [int(v) for v in value]
    return [int(value)] * n


def _params(max_tokens: int, prompt_logprobs: int | None) -> Any:
    from vllm import SamplingParams

    return SamplingParams(
        max_tokens=max_tokens, temperature=0.0, detokenize=False, ignore_eos=True,
        prompt_logprobs=prompt_logprobs,
    )


def _record(o: Any, prompt_logprobs: int | None) -> dict:
    item: dict[str, Any] = {
        "prompt_len": len(o.prompt_token_ids),
        "token_ids": list(o.outputs[0].token_ids) if o.outputs else [],
        "finish_reason": (o.outputs[0].finish_reason if o.outputs else None),
        "num_cached_tokens": getattr(o, "num_cached_tokens", None),
    }
    if prompt_logprobs is not None and o.prompt_logprobs is not None:
        # The logprob of each actual prompt token (the first position has none).
        item["prompt_logprobs"] = [
            None if d is None else float(d[t].logprob)
            for t, d in zip(o.prompt_token_ids, o.prompt_logprobs)
        ]
    return item


def rss_snapshot(label: str) -> dict:
    """Resident memory of this job's engine-core process and of its workers, in MiB."""
    import psutil

    core = workers = 0.0
    n_workers = 0
    for child in psutil.Process().children(recursive=True):
        try:
            name = child.name() + " " + " ".join(child.cmdline()[:1])
            rss = child.memory_info().rss / 2**20
            parent = child.parent()
            parent_name = parent.name() if parent is not None else ""
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if "EngineCore" in name:
            core += rss
        elif "EngineCore" in parent_name:
            workers += rss
            n_workers += 1
    return {"label": label, "engine_core_mib": round(core, 1),
            "workers_mib": round(workers, 1), "n_workers": n_workers,
            "total_mib": round(core + workers, 1), "time": time.time()}


def _sync_batch(llm: Any, batch: dict) -> dict:
    from vllm_ascend_cpp import faults

    saved = dict(os.environ)
    os.environ.update({k: str(v) for k, v in batch.get("env", {}).items()})
    faults.active.cache_clear()  # read once per process, and this process's env changed
    try:
        return _sync_batch_in_env(llm, batch)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        faults.active.cache_clear()


def _sync_batch_in_env(llm: Any, batch: dict) -> dict:
    from vllm.inputs import TokensPrompt

    prompts = _prompts(batch)
    max_tokens = _max_tokens(batch, len(prompts))
    lp = batch.get("prompt_logprobs")
    policy = batch.get("bench_policy")
    if policy is not None:
        from vllm_ascend_cpp import compat

        scheduler = compat.inproc_scheduler(llm)
        assert scheduler is not None, "bench_policy needs VLLM_ENABLE_V1_MULTIPROCESSING=0"
        scheduler.cpp.set_bench_policy(policy.get("mode"), policy.get("budget"))
    clients = batch.get("bench_clients")
    if clients is not None:
        return {"bench": _bench_clients(llm, prompts, max_tokens[0], clients)}
    groups = ([list(range(len(prompts)))] if batch.get("concurrent", True)
              else [[i] for i in range(len(prompts))])
    outs: list[dict] = []
    start = time.perf_counter()
    for group in groups:
        results = llm.generate(
            [TokensPrompt(prompt_token_ids=prompts[i]) for i in group],
            [_params(max_tokens[i], lp) for i in group], use_tqdm=False,
        )
        outs += [_record(o, lp) for o in results]
    return {"outputs": outs, "wall_s": time.perf_counter() - start}


def _bench_clients(llm: Any, prompts: list[list[int]], out_len: int, clients: dict) -> dict:
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo, for benchmarks/
    from benchmarks import bench_engine

    if "arrivals" in clients:
        return bench_engine.replay_arrivals(llm, prompts, clients["arrivals"], out_len)
    return bench_engine.closed_loop_steps(llm, prompts, clients["k"], out_len)


def run_sync(spec: dict, result: dict, result_path: str) -> int:
    from vllm_ascend_cpp.testing import engine as harness

    engine = harness.EngineSpec(**spec["engine"])
    t0 = time.perf_counter()
    try:
        llm = harness.build_llm(engine)
    except Exception as e:  # the test asserts on the message
        result["startup_error"] = f"{type(e).__name__}: {e}"
        dump(result_path, result)
        return 0
    result["startup_s"] = time.perf_counter() - t0
    result["rss"] = [rss_snapshot("start")]
    growth = _package_growth(llm) if "tracemalloc_from" in spec else None
    for i, batch in enumerate(spec.get("batches", [])):
        print(f"{BATCH_MARKER} {i}", flush=True)
        if growth is not None and i == spec["tracemalloc_from"]:
            growth.start()
        result["batches"].append(_sync_batch(llm, batch))
        result["rss"].append(rss_snapshot(f"batch{i}"))
    if growth is not None:
        result["tracemalloc"] = growth.stop()
    harness.shutdown(llm)
    dump(result_path, result)
    return 0


def _package_growth(llm: Any) -> Any:
    from leak_check import PackageGrowth  # a sibling module: this file runs as a script

    from vllm_ascend_cpp import compat

    scheduler = compat.inproc_scheduler(llm)
    assert scheduler is not None, "tracemalloc_from needs VLLM_ENABLE_V1_MULTIPROCESSING=0"
    return PackageGrowth(lambda: scheduler.cpp._step)


# ----- async driver: arrival times and aborts, through vLLM's serving engine ------------------


def _trace_has_chunk(trace_path: str, rid: str) -> bool:
    try:
        with open(trace_path, encoding="utf-8") as fh:
            for line in fh:
                if f'"id": "{rid}-' in line:
                    return True
    except OSError:
        pass
    return False


async def _one_request(engine: Any, rid: str, prompt: list[int], params: Any, delay: float,
                       abort_when_traced: str | None, lp: int | None) -> dict:
    from vllm.inputs import TokensPrompt

    await asyncio.sleep(max(0.0, delay))
    submit = time.time()
    first: float | None = None
    last: Any = None
    aborted_at: float | None = None

    async def watch() -> None:
        nonlocal aborted_at
        assert abort_when_traced is not None
        while not _trace_has_chunk(abort_when_traced, rid):
            await asyncio.sleep(0.005)
        aborted_at = time.time()
        await engine.abort(rid)

    watcher = asyncio.create_task(watch()) if abort_when_traced else None
    async for out in engine.generate(TokensPrompt(prompt_token_ids=prompt), params, rid):
        if first is None and out.outputs and out.outputs[0].token_ids:
            first = time.time()
        last = out
    finish = time.time()
    if watcher is not None and not watcher.done():
        watcher.cancel()
    item = _record(last, lp) if last is not None else {"prompt_len": len(prompt),
                                                         "token_ids": []}
    item["prompt_len"] = len(prompt)
    item.update({"request_id": rid, "submit": submit, "first_token": first, "finish": finish,
                 "aborted_at": aborted_at})
    return item


async def _async_main(spec: dict, result: dict, result_path: str) -> int:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from vllm_ascend_cpp.testing import engine as harness

    engine_spec = harness.EngineSpec(**spec["engine"])
    t0 = time.perf_counter()
    try:
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**harness.engine_kwargs(engine_spec)))
    except Exception as e:
        result["startup_error"] = f"{type(e).__name__}: {e}"
        dump(result_path, result)
        return 0
    cpp = engine_spec.cpp_config or {}
    if not cpp.get("enabled"):
        # The warm-up build_llm does for CPP-off engines (vllm_ascend_cpp/testing/engine.py).
        await engine.collective_rpc("execute_dummy_batch")
    result["startup_s"] = time.perf_counter() - t0
    result["rss"] = [rss_snapshot("start")]
    trace_path = cpp.get("trace_file")
    sampler = None
    if spec.get("rss_every_s"):
        result["rss_samples"] = []

        async def sample() -> None:
            while True:
                await asyncio.sleep(float(spec["rss_every_s"]))
                result["rss_samples"].append(rss_snapshot("sample"))

        sampler = asyncio.create_task(sample())
    try:
        for b, batch in enumerate(spec.get("batches", [])):
            prompts = _prompts(batch)
            max_tokens = _max_tokens(batch, len(prompts))
            lp = batch.get("prompt_logprobs")
            arrivals = batch.get("arrivals") or [0.0] * len(prompts)
            abort = set(batch.get("abort_mid_prefill", []))
            if abort and not trace_path:
                raise ValueError("abort_mid_prefill needs cpp_config.trace_file")
            start = time.time()
            tasks = [
                _one_request(engine, f"b{b}r{i}", p, _params(max_tokens[i], lp),
                             start + float(arrivals[i]) - time.time(),
                             trace_path if i in abort else None, lp)
                for i, p in enumerate(prompts)
            ]
            outs = await asyncio.gather(*tasks)
            result["batches"].append({"outputs": list(outs), "start": start,
                                      "wall_s": time.time() - start})
            result["rss"].append(rss_snapshot(f"batch{b}"))
    finally:
        if sampler is not None:
            sampler.cancel()
        engine.shutdown()
    dump(result_path, result)
    return 0


def run_many(spec: dict, result_path: str) -> int:
    """Several engines one after another in this process (sync driver), each with its own env.

    Saves the front end's start-up (and, with VLLM_ENABLE_V1_MULTIPROCESSING=0, the engine
    core's) for every engine after the first. Marker lines split the shared log per engine.
    """
    from vllm_ascend_cpp import faults

    results = []
    base_env = dict(os.environ)
    for k, run in enumerate(spec["runs"]):
        os.environ.clear()
        os.environ.update(base_env)
        os.environ.update({key: str(v) for key, v in run.get("env", {}).items()})
        faults.active.cache_clear()  # read once per process, and this process's env changed
        print(f"{RUN_MARKER} begin {k}", flush=True)
        sub: dict = {"label": run.get("label", str(k)), "batches": []}
        part = f"{result_path}.run{k}"
        run_sync({"engine": run["engine"], "batches": run.get("batches", [])}, sub, part)
        results.append(json.load(open(part, encoding="utf-8")))
        print(f"{RUN_MARKER} end {k}", flush=True)
    dump(result_path, {"runs": results})
    return 0


RUN_MARKER = "=== engine_job run"
BATCH_MARKER = "=== engine_job batch"


def main() -> int:
    spec = json.load(open(sys.argv[1], encoding="utf-8"))
    os.environ.update({k: str(v) for k, v in spec.get("env", {}).items()})
    if "runs" in spec:
        return run_many(spec, sys.argv[2])
    result: dict = {"batches": []}
    if spec.get("driver", "sync") == "async":
        return asyncio.run(_async_main(spec, result, sys.argv[2]))
    return run_sync(spec, result, sys.argv[2])


if __name__ == "__main__":
    raise SystemExit(main())
