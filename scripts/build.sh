#!/usr/bin/env bash
# Set-up (Debian packages, tokenizer test data) and a Release build into build/release.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)"
