#!/usr/bin/env python3
"""Writes a block-quantized FP8 checkpoint (the layout of Qwen's *-FP8 releases) from a Hugging
Face model directory: every linear layer's weight as F8_E4M3 with a float32 weight_scale_inv per
128 x 128 block, everything else as it was, and quantization_config {"quant_method": "fp8",
"fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}. Optionally the
same model with the dequantized weights (f32(fp8) * scale, in float32) as an f32 directory: the
reference the FP8 model's logits must equal. numpy only; Kestrel's tests call it.

  make_fp8.py --model DIR --out DIR [--dequantized-out DIR] [--block 128]
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_io import keep_bf16, load_model, write_checkpoints  # noqa: E402


def e4m3_table():
    """float32 value of every e4m3fn code (0x7f and 0xff are NaN)."""
    v = np.zeros(256, np.float32)
    for code in range(256):
        s = -1.0 if code & 0x80 else 1.0
        e, m = (code >> 3) & 0xF, code & 7
        if code & 0x7F == 0x7F:
            v[code] = np.nan
        elif e == 0:
            v[code] = s * m * 2.0 ** -9
        else:
            v[code] = s * (1 + m / 8) * 2.0 ** (e - 7)
    return v


TABLE = e4m3_table()
POS = TABLE[:0x7F]  # codes 0..0x7e: the non-negative finite values, increasing


def to_e4m3(x):
    """Round-to-nearest-even e4m3fn codes of float32 x (|x| <= 448)."""
    a = np.abs(x).astype(np.float32)
    hi = np.clip(np.searchsorted(POS, a), 0, len(POS) - 1)
    lo = np.clip(hi - 1, 0, len(POS) - 1)
    dlo, dhi = a - POS[lo], POS[hi] - a
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo).astype(np.uint8)
    return code | np.where(x < 0, 0x80, 0).astype(np.uint8)


def quantize(w, block):
    rows, cols = w.shape
    br, bc = -(-rows // block), -(-cols // block)
    scale = np.zeros((br, bc), np.float32)
    q = np.zeros((rows, cols), np.uint8)
    for i in range(br):
        for j in range(bc):
            blk = w[i * block:(i + 1) * block, j * block:(j + 1) * block]
            amax = float(np.abs(blk).max())
            s = np.float32(amax / 448.0) if amax > 0 else np.float32(1.0)
            scale[i, j] = s
            q[i * block:(i + 1) * block, j * block:(j + 1) * block] = to_e4m3((blk / s).astype(np.float32))
    deq = TABLE[q] * np.repeat(np.repeat(scale, block, 0), block, 1)[:rows, :cols]
    return q, scale, deq.astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dequantized-out")
    ap.add_argument("--block", type=int, default=128)
    args = ap.parse_args()
    cfg = json.load(open(os.path.join(args.model, "config.json")))
    tensors = load_model(args.model)
    out, deq = {}, {}
    for name in sorted(tensors):
        w = tensors[name]()
        linear = (name.endswith("_proj.weight") or name.endswith("mlp.gate.weight")) and w.ndim == 2
        if linear and not name.endswith("mlp.gate.weight"):
            q, scale, d = quantize(w, args.block)
            out[name] = ("F8_E4M3", w.shape, q.tobytes())
            out[name + "_scale_inv"] = ("F32", scale.shape, scale.tobytes())
            deq[name] = d
        else:
            keep_bf16(name, w, out, deq)
    qc = {"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [args.block, args.block]}}
    write_checkpoints(args.model, cfg, qc, args.out, out, args.dequantized_out, deq)


if __name__ == "__main__":
    main()
