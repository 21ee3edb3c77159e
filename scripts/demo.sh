#!/usr/bin/env bash
# The main job (README): a real vLLM CPU engine, PP=2, CPP on; prints the startup profiling
# report and the chunk plan of a long prompt, then compares with fixed chunks.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=$("$here/scripts/setup_env.sh" --with-vllm | tail -n 1)
exec "$venv/bin/vllm-cpp" demo "$@"
