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
import shutil
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_gguf import load_model, write_safetensors  # noqa: E402


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


def write_mixed_safetensors(path, tensors):
    """tensors: name -> (dtype string, shape, raw bytes)."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


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
            u = w.astype(np.float32).view(np.uint32)
            bf = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
            out[name] = ("BF16", w.shape, bf.tobytes())
            deq[name] = (bf.astype(np.uint32) << 16).view(np.float32).reshape(w.shape)
    os.makedirs(args.out, exist_ok=True)
    write_mixed_safetensors(os.path.join(args.out, "model.safetensors"), out)
    cfg_q = dict(cfg)
    cfg_q["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                    "weight_block_size": [args.block, args.block]}
    json.dump(cfg_q, open(os.path.join(args.out, "config.json"), "w"), indent=2)
    extras = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja")
    for extra in extras:
        if os.path.exists(os.path.join(args.model, extra)):
            shutil.copy(os.path.join(args.model, extra), args.out)
    if args.dequantized_out:
        os.makedirs(args.dequantized_out, exist_ok=True)
        cfg_d = dict(cfg)
        cfg_d["dtype"] = "float32"
        json.dump(cfg_d, open(os.path.join(args.dequantized_out, "config.json"), "w"), indent=2)
        write_safetensors(os.path.join(args.dequantized_out, "model.safetensors"), deq)
        for extra in extras:
            if os.path.exists(os.path.join(args.model, extra)):
                shutil.copy(os.path.join(args.model, extra), args.dequantized_out)


if __name__ == "__main__":
    main()
