"""Run one real vLLM engine job in its own process and write the results as JSON.

Usage: python engine_job.py SPEC.json RESULT.json

Each job is a fresh process, so engines never overlap on the 2 cores, nothing leaks between
tests, and vLLM's spawn rules are met (this file has the `__main__` guard). SPEC keys:
engine (EngineSpec fields), batches (a list of {"lengths", "seed", "max_tokens",
"prompt_logprobs", "concurrent"}), env (extra environment).
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> int:
    spec = json.load(open(sys.argv[1], encoding="utf-8"))
    os.environ.update({k: str(v) for k, v in spec.get("env", {}).items()})
    from vllm_ascend_cpp import harness

    engine = harness.EngineSpec(**spec["engine"])
    t0 = time.perf_counter()
    result: dict = {"batches": []}
    try:
        llm = harness.build_llm(engine)
    except Exception as e:  # the test asserts on the message
        result["startup_error"] = f"{type(e).__name__}: {e}"
        harness.dump(sys.argv[2], result)
        return 0
    result["startup_s"] = time.perf_counter() - t0
    for batch in spec.get("batches", []):
        prompts = [
            harness.token_prompt(n, seed=batch.get("seed", 0) * 100003 + i)
            for i, n in enumerate(batch["lengths"])
        ]
        if batch.get("concurrent", True):
            outs, wall = harness.timed_generate(
                llm, prompts, max_tokens=batch.get("max_tokens", 8),
                prompt_logprobs=batch.get("prompt_logprobs"),
            )
        else:
            outs, wall = [], 0.0
            for p in prompts:
                o, w = harness.timed_generate(
                    llm, [p], max_tokens=batch.get("max_tokens", 8),
                    prompt_logprobs=batch.get("prompt_logprobs"),
                )
                outs += o
                wall += w
        result["batches"].append({"outputs": outs, "wall_s": wall})
    harness.shutdown(llm)
    harness.dump(sys.argv[2], result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
