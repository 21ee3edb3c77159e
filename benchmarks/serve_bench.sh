#!/usr/bin/env bash
# Serving benchmark, fixed chunks vs CPP, with vLLM's own `vllm bench serve` client.
# Everything is in benchmarks/serve_bench.py (its docstring says how the baseline is kept fair);
# this only finds the venv. Extra arguments go to serve_bench.py, e.g.
#   benchmarks/serve_bench.sh --engine-bench benchmarks/results/engine_bench_one_engine.json
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=$("$here/scripts/setup_env.sh" --with-vllm | tail -n 1)
exec "$venv/bin/python" "$here/benchmarks/serve_bench.py" "$@"
