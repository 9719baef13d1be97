#!/usr/bin/env bash
# Runs on the GPU machine (torch, transformers, tokenizers; no internet): produces every golden
# file the CPU tests compare against, packed into $OUT/goldens.tar.gz.
#   tokenizer ids   tests/data/tokenizer/golden_{qwen3,llama3}.jsonl   (tools/golden_tokenizer.py)
#   chat renders    tests/data/chat/golden_{qwen3,llama3}.jsonl        (tools/golden_chat.py)
#   tiny models     tests/data/models/*/                               (tools/make_fixtures.py)
# Needs tests/data/npm (scripts/setup.sh) carried along.
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cd "$(dirname "$0")/.."
stage=$(mktemp -d)
mkdir -p "$stage/tests/data/tokenizer" "$stage/tests/data/chat" "$stage/tests/data/models"
python3 -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)'
status=0
for name in qwen3 llama3; do
  python3 tools/golden_tokenizer.py --tokenizer-dir "tests/data/npm/$name" --name "$name" \
    --corpus tests/data/tokenizer/corpus.jsonl \
    --out "$stage/tests/data/tokenizer/golden_$name.jsonl" || status=1
  python3 tools/golden_tokenizer.py --tokenizer-dir "tests/data/npm/$name" --name "$name" \
    --corpus tests/data/tokenizer/corpus.jsonl --bench \
    --out "$stage/tests/data/tokenizer/hf_bench_$name.json" || status=1
  python3 tools/golden_chat.py --tokenizer-dir "tests/data/npm/$name" --name "$name" \
    --cases tests/data/chat/cases.jsonl --out "$stage/tests/data/chat/golden_$name.jsonl" || status=1
done
python3 tools/make_fixtures.py --out "$stage/tests/data/models" || status=1
tar czf "${OUT:-/tmp}/goldens.tar.gz" -C "$stage" tests
ls -laR "$stage/tests/data" | head -80
exit $status
