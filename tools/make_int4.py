#!/usr/bin/env python3
"""Writes an AWQ (GEMM packing) or GPTQ int4 checkpoint from a Hugging Face model directory, in
the layouts AutoAWQ and AutoGPTQ / GPTQModel publish: each linear layer's weight replaced by
qweight / qzeros (int32, 8 nibbles per word) and f16 scales per group (plus GPTQ's g_idx), and
quantization_config {"quant_method": "awq" | "gptq", "bits": 4, "group_size": G, ...}.
  AWQ:  qweight [in, out/8] (nibble n of word c holds output 8c + [0,2,4,6,1,3,5,7][n]),
        qzeros [in/G, out/8] packed the same way, scales [in/G, out]
  GPTQ: qweight [in/8, out] (nibble n of word r holds input 8r + n), qzeros [in/G, out/8]
        (nibble n holds output 8c + n; stored as zero - 1), scales [in/G, out], g_idx [in] = i / G
Optionally the dequantized model ((q - zero) * scale in float32) as an f32 directory: the
reference the int4 model's logits must equal. numpy only; Kestrel's tests call it.

  make_int4.py --model DIR --out DIR --format awq|gptq [--group-size 128] [--dequantized-out DIR]
               [--act-order-g-idx [--uneven-g-idx] [--perm-per-tensor]]
"""
import argparse
import json
import os
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_io import keep_bf16, load_model, write_checkpoints  # noqa: E402

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def quantize(w, gs):
    """w [out, in] -> q [out, in], zero [out, in/gs], scale f16 [out, in/gs], dequantized."""
    out_dim, in_dim = w.shape
    g = w.reshape(out_dim, in_dim // gs, gs).astype(np.float32)
    lo, hi = np.minimum(g.min(axis=2), 0), np.maximum(g.max(axis=2), 0)
    scale = ((hi - lo) / 15.0).astype(np.float16)
    s = scale.astype(np.float32)
    safe = np.where(s == 0, 1, s)
    zero = np.clip(np.floor(-lo / safe + 0.5), 0, 15).astype(np.int64)
    q = np.clip(np.floor(g / safe[..., None] + 0.5) + zero[..., None], 0, 15).astype(np.int64)
    deq = ((q - zero[..., None]).astype(np.float32) * s[..., None]).astype(np.float32)
    return q.reshape(out_dim, in_dim), zero, scale, deq.reshape(out_dim, in_dim)


def pack_cols(v, order):  # v [r, c] ints < 16 -> int32 [r, c/8], nibble n = column 8j + order[n]
    r, c = v.shape
    out = np.zeros((r, c // 8), np.uint32)
    for n, o in enumerate(order):
        out |= (v[:, o::8].astype(np.uint32) & 0xF) << np.uint32(4 * n)
    return out.view(np.int32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--format", required=True, choices=["awq", "gptq"])
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--dequantized-out")
    ap.add_argument("--act-order-g-idx", action="store_true",
                    help="GPTQ: act-order (desc_act): groups over a permuted order of the inputs, g_idx to match")
    ap.add_argument("--uneven-g-idx", action="store_true",
                    help="with --act-order-g-idx: one input of group 0 moved to group 1 (quantized "
                         "with group 1's scale and zero), so the groups are not all group-size long")
    ap.add_argument("--perm-per-tensor", action="store_true",
                    help="with --act-order-g-idx: each matrix its own input order (by default all "
                         "matrices of one width share it, as q/k/v and gate/up of a GPTQ layer do)")
    args = ap.parse_args()
    gs = args.group_size
    cfg = json.load(open(os.path.join(args.model, "config.json")))
    tensors = load_model(args.model)
    out, deq = {}, {}
    for name in sorted(tensors):
        w = tensors[name]()
        if name.endswith("_proj.weight") and w.ndim == 2 and w.shape[1] % gs == 0 and w.shape[0] % 8 == 0:
            base = name[:-len(".weight")]
            g_idx = (np.arange(w.shape[1]) // gs).astype(np.int32)
            if args.format == "gptq" and args.act_order_g_idx:
                # Act-order: groups of inputs in a permuted order (input perm[j] is in group
                # j // gs), quantized in that order, stored in the original column order.
                seed = zlib.crc32(name.encode()) if args.perm_per_tensor else 0
                perm = np.random.default_rng(seed).permutation(w.shape[1])
                qp, zero, scale, dp = quantize(w[:, perm], gs)
                q, d = np.empty_like(qp), np.empty_like(dp)
                q[:, perm], d[:, perm] = qp, dp
                g_idx[perm] = np.arange(w.shape[1]) // gs
                if args.uneven_g_idx:
                    c = perm[0]
                    s1 = scale[:, 1].astype(np.float32)
                    safe = np.where(s1 == 0, 1, s1)
                    q[:, c] = np.clip(np.floor(w[:, c].astype(np.float32) / safe + 0.5) + zero[:, 1], 0, 15)
                    d[:, c] = (q[:, c] - zero[:, 1]).astype(np.float32) * s1
                    g_idx[c] = 1
            else:
                q, zero, scale, d = quantize(w, gs)
            if args.format == "awq":
                qweight = pack_cols(q.T, AWQ_ORDER)              # [in, out/8]
                qzeros = pack_cols(zero.T, AWQ_ORDER)            # [in/G, out/8]
            else:
                qweight = pack_cols(q, list(range(8))).T.copy()  # [in/8, out]
                qzeros = pack_cols(zero.T - 1, list(range(8)))   # [in/G, out/8], zero - 1
                out[base + ".g_idx"] = ("I32", g_idx.shape, g_idx.tobytes())
            out[base + ".qweight"] = ("I32", qweight.shape, qweight.tobytes())
            out[base + ".qzeros"] = ("I32", qzeros.shape, qzeros.tobytes())
            st = np.ascontiguousarray(scale.T)
            out[base + ".scales"] = ("F16", st.shape, st.tobytes())
            deq[name] = d
        else:
            keep_bf16(name, w, out, deq)
    if args.format == "awq":
        qc = {"quant_method": "awq", "bits": 4, "group_size": gs, "version": "gemm", "zero_point": True}
    else:
        qc = {"quant_method": "gptq", "bits": 4, "group_size": gs, "desc_act": bool(args.act_order_g_idx),
              "sym": False, "checkpoint_format": "gptq"}
    write_checkpoints(args.model, cfg, {"quantization_config": qc}, args.out, out, args.dequantized_out, deq)


if __name__ == "__main__":
    main()
