#!/usr/bin/env python3
"""Writes an MLX affine-quantized checkpoint (the layout mlx-lm's convert writes) from a Hugging
Face model directory: every linear layer and the embedding as a uint32 "weight" of packed
`bits`-bit codes, with "scales" and "biases" (bf16) per group of `group_size` columns, and
config.json "quantization": {"group_size", "bits"} (plus, with --override-bits, one module at
other bits, to exercise per-module overrides). Optionally the same model with the dequantized
weights (scale * q + bias, in float32) as an f32 directory: the reference the MLX model's logits
must equal. numpy only; Kestrel's tests call it.

  make_mlx.py --model DIR --out DIR [--bits 4|8] [--group-size 64] [--dequantized-out DIR]
              [--override MODULE=BITS]
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_io import bf16, keep_bf16, load_model, write_checkpoints  # noqa: E402


def quantize(w, bits, gs):
    rows, cols = w.shape
    g = w.reshape(rows, cols // gs, gs).astype(np.float32)
    lo, hi = g.min(axis=2), g.max(axis=2)
    levels = (1 << bits) - 1
    scale_bits, scale = bf16((hi - lo) / levels)
    bias_bits, bias = bf16(lo)
    safe = np.where(scale == 0, 1, scale)
    q = np.clip(np.floor((g - bias[..., None]) / safe[..., None] + 0.5), 0, levels).astype(np.uint32)
    deq = (scale[..., None] * q.astype(np.float32)).astype(np.float32) + bias[..., None]
    q = q.reshape(rows, cols)
    per = 32 // bits
    words = np.zeros((rows, cols // per), np.uint32)
    for i in range(per):
        words |= q[:, i::per] << np.uint32(bits * i)
    return words, scale_bits, bias_bits, deq.astype(np.float32).reshape(rows, cols)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--bits", type=int, default=4, choices=[4, 8])
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--override", action="append", default=[], help="MODULE=BITS")
    ap.add_argument("--dequantized-out")
    args = ap.parse_args()
    overrides = {m: int(b) for m, b in (o.split("=") for o in args.override)}
    cfg = json.load(open(os.path.join(args.model, "config.json")))
    tensors = load_model(args.model)
    out, deq = {}, {}
    for name in sorted(tensors):
        w = tensors[name]()
        module = name[:-len(".weight")] if name.endswith(".weight") else None
        quantizable = (module is not None and w.ndim == 2 and w.shape[1] % args.group_size == 0
                       and (name.endswith("_proj.weight") or name.endswith("embed_tokens.weight")
                            or name == "lm_head.weight"))
        if quantizable:
            bits = overrides.get(module, args.bits)
            words, s, b, d = quantize(w, bits, args.group_size)
            out[name] = ("U32", words.shape, words.tobytes())
            out[module + ".scales"] = ("BF16", s.shape, s.tobytes())
            out[module + ".biases"] = ("BF16", b.shape, b.tobytes())
            deq[name] = d
        else:
            keep_bf16(name, w, out, deq)
    q = {"group_size": args.group_size, "bits": args.bits}
    for m, b in overrides.items():
        q[m] = {"group_size": args.group_size, "bits": b}
    write_checkpoints(args.model, cfg, {"quantization": q, "quantization_config": q}, args.out, out,
                      args.dequantized_out, deq)


if __name__ == "__main__":
    main()
