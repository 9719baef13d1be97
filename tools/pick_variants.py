#!/usr/bin/env python3
"""Reads bench_cuda_linear and bench_cuda_kernels JSON lines and prints shell exports of the
fastest kernel variants: the skinny GEMV variant with the lowest per-layer time at m=1 (best of
it and cuBLASLt per shape, as LinearEngine::Run's first-call timing picks), and the decode
attention variant with the lowest total time over the measured batch x context cases.

  python3 tools/pick_variants.py linear.jsonl kernels.jsonl
"""
import json
import sys
from collections import defaultdict


def lines(path):
    out = []
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def main():
    linear, kernels = lines(sys.argv[1]), lines(sys.argv[2])
    best_skinny, best_us = None, float("inf")
    for r in linear:
        if r.get("summary") == "layer_sum" and r.get("variant") not in (None, "cublaslt"):
            us = r.get("best_of_with_cublaslt_us_m1", r.get("us_m1", float("inf")))
            print(f"# skinny {r['variant']}: layer sum m=1 {us:.1f} us", file=sys.stderr)
            if us < best_us:
                best_skinny, best_us = r["variant"], us
    totals = defaultdict(float)
    for r in kernels:
        if r.get("kernel") == "attention_decode" and "variant" in r:
            totals[r["variant"]] += r["us"]
    for v, us in totals.items():
        print(f"# decode attention {v}: sum {us:.1f} us", file=sys.stderr)
    if best_skinny:
        print(f"export KESTREL_SKINNY_VARIANT={best_skinny}")
    if totals:
        print(f"export KESTREL_DECODE_ATTENTION_VARIANT={min(totals, key=totals.get)}")


if __name__ == "__main__":
    main()
