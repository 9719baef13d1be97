#!/usr/bin/env bash
# Runs on the GPU machine over a copy of the working tree with .devpack/ carried
# (tools/pack_device_bundle.sh): the CUDA test suite, compute-sanitizer on the kernel tests, and
# `kestrel bench --device cuda` on a random-init Qwen3-8B-shaped model. One call does it all, in
# order of importance, so what a short lease cuts off is the least needed:
#   1. the random model is written on the CPUs while the GPU runs the test suite and, beside it,
#      memcheck over the kernel tests (MEMCHECK_S seconds at most);
#   2. the benchmark with the committed defaults (prefill 2k; decode batch 1 and 64 at contexts
#      128 and 2k; the serving engine with async scheduling off and on);
#   3. decode with PDL off (context 128), and with the registers_db decode attention (64 x 2k);
#   4. racecheck over the kernel tests that use shared memory.
# At most 8 files come back from $OUT: suite.log (the GPU, each step's summary, timings),
# test_cuda.txt, memcheck.txt, racecheck.txt, bench.json, bench_pdl_off.json, bench_attn_db.json,
# bench.log (every benchmark's stderr).
#   tools/device_cuda_suite.sh [tests] [sanitize] [bench] [compare] [splits] [det] [serve] [hf]
#                              [gguf8]
# (default: tests sanitize bench compare). `serve` starts `kestrel serve` on the random model
# and runs `kestrel bench-serve` against it: SERVE_CONC closed-loop streams (default 256),
# SERVE_REQ measured requests after as many warm-up ones (default 256), SERVE_IN prompt and
# SERVE_OUT output tokens (default 1000 / 1000), once per entry of SERVE_KV (default "auto"; a
# KV dtype, or "dtype:tokens" to set the server's --max-batched-tokens too), SERVE_FLAGS added to the server's flags, SERVE_RAMP the clients' --ramp-up seconds
# (default 0), SERVE_WARMUP their --warmup requests (default: bench-serve's) (serve_<dtype>.json, serve_<dtype>.log, and the server's /metrics at the end in
# serve_<dtype>.metrics).
# PRESET=qwen3.5-27b (a tools/make_random_model.py preset) benchmarks another model; BENCH_FLAGS
# replaces the benchmark's flags, MODEL_SET adds generator flags (e.g. "--set num_hidden_layers=20"
# where the full model would not fit the machine's disk), RACECHECK_FILTER / MEMCHECK_FILTER
# narrow the sanitizer runs to some tests, TEST_GROUPS the test run; QUANT="fp8 mlx4" adds
# quantized copies of the model to the benchmark (bench_<format>.json; an entry "mlx4:128" sets the
# group size, bench_mlx4_g128.json), QUANT_GEMV_VARIANTS="r1_ks4_u4 ..." their one-row GEMV shapes,
# QUANT_ENVS="NAME=VALUE ..." the same with those switches (decode batch 1 each); KV_DTYPES="fp8
# int8" benchmarks the bf16 model with those KV caches (bench_kv_<dtype>.json).
set -uo pipefail
here=$(pwd)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[[ -d .devbin ]] || tar -xJf .devpack/devbin.tar.xz
# Test binaries locate data through the source directory they were configured in.
src_dir=${KESTREL_BUILD_SOURCE_DIR:-/work/main}
[[ ! -e "$src_dir" ]] && mkdir -p "$(dirname "$src_dir")" && ln -s "$here" "$src_dir"
# cuBLASLt comes from the machine's CUDA toolkit (or the Python wheels beside PyTorch).
cublas_dir=/usr/local/cuda/lib64
[[ -e $cublas_dir/libcublasLt.so.13 ]] || cublas_dir=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '*/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$here/.devbin/lib:$cublas_dir:${LD_LIBRARY_PATH:-}"
log() { echo "[+${SECONDS}s] $*" | tee -a "$OUT/suite.log"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv >> "$OUT/suite.log" 2>&1
STEPS=" ${*:-tests sanitize bench compare} "
has() { [[ $STEPS == *" $1 "* ]]; }
PRESET=${PRESET:-qwen3-8b}
model=/tmp/$PRESET-random
# Kernel tests (the model and engine tests would take minutes under the tools).
kernel_filter='-CudaModel.*:CudaEngine.*:*PrefillLongAtModelShapes*:GpuSamplingTest.MatchesCpuSamplerOnRandomRows:GpuSamplingTest.Timing'
smem_filter=${RACECHECK_FILTER:-'CudaMoe.*:CudaDeltaNet.*:CudaAddRmsNorm.*:CudaGatherRmsNorm.*:CudaAttention.Decode*:CudaAttention.MixedBatch:CudaLinear.*:Shapes/LinearShapeTest.*/n1000_k520:Shapes/LinearShapeTest.*/n17_k136:GpuSamplingTest.MatchesCpuSamplerOnEdgeCases'}
kernel_filter=${MEMCHECK_FILTER:-$kernel_filter}

pids=()
if has bench || has compare || has splits || has det || has serve || has hf; then
  if [[ ! -f $model/config.json ]]; then
    (t0=$SECONDS; python3 tools/make_random_model.py --preset "$PRESET" ${MODEL_SET:-} --out $model --tokenizer-dir models/kestrel-tiny \
       --no-verify > /tmp/make_model.txt 2>&1; echo "random $PRESET: exit $? in $((SECONDS - t0)) s" >> /tmp/make_model.txt) &
    model_pid=$!
  fi
fi
if has sanitize; then
  (timeout "${MEMCHECK_S:-60}" compute-sanitizer --tool memcheck --error-exitcode 9 .devbin/test_cuda \
     --gtest_color=no --gtest_filter="$kernel_filter" > "$OUT/memcheck.txt" 2>&1
   echo "memcheck exit $?" >> "$OUT/memcheck.txt") &
  pids+=($!)
fi
if has tests; then
  # Three processes, so that a test that aborts takes only its own group down.
  # TEST_GROUPS="filter1 filter2 ..." replaces the groups.
  groups=('-CudaModel.*:CudaEngine.*' 'CudaModel.*' 'CudaEngine.*')
  [[ -n ${TEST_GROUPS:-} ]] && read -r -a groups <<< "$TEST_GROUPS"
  for group in "${groups[@]}"; do
    echo "=== $group" >> "$OUT/test_cuda.txt"
    timeout "${TESTS_S:-120}" .devbin/test_cuda --gtest_color=no --gtest_filter="$group" >> "$OUT/test_cuda.txt" 2>&1
    log "test_cuda $group: exit $?"
  done
  grep -E '^\[  (PASSED|FAILED) |Failure$|^\[ info|^batch inv|^long context|timing \]' "$OUT/test_cuda.txt" | head -60 | tee -a "$OUT/suite.log"
fi
for p in "${pids[@]}"; do wait "$p"; done
has sanitize && log "memcheck: $(tail -1 "$OUT/memcheck.txt"); $(grep 'ERROR SUMMARY' "$OUT/memcheck.txt" | tail -1); $(grep -c '^\[       OK' "$OUT/memcheck.txt") tests ok"
if [[ -n ${model_pid:-} ]]; then
  wait "$model_pid"
  cat /tmp/make_model.txt | tail -2 | tee -a "$OUT/suite.log"
fi

bench() {  # bench <out-name> [env...] -- [flags...]
  local name=$1; shift
  local envs=()
  while [[ $# -gt 0 && $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  echo "=== $name ${envs[*]} $*" >> "$OUT/bench.log"
  env "${envs[@]}" timeout 240 .devbin/kestrel bench --device cuda --model $model "$@" \
    > "$OUT/$name.json" 2>> "$OUT/bench.log"
  log "$name exit $?"
  grep -E '^(prefill|decode|engine)' "$OUT/bench.log" | tail -n +$((${bench_lines:-0} + 1)) | tee -a "$OUT/suite.log"
  bench_lines=$(grep -cE '^(prefill|decode|engine)' "$OUT/bench.log")
}
if has bench; then
  # shellcheck disable=SC2086
  bench bench -- ${BENCH_FLAGS:---prefill 2048 --decode-context 128,2048 --batch 1,64 --engine-batch 1,64}
fi
# QUANT="fp8 mlx4": the same model with random codes in those formats
# (tools/make_random_quantized.py), benchmarked with the same flags right after bf16.
for entry in ${QUANT:-}; do
  has bench || break
  # An entry is a format, or "mlx4:128" with make_random_quantized's --group-size.
  IFS=: read -r fmt group <<< "$entry"
  q=${entry/:/_g}
  t0=$SECONDS
  python3 tools/make_random_quantized.py --model $model --out $model-$q --format $fmt \
    ${group:+--group-size $group} > /tmp/make_$q.txt 2>&1
  log "random $q: exit $? in $((SECONDS - t0)) s"
  bf16_model=$model
  model=$model-$q
  # shellcheck disable=SC2086
  bench bench_$q -- ${BENCH_FLAGS:---prefill 2048 --decode-context 128,2048 --batch 1,64 --engine-batch 1,64}
  # Decode batch 1 under tuning switches, "name:NAME=VALUE" each: the one-row GEMV shapes
  # (quant_linear.cu), then QUANT_ENVS.
  switches=()
  for v in ${QUANT_GEMV_VARIANTS:-}; do switches+=("$v:KESTREL_QUANT_GEMV=$v"); done
  for e in ${QUANT_ENVS:-}; do switches+=("${e//=/_}:$e"); done
  for sw in "${switches[@]}"; do
    bench "bench_${q}_${sw%%:*}" "${sw#*:}" -- --prefill 128 --decode-context 128 --batch 1 \
      --engine-batch 0 --no-profile
  done
  if [[ $fmt == fp8 ]]; then  # prefill as W8A8 on the FP8 tensor cores
    bench bench_fp8_w8a8 -- --fp8-activations --prefill 2048,8192 --decode-context 128 --batch 1,64 \
      --engine-batch 0 --no-profile
  fi
  model=$bf16_model
  rm -rf "$model-$q"
done
# gguf8: GGUF files of the 8-bit device formats (GGUF8_TYPES, default "q8_0 q6_k", written by
# tools/make_gguf.py from a random GGUF8_PRESET, default qwen3-0.6b), decode at batch 1-8 through
# the CUDA-core 8-bit GEMV and with KESTREL_AFFINE8_MMA=1 through the tensor-core one
# (bench_gguf8_<type>.json, bench_gguf8_<type>_mma.json).
if has gguf8; then
  g8_dir=/tmp/${GGUF8_PRESET:-qwen3-0.6b}-random
  if [[ ! -f $g8_dir/config.json ]]; then
    python3 tools/make_random_model.py --preset "${GGUF8_PRESET:-qwen3-0.6b}" --out $g8_dir \
      --tokenizer-dir models/kestrel-tiny --no-verify > /tmp/make_gguf8.txt 2>&1
  fi
  for ty in ${GGUF8_TYPES:-q8_0 q6_k}; do
    t0=$SECONDS
    python3 tools/make_gguf.py --model $g8_dir --type "$ty" --pre qwen2 --out /tmp/gguf8_$ty.gguf \
      >> /tmp/make_gguf8.txt 2>&1
    log "gguf8 $ty: exit $? in $((SECONDS - t0)) s"
    bf16_model=$model
    model=/tmp/gguf8_$ty.gguf
    for mma in "" _mma; do
      bench "bench_gguf8_$ty$mma" KESTREL_AFFINE8_MMA=${mma:+1} -- --prefill 512 \
        --decode-context 128 --batch 1,2,4,8 --engine-batch 0 --no-profile
    done
    model=$bf16_model
  done
fi
# KV_DTYPES="fp8 int8": the bf16 model with those KV caches (--kv-cache-dtype), same flags as the
# bf16-cache run above (bench_kv_<dtype>.json).
for d in ${KV_DTYPES:-}; do
  has bench || break
  # shellcheck disable=SC2086
  bench bench_kv_$d -- --kv-cache-dtype $d ${BENCH_FLAGS:---prefill 2048 --decode-context 128,2048 --batch 1,64 --engine-batch 1,64}
done
# splits: decode with the tensor-core attention's splits per block forced
# (KESTREL_DECODE_SPLITS_PER_BLOCK), one benchmark per SPLITS entry "n:kv-dtype:batch:context"
# (default "1:bf16:64:8192", then 1:<d>:64:8192 for each of KV_DTYPES); bench_splits_<entry>.json.
if has splits; then
  entries=${SPLITS:-"1:bf16:64:8192 $(for d in ${KV_DTYPES:-}; do printf '1:%s:64:8192 ' "$d"; done)"}
  for e in $entries; do
    IFS=: read -r n d b c <<< "$e"
    bench "bench_splits_${n}_${d}_${b}x$c" KESTREL_DECODE_SPLITS_PER_BLOCK=$n -- --kv-cache-dtype $d \
      --prefill 128 --decode-context $c --batch $b --engine-batch 0 --no-profile
  done
fi
# det: the cost of --deterministic (batch-invariant kernels): prefill 2k, decode 1 and 64 x 2k.
if has det; then
  bench bench_det -- --deterministic --prefill 2048 --decode-context 2048 --batch 1,64 \
    --engine-batch 0 --no-profile
fi
if has compare; then
  # Short contexts only: filling 64 sequences' K/V at 2k copies 19 GB (about 9 s).
  bench bench_pdl_off KESTREL_PDL=0 -- --prefill 2048 --decode-context 128 --batch 1,64 \
    --engine-batch 0 --no-profile
  bench bench_attn_db KESTREL_DECODE_ATTENTION_VARIANT=registers_db -- --prefill 128 \
    --decode-context 2048 --batch 64 --engine-batch 0 --no-profile
fi
if has serve; then
  port=8377
  for entry in ${SERVE_KV:-auto}; do
    # An entry is a KV dtype, or "dtype:tokens" with the server's --max-batched-tokens.
    IFS=: read -r kv tokens <<< "$entry"
    d=${entry/:/_}
    # shellcheck disable=SC2086
    .devbin/kestrel serve --device cuda --model $model --port $port --max-num-seqs "${SERVE_SEQS:-256}" \
      --kv-cache-dtype "$kv" ${tokens:+--max-batched-tokens $tokens} ${SERVE_FLAGS:-} \
      > "$OUT/serve_$d.log" 2>&1 &
    server=$!
    for _ in $(seq 240); do
      python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health')" \
        2> /dev/null && break
      sleep 0.5
    done
    log "serve $d up"
    timeout "${SERVE_S:-300}" .devbin/kestrel bench-serve --url "http://127.0.0.1:$port" \
      --concurrency "${SERVE_CONC:-256}" --requests-per-level "${SERVE_REQ:-256}" \
      --input-tokens "${SERVE_IN:-1000}" --output-tokens "${SERVE_OUT:-1000}" \
      --ramp-up "${SERVE_RAMP:-0}" ${SERVE_WARMUP:+--warmup $SERVE_WARMUP} \
      --json "$OUT/serve_$d.json" 2>> "$OUT/bench.log"
    log "bench-serve $d exit $?: $(python3 -c "
import json, sys
r = json.load(open('$OUT/serve_$d.json'))['levels'][0]['servers'][0]['runs'][0]
f = lambda k: {q: round(r[k][q], 1) for q in ('p50', 'p90', 'p99')}
print('out tok/s', round(r['output_tok_per_s']), 'steady', round(r['steady_output_tok_per_s']),
      'ttft', f('ttft_ms'), 'itl', f('itl_ms'), 'text gaps', f('text_gap_ms'),
      'tpot', f('tpot_ms'), 'completed', r['completed'], 'failed', r['failed'],
      '429s', r['rate_limited'])" 2>&1 | tail -3)"
    # The engine's step times (decode-only steps, steps with prompt chunks) over the whole run.
    python3 -c "
import re, urllib.request
text = urllib.request.urlopen('http://127.0.0.1:$port/metrics').read().decode()
open('$OUT/serve_$d.metrics', 'w').write(text)
v = {m[0]: float(m[1]) for m in re.findall(r'^(\S+) (\S+)$', text, re.M)}
for kind in ('decode', 'mixed'):
    n = v.get('kestrel_%s_step_seconds_count' % kind, 0)
    print(kind, 'steps', int(n), 'mean ms', round(1e3 * v.get('kestrel_%s_step_seconds_sum' % kind, 0) / max(n, 1), 2))
print('tokens per mixed step', round(v.get('kestrel_mixed_step_tokens_total', 0) / max(v.get('kestrel_mixed_step_seconds_count', 0), 1)))
" 2>&1 | tee -a "$OUT/suite.log"
    kill -INT $server; wait $server
  done
fi
if has sanitize; then
  timeout "${RACECHECK_S:-120}" compute-sanitizer --tool racecheck --error-exitcode 9 .devbin/test_cuda \
    --gtest_color=no --gtest_filter="$smem_filter" > "$OUT/racecheck.txt" 2>&1
  log "racecheck exit $?: $(grep 'ERROR SUMMARY\|RACECHECK SUMMARY' "$OUT/racecheck.txt" | tail -1); $(grep -c '^\[       OK' "$OUT/racecheck.txt") tests ok"
fi
if has hf; then
  timeout 300 python3 tools/hf_generate_bench.py --model $model > "$OUT/hf_bench.json" 2>> "$OUT/bench.log"
  log "hf exit $?"
fi
log "done"
