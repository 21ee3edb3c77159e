#!/usr/bin/env bash
# The test command (README, .ci/run): set up the venv, lint, then every test.
# Extra arguments go to pytest, e.g. `scripts/test.sh tests/unit -q`.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=$("$here/scripts/setup_env.sh" --with-vllm | tail -n 1)
cd "$here"
"$venv/bin/ruff" check vllm_ascend_cpp tests tools benchmarks
"$venv/bin/mkdocs" build --strict --quiet -f "$here/mkdocs.yml" -d "${TMPDIR:-/tmp}/vllm-ascend-cpp-site"
if [ "$#" -gt 0 ]; then
  exec "$venv/bin/python" -m pytest "$@"
fi
"$venv/bin/python" -m pytest tests -q -p no:cacheprovider
