#!/usr/bin/env bash
# Load benchmark of `kestrel serve` (builds nothing). Starts the server on a free port, runs
# benches/load/load.mjs (streaming clients at several concurrencies + the HTTP overhead against
# in-process `kestrel generate` at batch 1), prints its JSON on stdout, stops the server (SIGTERM).
#
#   benches/load/run.sh --binary build/release/kestrel --model models/kestrel-tiny \
#       [--concurrency 1,4,16] [--requests-per-client 4] [--max-tokens 128] [--seed 1234]
#       [--overhead-tokens 512] [--overhead-runs 9] [--threads N] [-- extra `kestrel serve` flags]
#
# The server's log goes to stderr. Exit status: the benchmark's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

binary="" model="" threads=""
load_args=()
serve_args=()
while (($#)); do
  case "$1" in
    --binary) binary=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --threads) threads=$2; load_args+=(--threads "$2"); shift 2 ;;
    --concurrency|--requests-per-client|--max-tokens|--seed|--overhead-tokens|--overhead-runs)
      load_args+=("$1" "$2"); shift 2 ;;
    --) shift; serve_args=("$@"); break ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown flag $1" >&2; exit 2 ;;
  esac
done
[[ -x "$binary" ]] || { echo "run.sh: --binary must name the built kestrel (got '$binary')" >&2; exit 2; }
[[ -d "$model" ]] || { echo "run.sh: --model must name a model directory (got '$model')" >&2; exit 2; }
binary=$(realpath "$binary")
model=$(realpath "$model")

port=$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
log=$(mktemp /tmp/kestrel-load-XXXXXX.log)
[[ -n "$threads" ]] && serve_args=(--threads "$threads" "${serve_args[@]}")
"$binary" serve --model "$model" --host 127.0.0.1 --port "$port" "${serve_args[@]}" >"$log" 2>&1 &
pid=$!
stop_server() {
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
  cat "$log" >&2
  rm -f "$log"
}
trap stop_server EXIT

for _ in $(seq 600); do
  if grep -q "http://.*/v1" "$log" 2>/dev/null && curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then break; fi
  kill -0 "$pid" 2>/dev/null || { echo "run.sh: kestrel serve exited early" >&2; exit 1; }
  sleep 0.1
done
curl -sf "http://127.0.0.1:$port/health" >/dev/null || { echo "run.sh: kestrel serve not ready" >&2; exit 1; }

node "$here/load.mjs" --url "http://127.0.0.1:$port" --binary "$binary" --model "$model" \
  --server-pid "$pid" "${load_args[@]}"
