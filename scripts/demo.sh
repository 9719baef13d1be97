#!/usr/bin/env bash
# The main job from a clean clone: set-up, build, then generate with the embedded model
# (models/kestrel-tiny). Extra arguments go to `kestrel generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
if [[ $# -eq 0 ]]; then
  set -- --prompt 'def fibonacci(n):' --max-tokens 96 --temperature 0
fi
exec ./build/release/kestrel generate "$@"
