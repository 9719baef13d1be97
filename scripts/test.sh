#!/usr/bin/env bash
# Everything the tests need, from a clean clone: set-up, build, then every ctest suite.
# CUDA tests carry the label `cuda` and skip themselves without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --preset release -j "$(nproc)" --timeout 900 "$@"
