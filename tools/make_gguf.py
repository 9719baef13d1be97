#!/usr/bin/env python3
"""Writes a GGUF file from a Hugging Face model directory, quantizing its matrices in the ggml
block formats Kestrel reads (Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL,
IQ4_XS), and optionally the same model with every
weight replaced by its dequantized value, as an f32 safetensors directory: the reference the GGUF
model's logits must equal (Kestrel or transformers run on it). Kestrel's tests call it (numpy
only).

The quantizers here are simple (per-group min/max and absmax scales), not llama.cpp's searches:
what matters for Kestrel is the layout and the dequantization, which follow the format's
definition (ggml's dequantize_row_*), in float32, operation by operation.

Architectures: Llama / Mistral (llama), Qwen2, Qwen3, Qwen3-MoE, and the hybrid Qwen3-Next
(qwen3next), Qwen3.5 (qwen35) and Qwen3.5-MoE (qwen35moe) with what llama.cpp's converter does to
them: the names, the metadata keys, and the tensor transforms (see hybrid_tensors), the MTP head
written as the extra block llama.cpp calls nextn.

  make_gguf.py --model DIR --out FILE.gguf --type q8_0|q4_k|q5_k|q6_k|q4_k_m|q5_k_m|q4_0|q4_1|
                                                  q5_0|q5_1|q2_k|q3_k|q3_k_m|iq4_nl|iq4_xs|
                                                  f16|bf16|f32
               [--dequantized-out DIR] [--pre qwen2|llama-bpe|qwen35] [--tokenizer DIR]
  make_gguf.py --golden OUT.bin      random blocks of each type and their dequantized values
"""
import argparse
import json
import os
import re
import shutil
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_io import bf16, load_model, write_f32_safetensors  # noqa: E402

GGML = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q2_k": 10,
        "q3_k": 11, "q4_k": 12, "q5_k": 13, "q6_k": 14, "iq4_nl": 20, "iq4_xs": 23, "bf16": 30}
BLOCK = {"f32": 1, "f16": 1, "bf16": 1, "q8_0": 32, "q4_k": 256, "q5_k": 256, "q6_k": 256,
         "q4_0": 32, "q4_1": 32, "q5_0": 32, "q5_1": 32, "q2_k": 256, "q3_k": 256, "iq4_nl": 32,
         "iq4_xs": 256}
BLOCK_BYTES = {"q8_0": 34, "q4_k": 144, "q5_k": 176, "q6_k": 210, "q4_0": 18, "q4_1": 20, "q5_0": 22,
               "q5_1": 24, "q2_k": 84, "q3_k": 110, "iq4_nl": 18, "iq4_xs": 136}
# IQ4_NL / IQ4_XS: the value of each 4-bit code (ggml's kvalues_iq4nl).
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                      dtype=np.int64)
# The legacy 32-element formats: (bits, with a min m) -> layout as quant_blocks.h describes it.
LEGACY = {"q4_0": (4, False), "q4_1": (4, True), "q5_0": (5, False), "q5_1": (5, True)}


# ---- block formats ---------------------------------------------------------------------------

def f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16)


def rint(x):
    return np.floor(np.asarray(x, dtype=np.float64) + 0.5)


def quantize_q8_0(w):  # w [rows, cols], cols % 32 == 0 -> bytes [rows, cols/32*34]
    rows, cols = w.shape
    g = w.reshape(rows, cols // 32, 32).astype(np.float32)
    d = f16(np.abs(g).max(axis=2) / 127.0)
    df = d.astype(np.float32)
    safe = np.where(df == 0, 1, df)
    q = np.clip(rint(g / safe[..., None]), -127, 127).astype(np.int8)
    q[df == 0] = 0
    out = np.zeros((rows, cols // 32, 34), np.uint8)
    out[..., 0:2] = d.view(np.uint8).reshape(rows, cols // 32, 2)
    out[..., 2:] = q.view(np.uint8)
    return out.reshape(rows, -1)


def dequantize_q8_0(b, cols):
    rows = b.shape[0]
    b = b.reshape(rows, cols // 32, 34)
    d = b[..., 0:2].copy().view(np.float16).astype(np.float32)
    q = b[..., 2:].view(np.int8).astype(np.float32)
    return (q * d).reshape(rows, cols)


def quantize_legacy(w, kind):
    """Q4_0 / Q4_1 / Q5_0 / Q5_1 blocks of 32: symmetric ones from the signed value of largest
    magnitude (d = max / -2^(bits-1), as ggml), the others over [min, max] (d = range / (2^bits-1))."""
    bits, has_min = LEGACY[kind]
    rows, cols = w.shape
    g = w.reshape(rows, cols // 32, 32).astype(np.float32)
    top = (1 << bits) - 1
    if has_min:
        lo, hi = g.min(axis=2), g.max(axis=2)
        d = f16((hi - lo) / top)
        m = f16(lo)
        df = d.astype(np.float32)
        safe = np.where(df == 0, 1, df)
        q = np.clip(rint((g - m.astype(np.float32)[..., None]) / safe[..., None]), 0, top)
    else:
        idx = np.abs(g).argmax(axis=2)
        mx = np.take_along_axis(g, idx[..., None], axis=2)[..., 0]
        half = 1 << (bits - 1)
        d = f16(mx / -half)
        df = d.astype(np.float32)
        safe = np.where(df == 0, 1, df)
        q = np.clip(np.floor(g / safe[..., None] + half + 0.5), 0, top)
        q[df == 0] = half
    q = q.astype(np.uint32)
    nbytes = BLOCK_BYTES[kind]
    out = np.zeros((rows, cols // 32, nbytes), np.uint8)
    out[..., 0:2] = d.view(np.uint8).reshape(rows, cols // 32, 2)
    at = 2
    if has_min:
        out[..., 2:4] = m.view(np.uint8).reshape(rows, cols // 32, 2)
        at = 4
    if bits == 5:
        qh = (((q >> 4) & 1) << np.arange(32, dtype=np.uint32)).sum(axis=2).astype(np.uint32)
        out[..., at:at + 4] = qh.view(np.uint8).reshape(rows, cols // 32, 4)
        at += 4
    out[..., at:at + 16] = ((q[..., :16] & 0xF) | ((q[..., 16:] & 0xF) << 4)).astype(np.uint8)
    return out.reshape(rows, -1)


def dequantize_legacy(b, cols, kind):
    bits, has_min = LEGACY[kind]
    rows = b.shape[0]
    b = b.reshape(rows, cols // 32, BLOCK_BYTES[kind])
    d = b[..., 0:2].copy().view(np.float16).astype(np.float32)
    at = 4 if has_min else 2
    q = np.concatenate([b[..., at + (4 if bits == 5 else 0):][..., :16] & 0xF,
                        b[..., at + (4 if bits == 5 else 0):][..., :16] >> 4], axis=2).astype(np.int64)
    if bits == 5:
        qh = b[..., at:at + 4].copy().view(np.uint32).astype(np.int64)
        q |= ((qh >> np.arange(32)) & 1) << 4
    if has_min:
        m = b[..., 2:4].copy().view(np.float16).astype(np.float32)
        v = (q.astype(np.float32) * d).astype(np.float32) + m  # q * d exact, then one rounding
    else:
        v = (q - (1 << (bits - 1))).astype(np.float32) * d
    return v.astype(np.float32).reshape(rows, cols)


def f16_at(b, at):
    """The f16 at bytes [at, at + 2) of each block row of b [nb, bytes], as float32 [nb]."""
    return b[:, at:at + 2].copy().view(np.float16).astype(np.float32)[:, 0]


def pack_q4k_scales(sc, m):  # sc, m [n, 8] in 0..63 -> [n, 12]
    out = np.zeros(sc.shape[:-1] + (12,), np.uint8)
    for j in range(4):
        out[..., j] = (sc[..., j] | ((sc[..., j + 4] >> 4) << 6)).astype(np.uint8)
        out[..., j + 4] = (m[..., j] | ((m[..., j + 4] >> 4) << 6)).astype(np.uint8)
        out[..., j + 8] = ((sc[..., j + 4] & 0xF) | ((m[..., j + 4] & 0xF) << 4)).astype(np.uint8)
    return out


def unpack_q4k_scales(s):
    sc = np.zeros(s.shape[:-1] + (8,), np.int64)
    m = np.zeros_like(sc)
    s = s.astype(np.int64)
    for j in range(8):
        if j < 4:
            sc[..., j] = s[..., j] & 63
            m[..., j] = s[..., j + 4] & 63
        else:
            sc[..., j] = (s[..., j + 4] & 0xF) | ((s[..., j - 4] >> 6) << 4)
            m[..., j] = (s[..., j + 4] >> 4) | ((s[..., j] >> 6) << 4)
    return sc, m


def k_quant_groups(w, levels, group=32, scale_max=63):
    """Per 256-block: f16 d and dmin, sc and m in 0..scale_max per group of `group`, and q in
    0..levels with w ~ (d * sc) * q - dmin * m (per-group min/max). Returns (d, dmin, sc, m,
    q [nb, 256 / group, group])."""
    rows, cols = w.shape
    nb = rows * cols // 256
    g = w.reshape(nb, 256 // group, group).astype(np.float32)
    lo = np.minimum(g.min(axis=2), 0)
    hi = g.max(axis=2)
    scale = (hi - lo) / float(levels)
    mins = -lo
    d = f16(scale.max(axis=1) / float(scale_max))
    dmin = f16(mins.max(axis=1) / float(scale_max))
    df, dminf = d.astype(np.float32), dmin.astype(np.float32)
    sc = np.clip(rint(scale / np.where(df == 0, 1, df)[:, None]), 0, scale_max).astype(np.int64)
    m = np.clip(rint(mins / np.where(dminf == 0, 1, dminf)[:, None]), 0, scale_max).astype(np.int64)
    d1 = (df[:, None] * sc.astype(np.float32)).astype(np.float32)
    m1 = (dminf[:, None] * m.astype(np.float32)).astype(np.float32)
    q = np.clip(rint((g + m1[..., None]) / np.where(d1 == 0, 1, d1)[..., None]), 0, levels).astype(np.uint8)
    q[d1 == 0] = 0
    return d, dmin, sc, m, q


def quantize_k(w, fifth_bit):
    """Q4_K (144-byte blocks: d, dmin, 12 scale bytes, the nibbles) and Q5_K (176 bytes: the
    same with qh[32] before the nibbles, bit g of qh[l] the fifth bit of element 32g + l)."""
    rows, cols = w.shape
    nb = rows * cols // 256
    d, dmin, sc, m, q = k_quant_groups(w, 31 if fifth_bit else 15)
    out = np.zeros((nb, 176 if fifth_bit else 144), np.uint8)
    out[:, 0:2] = d.view(np.uint8).reshape(nb, 2)
    out[:, 2:4] = dmin.view(np.uint8).reshape(nb, 2)
    out[:, 4:16] = pack_q4k_scales(sc, m)
    if fifth_bit:
        high = (q >> 4).astype(np.int64)  # [nb, 8, 32]
        out[:, 16:48] = (high << np.arange(8)[None, :, None]).sum(axis=1).astype(np.uint8)
    low = (q & 0xF).reshape(nb, 4, 2, 32)
    out[:, 48 if fifth_bit else 16:] = (low[:, :, 0, :] | (low[:, :, 1, :] << 4)).reshape(nb, 128)
    return out.reshape(rows, -1)


def dequantize_k(b, cols, fifth_bit):
    rows = b.shape[0]
    nb = rows * cols // 256
    b = b.reshape(nb, 176 if fifth_bit else 144)
    d, dmin = f16_at(b, 0), f16_at(b, 2)
    sc, m = unpack_q4k_scales(b[:, 4:16])
    d1 = (d[:, None] * sc.astype(np.float32)).astype(np.float32)  # [nb, 8]
    m1 = (dmin[:, None] * m.astype(np.float32)).astype(np.float32)
    qs = b[:, 48 if fifth_bit else 16:].reshape(nb, 4, 32).astype(np.int64)
    q = np.stack([qs & 0xF, qs >> 4], axis=2).reshape(nb, 8, 32)
    if fifth_bit:
        qh = b[:, 16:48].astype(np.int64)  # [nb, 32]
        q = q | (((qh[:, None, :] >> np.arange(8)[None, :, None]) & 1) << 4)
    y = (d1[..., None] * q.astype(np.float32)).astype(np.float32) - m1[..., None]
    return y.astype(np.float32).reshape(rows, cols)


def quantize_q4_k(w):
    return quantize_k(w, False)


def dequantize_q4_k(b, cols):
    return dequantize_k(b, cols, False)


def quantize_q5_k(w):
    return quantize_k(w, True)


def dequantize_q5_k(b, cols):
    return dequantize_k(b, cols, True)


def quantize_q6_k(w):
    rows, cols = w.shape
    nb = rows * cols // 256
    g = w.reshape(nb, 16, 16).astype(np.float32)
    amax_i = np.abs(g).argmax(axis=2)
    signed_max = np.take_along_axis(g, amax_i[..., None], axis=2)[..., 0]
    scale = -signed_max / 32.0  # the extreme value maps to -32
    d = f16(np.abs(scale).max(axis=1) / 127.0)
    df = d.astype(np.float32)
    sc = np.clip(rint(scale / np.where(df == 0, 1, df)[:, None]), -128, 127).astype(np.int64)
    s = (df[:, None] * sc.astype(np.float32)).astype(np.float32)
    q = np.clip(rint(g / np.where(s == 0, 1, s)[..., None]), -32, 31).astype(np.int64)
    q[s == 0] = 0
    q6 = (q + 32).reshape(nb, 2, 128)
    out = np.zeros((nb, 210), np.uint8)
    ql = np.zeros((nb, 2, 64), np.int64)
    qh = np.zeros((nb, 2, 32), np.int64)
    ql[:, :, 0:32] = (q6[:, :, 0:32] & 0xF) | ((q6[:, :, 64:96] & 0xF) << 4)
    ql[:, :, 32:64] = (q6[:, :, 32:64] & 0xF) | ((q6[:, :, 96:128] & 0xF) << 4)
    qh[:] = ((q6[:, :, 0:32] >> 4) | ((q6[:, :, 32:64] >> 4) << 2) | ((q6[:, :, 64:96] >> 4) << 4)
             | ((q6[:, :, 96:128] >> 4) << 6))
    out[:, 0:128] = ql.reshape(nb, 128).astype(np.uint8)
    out[:, 128:192] = qh.reshape(nb, 64).astype(np.uint8)
    out[:, 192:208] = sc.astype(np.int8).view(np.uint8)
    out[:, 208:210] = d.view(np.uint8).reshape(nb, 2)
    return out.reshape(rows, -1)


def dequantize_q6_k(b, cols):
    rows = b.shape[0]
    nb = rows * cols // 256
    b = b.reshape(nb, 210)
    ql = b[:, 0:128].reshape(nb, 2, 64).astype(np.int64)
    qh = b[:, 128:192].reshape(nb, 2, 32).astype(np.int64)
    sc = b[:, 192:208].view(np.int8).astype(np.float32).reshape(nb, 16)
    d = f16_at(b, 208)
    q = np.zeros((nb, 2, 128), np.int64)
    q[:, :, 0:32] = (ql[:, :, 0:32] & 0xF) | (((qh >> 0) & 3) << 4)
    q[:, :, 32:64] = (ql[:, :, 32:64] & 0xF) | (((qh >> 2) & 3) << 4)
    q[:, :, 64:96] = (ql[:, :, 0:32] >> 4) | (((qh >> 4) & 3) << 4)
    q[:, :, 96:128] = (ql[:, :, 32:64] >> 4) | (((qh >> 6) & 3) << 4)
    q = (q - 32).reshape(nb, 16, 16).astype(np.float32)
    scale = (d[:, None] * sc).astype(np.float32)  # d * sc, then * q: two f32 roundings
    return (scale[..., None] * q).astype(np.float32).reshape(rows, cols)


# Q3_K: the hmask bit of element 128 n + 32 j + 16 h + l is bit 4 n + j (axes n, j of [nb, n, j,
# h, l]).
Q3K_HMASK_SHIFTS = (4 * np.arange(2)[:, None] + np.arange(4)[None, :])[None, :, :, None, None]


def signed_extreme(g):
    """The value of largest magnitude along the last axis, with its sign."""
    idx = np.abs(g).argmax(axis=-1)
    return np.take_along_axis(g, idx[..., None], axis=-1)[..., 0]


def pack_low_bits(q):
    """Q2_K / Q3_K: element e = 128 n + 32 j + 16 h + l of q [nb, 256] at bits 2j of byte
    32 n + 16 h + l -> [nb, 64]."""
    q = (q.astype(np.int64) & 3).reshape(-1, 2, 4, 2, 16)  # n, j, h, l
    return (q << (2 * np.arange(4))[None, None, :, None, None]).sum(axis=2).reshape(-1, 64).astype(np.uint8)


def unpack_low_bits(qs):  # [nb, 64] -> [nb, 256] (the inverse of pack_low_bits)
    qs = qs.astype(np.int64).reshape(-1, 2, 1, 2, 16)
    return ((qs >> (2 * np.arange(4))[None, None, :, None, None]) & 3).reshape(-1, 256)


def quantize_q2_k(w):
    """Q2_K (84-byte blocks: scales[16] = sc | m << 4, qs[64], f16 d, f16 dmin): per group of 16,
    w ~ (d * sc) * q - dmin * m with q in 0..3 over the group's [min(0, lo), hi]."""
    rows, cols = w.shape
    nb = rows * cols // 256
    d, dmin, sc, m, q = k_quant_groups(w, 3, group=16, scale_max=15)
    out = np.zeros((nb, 84), np.uint8)
    out[:, 0:16] = (sc | (m << 4)).astype(np.uint8)
    out[:, 16:80] = pack_low_bits(q.reshape(nb, 256))
    out[:, 80:82] = d.view(np.uint8).reshape(nb, 2)
    out[:, 82:84] = dmin.view(np.uint8).reshape(nb, 2)
    return out.reshape(rows, -1)


def dequantize_q2_k(b, cols):
    rows = b.shape[0]
    nb = rows * cols // 256
    b = b.reshape(nb, 84)
    d, dmin = f16_at(b, 80), f16_at(b, 82)
    sc = (b[:, 0:16] & 0xF).astype(np.float32)
    m = (b[:, 0:16] >> 4).astype(np.float32)
    dl = (d[:, None] * sc).astype(np.float32)  # [nb, 16]
    ml = (dmin[:, None] * m).astype(np.float32)
    q = unpack_low_bits(b[:, 16:80]).reshape(nb, 16, 16).astype(np.float32)
    y = (dl[..., None] * q).astype(np.float32) - ml[..., None]  # dl * q exact, then one rounding
    return y.astype(np.float32).reshape(rows, cols)


def pack_q3k_scales(sc):  # sc [nb, 16] in 0..63 -> [nb, 12]
    out = np.zeros((sc.shape[0], 12), np.int64)
    for g in range(16):
        if g < 8:
            out[:, g] |= sc[:, g] & 0xF
        else:
            out[:, g - 8] |= (sc[:, g] & 0xF) << 4
        out[:, 8 + g % 4] |= (sc[:, g] >> 4) << (2 * (g // 4))
    return out.astype(np.uint8)


def unpack_q3k_scales(s):  # [nb, 12] -> [nb, 16]
    s = s.astype(np.int64)
    sc = np.zeros((s.shape[0], 16), np.int64)
    for g in range(16):
        low = s[:, g] & 0xF if g < 8 else s[:, g - 8] >> 4
        sc[:, g] = low | (((s[:, 8 + g % 4] >> (2 * (g // 4))) & 3) << 4)
    return sc


def quantize_q3_k(w):
    """Q3_K (110-byte blocks: hmask[32], qs[64], 12 scale bytes, f16 d): per group of 16,
    w ~ (d * (sc - 32)) * (q - 4) with q in 0..7, the group's extreme value mapped to -4."""
    rows, cols = w.shape
    nb = rows * cols // 256
    g = w.reshape(nb, 16, 16).astype(np.float32)
    scale = -signed_extreme(g) / 4.0
    d = f16(np.abs(scale).max(axis=1) / 32.0)
    df = d.astype(np.float32)
    sc = np.clip(rint(scale / np.where(df == 0, 1, df)[:, None]), -32, 31).astype(np.int64)
    dl = (df[:, None] * sc.astype(np.float32)).astype(np.float32)
    q = np.clip(rint(g / np.where(dl == 0, 1, dl)[..., None]), -4, 3).astype(np.int64) + 4
    q[dl == 0] = 4
    q = q.reshape(nb, 256)
    third = (q >> 2).reshape(nb, 2, 4, 2, 16)
    out = np.zeros((nb, 110), np.uint8)
    out[:, 0:32] = (third << Q3K_HMASK_SHIFTS).sum(axis=(1, 2)).reshape(nb, 32).astype(np.uint8)
    out[:, 32:96] = pack_low_bits(q)
    out[:, 96:108] = pack_q3k_scales(sc + 32)
    out[:, 108:110] = d.view(np.uint8).reshape(nb, 2)
    return out.reshape(rows, -1)


def dequantize_q3_k(b, cols):
    rows = b.shape[0]
    nb = rows * cols // 256
    b = b.reshape(nb, 110)
    d = f16_at(b, 108)
    sc = unpack_q3k_scales(b[:, 96:108]) - 32
    hm = b[:, 0:32].astype(np.int64).reshape(nb, 1, 1, 2, 16)
    third = ((hm >> Q3K_HMASK_SHIFTS) & 1).reshape(nb, 256)
    q = unpack_low_bits(b[:, 32:96]) - 4 * (1 - third)  # ggml: minus 4 where the bit is clear
    dl = (d[:, None] * sc.astype(np.float32)).astype(np.float32)
    y = dl[..., None] * q.reshape(nb, 16, 16).astype(np.float32)  # exact
    return y.astype(np.float32).reshape(rows, cols)


def iq4_codes(g, dl):
    """The code of each value of g [..., 32] / dl [...]: the nearest codebook entry."""
    t = g / np.where(dl == 0, 1, dl)[..., None]
    q = np.abs(t[..., None] - IQ4_VALUES.astype(np.float32)).argmin(axis=-1).astype(np.int64)
    q[dl == 0] = 8  # value 1, times 0
    return q


def pack_iq4_nibbles(q):  # [..., 32] -> [..., 16]: element j low, j + 16 high
    return (q[..., :16] | (q[..., 16:] << 4)).astype(np.uint8)


def unpack_iq4_values(qs):  # [..., 16] -> codebook values [..., 32]
    qs = qs.astype(np.int64)
    return IQ4_VALUES[np.concatenate([qs & 0xF, qs >> 4], axis=-1)]


def quantize_iq4_nl(w):
    """IQ4_NL (18-byte blocks of 32: f16 d, nibbles as Q4_0's): w ~ d * IQ4_VALUES[q], the
    block's extreme value mapped to -127."""
    rows, cols = w.shape
    g = w.reshape(rows, cols // 32, 32).astype(np.float32)
    d = f16(-signed_extreme(g) / 127.0)
    q = iq4_codes(g, d.astype(np.float32))
    out = np.zeros((rows, cols // 32, 18), np.uint8)
    out[..., 0:2] = d.view(np.uint8).reshape(rows, cols // 32, 2)
    out[..., 2:] = pack_iq4_nibbles(q)
    return out.reshape(rows, -1)


def dequantize_iq4_nl(b, cols):
    rows = b.shape[0]
    b = b.reshape(rows, cols // 32, 18)
    d = b[..., 0:2].copy().view(np.float16).astype(np.float32)
    return (d * unpack_iq4_values(b[..., 2:]).astype(np.float32)).astype(np.float32).reshape(rows, cols)


def quantize_iq4_xs(w):
    """IQ4_XS (136-byte blocks of 256: f16 d, u16 scales_h, scales_l[4], qs[128]): per group of
    32, w ~ (d * (ls - 32)) * IQ4_VALUES[q]."""
    rows, cols = w.shape
    nb = rows * cols // 256
    g = w.reshape(nb, 8, 32).astype(np.float32)
    scale = -signed_extreme(g) / 127.0
    d = f16(np.abs(scale).max(axis=1) / 32.0)
    df = d.astype(np.float32)
    ls = np.clip(rint(scale / np.where(df == 0, 1, df)[:, None]), -32, 31).astype(np.int64) + 32
    dl = (df[:, None] * (ls - 32).astype(np.float32)).astype(np.float32)
    q = iq4_codes(g, dl)
    out = np.zeros((nb, 136), np.uint8)
    out[:, 0:2] = d.view(np.uint8).reshape(nb, 2)
    scales_h = ((ls >> 4) << (2 * np.arange(8))[None, :]).sum(axis=1).astype(np.uint16)
    out[:, 2:4] = scales_h.view(np.uint8).reshape(nb, 2)
    out[:, 4:8] = ((ls[:, 0::2] & 0xF) | ((ls[:, 1::2] & 0xF) << 4)).astype(np.uint8)
    out[:, 8:] = pack_iq4_nibbles(q).reshape(nb, 128)
    return out.reshape(rows, -1)


def dequantize_iq4_xs(b, cols):
    rows = b.shape[0]
    nb = rows * cols // 256
    b = b.reshape(nb, 136)
    d = f16_at(b, 0)
    scales_h = b[:, 2:4].copy().view(np.uint16).astype(np.int64)[:, 0]
    ib = np.arange(8)
    ls = ((b[:, 4 + ib // 2].astype(np.int64) >> (4 * (ib % 2))) & 0xF) | (((scales_h[:, None] >> (2 * ib)) & 3) << 4)
    dl = (d[:, None] * (ls - 32).astype(np.float32)).astype(np.float32)  # [nb, 8]
    v = unpack_iq4_values(b[:, 8:].reshape(nb, 8, 16)).astype(np.float32)
    return (dl[..., None] * v).astype(np.float32).reshape(rows, cols)  # exact


QUANT = {"q8_0": (quantize_q8_0, dequantize_q8_0), "q4_k": (quantize_q4_k, dequantize_q4_k),
         "q5_k": (quantize_q5_k, dequantize_q5_k), "q6_k": (quantize_q6_k, dequantize_q6_k),
         "q2_k": (quantize_q2_k, dequantize_q2_k), "q3_k": (quantize_q3_k, dequantize_q3_k),
         "iq4_nl": (quantize_iq4_nl, dequantize_iq4_nl), "iq4_xs": (quantize_iq4_xs, dequantize_iq4_xs)}
for _kind in LEGACY:
    QUANT[_kind] = (lambda w, k=_kind: quantize_legacy(w, k), lambda b, cols, k=_kind: dequantize_legacy(b, cols, k))


def encode(w, kind):
    """(bytes, dequantized f32 values) of a tensor stored as `kind`."""
    w = np.asarray(w, dtype=np.float32)
    if kind == "f32":
        return w.tobytes(), w
    if kind == "f16":
        h = w.astype(np.float16)
        return h.tobytes(), h.astype(np.float32)
    if kind == "bf16":
        r, v = bf16(w)
        return r.tobytes(), v
    q, dq = QUANT[kind]
    b = q(w)
    return b.tobytes(), dq(b, w.shape[1])


# ---- GGUF writer -----------------------------------------------------------------------------

def gguf_string(s):
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gguf_value(v, type_hint=None):
    if isinstance(v, bool):
        return struct.pack("<I", 7) + struct.pack("<B", v)
    if isinstance(v, int):
        t = type_hint or "u32"
        code, fmt = {"u32": (4, "<I"), "i32": (5, "<i"), "u64": (10, "<Q")}[t]
        return struct.pack("<I", code) + struct.pack(fmt, v)
    if isinstance(v, float):
        return struct.pack("<I", 6) + struct.pack("<f", v)
    if isinstance(v, str):
        return struct.pack("<I", 8) + gguf_string(v)
    if isinstance(v, list):
        if all(isinstance(x, bool) for x in v):
            return struct.pack("<IIQ", 9, 7, len(v)) + bytes(int(x) for x in v)
        if all(isinstance(x, str) for x in v):
            return struct.pack("<IIQ", 9, 8, len(v)) + b"".join(gguf_string(x) for x in v)
        return struct.pack("<IIQ", 9, 5, len(v)) + b"".join(struct.pack("<i", x) for x in v)
    raise TypeError(v)


def write_gguf(path, metadata, tensors, alignment=32):
    """tensors: list of (name, shape outermost-first, ggml type, n_bytes, produce) where
    produce() returns the bytes; they are produced and written one at a time."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata)))
    for key, value in metadata.items():
        hint = None
        if isinstance(value, tuple):
            value, hint = value
        out += gguf_string(key) + gguf_value(value, hint)
    offset = 0
    for name, shape, gtype, n_bytes, _ in tensors:
        out += gguf_string(name) + struct.pack("<I", len(shape))
        for dim in reversed(shape):
            out += struct.pack("<Q", dim)
        out += struct.pack("<IQ", gtype, offset)
        offset += n_bytes
        offset += -offset % alignment
    out += b"\0" * (-len(out) % alignment)
    with open(path, "wb") as f:
        f.write(out)
        for name, shape, gtype, n_bytes, produce in tensors:
            data = produce()
            assert len(data) == n_bytes, name
            f.write(data)
            f.write(b"\0" * (-len(data) % alignment))


# ---- model conversion ------------------------------------------------------------------------

ARCH = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
        "Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3moe", "Qwen3NextForCausalLM": "qwen3next",
        "Qwen3_5ForCausalLM": "qwen35", "Qwen3_5MoeForCausalLM": "qwen35moe"}
LAYER_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
               "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
               "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp"}


def llama_permute(w, n_head):  # llama.cpp's converter: interleave each head's two rotate-half halves
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# Tensors llama.cpp's converter always stores in F32, whatever the file type: the routers, the
# shared-expert gate, the linear-attention convolution, and any tensor not named *.weight.
F32_ALWAYS = (".ffn_gate_inp.", ".ffn_gate_inp_shexp.", ".ssm_conv1d.")


def choose_type(gguf_name, shape, scheme):
    if (len(shape) < 2 or gguf_name.endswith("_norm.weight") or not gguf_name.endswith(".weight")
            or any(s in gguf_name for s in F32_ALWAYS)):
        return "f32"
    if scheme in ("f32", "f16", "bf16"):
        return scheme
    if scheme in ("q4_k_m", "q5_k_m"):  # llama.cpp's mixes, simplified: V, down and the head in Q6_K
        kind = "q6_k" if any(s in gguf_name for s in ("attn_v", "ffn_down", "output.")) else scheme[:4]
    elif scheme == "q3_k_m":  # simplified too: V and down in Q4_K, the head in Q6_K
        kind = ("q6_k" if "output." in gguf_name else
                "q4_k" if any(s in gguf_name for s in ("attn_v", "ffn_down")) else "q3_k")
    else:
        kind = scheme
    if shape[-1] % BLOCK[kind] != 0:
        # As llama.cpp: IQ4_XS rows that are not whole 256-blocks take IQ4_NL.
        kind = ("iq4_nl" if kind == "iq4_xs" and shape[-1] % 32 == 0 else
                "q8_0" if shape[-1] % 32 == 0 else "f16")
    return kind


def tokenizer_metadata(model_dir, pre, vocab_size):
    md = {}
    tj_path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.exists(tj_path):
        return md
    tj = json.load(open(tj_path, encoding="utf-8"))
    cfg_path = os.path.join(model_dir, "tokenizer_config.json")
    cfg = json.load(open(cfg_path, encoding="utf-8")) if os.path.exists(cfg_path) else {}
    vocab = dict(tj["model"]["vocab"])
    types = {}
    for t in tj.get("added_tokens", []):
        vocab[t["content"]] = t["id"]
        types[t["id"]] = 3 if t.get("special") else 4
    n = max(max(vocab.values()) + 1, vocab_size)  # padded to the embedding's rows, as llama.cpp does
    tokens = [f"[PAD{i}]" for i in range(n)]
    ttype = [5] * n
    for s, i in vocab.items():
        tokens[i] = s
        ttype[i] = types.get(i, 1)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    md["tokenizer.ggml.model"] = "gpt2"
    md["tokenizer.ggml.pre"] = pre
    md["tokenizer.ggml.tokens"] = tokens
    md["tokenizer.ggml.token_type"] = ttype
    md["tokenizer.ggml.merges"] = merges

    def token_id(key):
        v = cfg.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        return vocab.get(v) if v is not None else None
    bos, eos = token_id("bos_token"), token_id("eos_token")
    if bos is not None:
        md["tokenizer.ggml.bos_token_id"] = bos
    if eos is not None:
        md["tokenizer.ggml.eos_token_id"] = eos
    post = tj.get("post_processor") or {}
    add_bos = "TemplateProcessing" in json.dumps(post)
    md["tokenizer.ggml.add_bos_token"] = bool(add_bos)
    tmpl = cfg.get("chat_template")
    jinja = os.path.join(model_dir, "chat_template.jinja")
    if os.path.exists(jinja):
        tmpl = open(jinja, encoding="utf-8").read()
    if isinstance(tmpl, str):
        md["tokenizer.chat_template"] = tmpl
    return md


def rope_factors(rope, head_dim):
    """llama.cpp's per-frequency divisors for llama3 RoPE scaling (rope_freqs.weight)."""
    import math
    base = rope["rope_theta"]
    factor = rope["factor"]
    low, high = rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = rope["original_max_position_embeddings"]
    low_wl, high_wl = old / low, old / high
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(factor)
        else:
            smooth = (old / wl - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def n_bytes(shape, kind):
    bytes_per_block = dict(BLOCK_BYTES, f32=4, f16=2, bf16=2)
    return int(np.prod(shape)) // BLOCK[kind] * bytes_per_block[kind]


# ---- hybrid Qwen (Qwen3-Next, Qwen3.5, Qwen3.5-MoE) --------------------------------------------

HYBRID = ("qwen3next", "qwen35", "qwen35moe")
HYBRID_LAYER_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
    "linear_attn.in_proj_qkv": "attn_qkv", "linear_attn.in_proj_z": "attn_gate",
    "linear_attn.in_proj_b": "ssm_beta", "linear_attn.in_proj_a": "ssm_alpha", "linear_attn.in_proj_ba": "ssm_ba",
    "linear_attn.conv1d": "ssm_conv1d", "linear_attn.norm": "ssm_norm", "linear_attn.out_proj": "ssm_out"}
# The MTP head's own tensors, in the first block after the decoder's.
MTP_NAMES = {"fc": "nextn.eh_proj", "pre_fc_norm_embedding": "nextn.enorm", "pre_fc_norm_hidden": "nextn.hnorm",
             "norm": "nextn.shared_head_norm"}
# RMSNorm weights the model applies as (1 + w): llama.cpp's converter stores 1 + w (in f32).
NORM_OFFSET = ("attn_norm", "post_attention_norm", "attn_q_norm", "attn_k_norm", "output_norm", "nextn.enorm",
               "nextn.hnorm", "nextn.shared_head_norm")
EXPERT = re.compile(r"^(model|mtp)\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")
FUSED_EXPERTS = re.compile(r"^(model|mtp)\.layers\.(\d+)\.mlp\.experts\.(gate_up|down)_proj$")


def n_mtp_layers(tensors):
    return len({n.split(".")[2] for n in tensors if n.startswith("mtp.layers.")})


def hybrid_block(name, n_layers):
    """(GGUF block id, the name inside the layer) of a decoder or MTP layer tensor."""
    parts = name.split(".", 3)
    return (int(parts[2]) + (n_layers if parts[0] == "mtp" else 0)), parts[3]


def hybrid_gguf_name(name, n_layers):
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if name in fixed:
        return fixed[name]
    parts = name.split(".")
    if parts[0] == "mtp" and len(parts) == 3 and parts[1] in MTP_NAMES:
        return f"blk.{n_layers}.{MTP_NAMES[parts[1]]}.{parts[2]}"
    if not name.startswith(("model.layers.", "mtp.layers.")):
        sys.exit(f"make_gguf: no GGUF name for {name}")
    bid, rest = hybrid_block(name, n_layers)
    if rest == "linear_attn.A_log":
        return f"blk.{bid}.ssm_a"
    if rest == "linear_attn.dt_bias":
        return f"blk.{bid}.ssm_dt.bias"
    base, _, kind = rest.rpartition(".")
    if base not in HYBRID_LAYER_NAMES:
        sys.exit(f"make_gguf: no GGUF name for {name}")
    return f"blk.{bid}.{HYBRID_LAYER_NAMES[base]}.{kind}"


def v_heads_tiled(x, axis, nk, r, d):
    """Value heads (d entries each along `axis`) from grouped by key head (head g*r + j) to the
    tiled order llama.cpp's converter writes for Qwen3.5 (head j*nk + g)."""
    s = x.shape
    return np.swapaxes(x.reshape(s[:axis] + (nk, r, d) + s[axis + 1:]), axis, axis + 1).reshape(s)


def v_heads_grouped(x, axis, nk, r, d):  # the inverse of v_heads_tiled
    s = x.shape
    return np.swapaxes(x.reshape(s[:axis] + (r, nk, d) + s[axis + 1:]), axis, axis + 1).reshape(s)


def hybrid_metadata(cfg, arch, tensors, rope, head_dim):
    """The keys llama.cpp's converter writes for these architectures (beside the common ones)."""
    p = arch + "."
    n_layers, n_mtp = cfg["num_hidden_layers"], n_mtp_layers(tensors)
    md = {p + "block_count": n_layers + n_mtp}
    if cfg.get("num_experts") or cfg.get("num_local_experts"):
        md[p + "expert_count"] = cfg.get("num_local_experts") or cfg["num_experts"]
        md[p + "expert_used_count"] = cfg["num_experts_per_tok"]
    if "moe_intermediate_size" in cfg:
        md[p + "expert_feed_forward_length"] = cfg["moe_intermediate_size"]
    if "shared_expert_intermediate_size" in cfg:
        md[p + "expert_shared_feed_forward_length"] = cfg["shared_expert_intermediate_size"]
    md[p + "ssm.conv_kernel"] = cfg["linear_conv_kernel_dim"]
    md[p + "ssm.state_size"] = cfg["linear_key_head_dim"]
    md[p + "ssm.group_count"] = cfg["linear_num_key_heads"]
    md[p + "ssm.time_step_rank"] = cfg["linear_num_value_heads"]
    md[p + "ssm.inner_size"] = cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"]
    if "layer_types" in cfg:  # the MTP blocks are attention blocks
        md[p + "attention.recurrent_layers"] = [t == "linear_attention" for t in cfg["layer_types"]] + [False] * n_mtp
    md[p + "full_attention_interval"] = cfg.get("full_attention_interval", 4)
    partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
    md[p + "rope.dimension_count"] = int(head_dim * partial)
    if arch != "qwen3next":  # Qwen3.5's interleaved M-RoPE sections, [11, 11, 10, 0] when not given
        sections = list(rope.get("mrope_section", [11, 11, 10]))
        md[p + "rope.dimension_sections"] = (sections + [0] * 4)[:4]
    if n_mtp:
        md[p + "nextn_predict_layers"] = n_mtp
    return md


def hybrid_tensors(cfg, arch, tensors, scheme, dequantized):
    """The GGUF tensors of a Qwen3-Next / Qwen3.5 checkpoint as llama.cpp's converter writes them,
    and (when `dequantized` is a dict) the reference: each checkpoint tensor rebuilt in its own
    layout from the dequantized values of what was stored.

      RMSNorm weights applied as (1 + w) (layers, q/k norms, final, MTP): stored as 1 + w in f32
      A_log: stored as A = -exp(A_log) in f32 (ssm_a); dt_bias renamed ssm_dt.bias
      conv1d (C, 1, K): squeezed to (C, K), f32
      Qwen3-Next in_proj_qkvz (per key head q|k|v|z): split into attn_qkv (all q | all k | all v)
        and attn_gate (all z); in_proj_ba stored as it is (ssm_ba)
      Qwen3.5 with fewer key than value heads: every value-head axis (the v rows of in_proj_qkv
        and of conv1d, in_proj_z, in_proj_b, in_proj_a, A_log, dt_bias, out_proj's columns) from
        grouped to tiled order (v_heads_tiled)
      experts: one (E, rows, cols) tensor per projection (per-expert tensors stacked, a fused
        gate_up_proj split into gate and up)
    """
    n_layers = cfg["num_hidden_layers"]
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    r = nv // nk
    tiled = arch != "qwen3next" and nk != nv
    qk_rows = 2 * nk * dk
    out = []

    def add(hf_names, outputs, forward, inverse):
        """hf_names: the checkpoint tensors; outputs: [(GGUF name, stored shape)]; forward(list of
        checkpoint arrays) -> list of stored arrays; inverse(list of dequantized stored arrays,
        list of checkpoint arrays) -> list of reference arrays, one per checkpoint tensor."""
        got = {}

        def load():
            return [tensors[n]() for n in hf_names]
        for i, (g, shape) in enumerate(outputs):
            kind = choose_type(g, shape, scheme)

            def produce(i=i, kind=kind, shape=shape):
                stored = forward(load())[i]
                assert tuple(stored.shape) == tuple(shape), (hf_names, stored.shape, shape)
                data, dq = encode(stored.reshape(-1, stored.shape[-1]) if stored.ndim > 1 else stored, kind)
                if dequantized is not None:
                    got[i] = dq.reshape(stored.shape)
                    if len(got) == len(outputs):
                        refs = inverse([got[j] for j in range(len(outputs))], load())
                        for n, ref in zip(hf_names, refs):
                            dequantized[n] = np.ascontiguousarray(ref, dtype=np.float32)
                        got.clear()
                return data
            out.append((g, list(shape), GGML[kind], n_bytes(shape, kind), produce))

    def one(name, g, shape, fwd=lambda w: w, inv=lambda dq, w: dq):
        add([name], [(g, shape)], lambda ws: [fwd(ws[0])], lambda dqs, ws: [inv(dqs[0], ws[0])])

    stacks = {}
    for name in sorted(tensors):
        shape = tuple(tensors[name].shape)
        m = EXPERT.match(name)
        if m:
            stacks.setdefault(hybrid_block(name, n_layers)[0], {}).setdefault(m.group(4), []).append(
                (int(m.group(3)), name))
            continue
        m = FUSED_EXPERTS.match(name)
        if m:
            bid = hybrid_block(name, n_layers)[0]
            if m.group(3) == "down":
                one(name, f"blk.{bid}.ffn_down_exps.weight", shape)
            else:  # (E, 2 * ff, H), gate rows first
                ff = shape[1] // 2
                half = (shape[0], ff, shape[2])
                add([name], [(f"blk.{bid}.ffn_gate_exps.weight", half), (f"blk.{bid}.ffn_up_exps.weight", half)],
                    lambda ws, ff=ff: [ws[0][:, :ff], ws[0][:, ff:]],
                    lambda dqs, ws: [np.concatenate(dqs, axis=1)])
            continue
        if name.endswith("linear_attn.in_proj_qkvz.weight"):
            bid = hybrid_block(name, n_layers)[0]
            per_head = 2 * dk + 2 * r * dv
            hidden = shape[1]

            def split(ws, hidden=hidden):
                w = ws[0].reshape(nk, per_head, hidden)
                q, k, v, z = np.split(w, [dk, 2 * dk, 2 * dk + r * dv], axis=1)
                return [np.concatenate([q.reshape(-1, hidden), k.reshape(-1, hidden), v.reshape(-1, hidden)]),
                        z.reshape(-1, hidden)]

            def join(dqs, ws, hidden=hidden):
                qkv, z = dqs
                q = qkv[:nk * dk].reshape(nk, dk, hidden)
                k = qkv[nk * dk:qk_rows].reshape(nk, dk, hidden)
                v = qkv[qk_rows:].reshape(nk, r * dv, hidden)
                return [np.concatenate([q, k, v, z.reshape(nk, r * dv, hidden)], axis=1).reshape(-1, hidden)]
            add([name], [(f"blk.{bid}.attn_qkv.weight", (qk_rows + nv * dv, hidden)),
                         (f"blk.{bid}.attn_gate.weight", (nv * dv, hidden))], split, join)
            continue
        g = hybrid_gguf_name(name, n_layers)
        stem = g.removesuffix(".weight").removesuffix(".bias")
        what = stem.split(".", 2)[2] if stem.startswith("blk.") else stem
        if what in NORM_OFFSET:
            one(name, g, shape, lambda w: w + np.float32(1), lambda dq, w: dq - np.float32(1))
        elif what == "ssm_a":
            def fwd(w):
                a = (-np.exp(w.astype(np.float64))).astype(np.float32)
                return v_heads_tiled(a, 0, nk, r, 1) if tiled else a
            one(name, g, shape, fwd, lambda dq, w: w)  # A_log itself: the loader must recover it
        elif what == "ssm_conv1d":
            def fwd(w):
                c = w.reshape(w.shape[0], w.shape[2])
                if tiled:
                    c = np.concatenate([c[:qk_rows], v_heads_tiled(c[qk_rows:], 0, nk, r, dv)])
                return c

            def inv(dq, w):
                if tiled:
                    dq = np.concatenate([dq[:qk_rows], v_heads_grouped(dq[qk_rows:], 0, nk, r, dv)])
                return dq.reshape(w.shape)
            one(name, g, (shape[0], shape[2]), fwd, inv)
        elif tiled and what in ("attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha", "ssm_dt", "ssm_out"):
            axis = 1 if what == "ssm_out" else 0
            first = qk_rows if what == "attn_qkv" else 0  # q and k rows keep their order
            d = dv if what in ("attn_qkv", "attn_gate", "ssm_out") else 1

            def fwd(w, axis=axis, first=first, d=d):
                head, rest = np.split(w, [first], axis=axis)
                return np.concatenate([head, v_heads_tiled(rest, axis, nk, r, d)], axis=axis)

            def inv(dq, w, axis=axis, first=first, d=d):
                head, rest = np.split(dq, [first], axis=axis)
                return np.concatenate([head, v_heads_grouped(rest, axis, nk, r, d)], axis=axis)
            one(name, g, shape, fwd, inv)
        else:
            one(name, g, shape)
    proj_names = {"gate": "ffn_gate_exps", "up": "ffn_up_exps", "down": "ffn_down_exps"}
    for bid in sorted(stacks):
        for proj, members in sorted(stacks[bid].items()):
            names = [n for _, n in sorted(members)]
            shape = (len(names),) + tuple(tensors[names[0]].shape)
            add(names, [(f"blk.{bid}.{proj_names[proj]}.weight", shape)],
                lambda ws: [np.stack(ws)], lambda dqs, ws: list(dqs[0]))
    return out


def convert(args):
    cfg = json.load(open(os.path.join(args.model, "config.json")))
    arch = ARCH.get(cfg["architectures"][0])
    if arch is None:
        sys.exit(f"make_gguf: architecture {cfg['architectures'][0]} is not converted")
    tensors = load_model(args.model)
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads") or n_head
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head
    rope = cfg.get("rope_parameters") or dict(cfg.get("rope_scaling") or {}, rope_theta=cfg.get("rope_theta", 10000.0))
    md = {"general.architecture": arch, "general.name": os.path.basename(os.path.normpath(args.model)),
          "general.alignment": 32}
    p = arch + "."
    md[p + "context_length"] = cfg.get("max_position_embeddings", 2048)
    md[p + "embedding_length"] = cfg["hidden_size"]
    md[p + "block_count"] = cfg["num_hidden_layers"]
    md[p + "feed_forward_length"] = cfg.get("intermediate_size", 0)
    md[p + "attention.head_count"] = n_head
    md[p + "attention.head_count_kv"] = n_kv
    md[p + "attention.key_length"] = head_dim
    md[p + "attention.value_length"] = head_dim
    md[p + "attention.layer_norm_rms_epsilon"] = float(cfg.get("rms_norm_eps", 1e-6))
    md[p + "rope.freq_base"] = float(rope.get("rope_theta", 10000.0))
    md[p + "rope.dimension_count"] = head_dim
    if arch == "qwen3moe":
        md[p + "expert_count"] = cfg.get("num_experts") or cfg.get("num_local_experts")
        md[p + "expert_used_count"] = cfg["num_experts_per_tok"]
        md[p + "expert_feed_forward_length"] = cfg["moe_intermediate_size"]
        md[p + "expert_weights_norm"] = bool(cfg.get("norm_topk_prob", True))
    md.update(tokenizer_metadata(args.tokenizer or args.model, args.pre, cfg["vocab_size"]))

    out_tensors, dequantized = [], {}
    keep = args.dequantized_out is not None
    if arch in HYBRID:
        md.update(hybrid_metadata(cfg, arch, tensors, rope, head_dim))
        if "intermediate_size" not in cfg:  # Qwen3.5-MoE: no dense MLP, no key
            del md[p + "feed_forward_length"]
        write_gguf(args.out, md, hybrid_tensors(cfg, arch, tensors, args.type, dequantized if keep else None))
        if arch == "qwen3next":  # the file cannot say otherwise: llama.cpp renormalises the top-k
            cfg = dict(cfg, norm_topk_prob=True)
        write_reference(args, cfg, dequantized)
        return

    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "llama3":
        f = rope_factors(rope, head_dim)
        out_tensors.append(("rope_freqs.weight", [len(f)], GGML["f32"], f.nbytes, f.tobytes))
    elif rope_type not in ("default", None):
        sys.exit(f"make_gguf: rope type {rope_type} is not converted")
    prefix = "model."
    for name in sorted(tensors):
        shape = tensors[name].shape
        if name == "lm_head.weight":
            g = "output.weight"
        elif name == prefix + "embed_tokens.weight":
            g = "token_embd.weight"
        elif name == prefix + "norm.weight":
            g = "output_norm.weight"
        elif name.startswith(prefix + "layers."):
            rest = name[len(prefix + "layers."):]
            layer, _, rest = rest.partition(".")
            base, _, kind = rest.rpartition(".")
            if base.startswith("mlp.experts."):
                continue  # stacked below
            g = f"blk.{layer}.{LAYER_NAMES[base]}.{kind}"
        else:
            sys.exit(f"make_gguf: no GGUF name for {name}")
        kind = choose_type(g, shape, args.type)
        permute = None
        if arch == "llama" and (".attn_q." in g or ".attn_k." in g):
            permute = n_head if ".attn_q." in g else n_kv

        def produce(name=name, kind=kind, permute=permute):
            w = tensors[name]()
            stored = llama_permute(w, permute) if permute else w
            data, dq = encode(stored.reshape(stored.shape[0], -1) if stored.ndim > 1 else stored, kind)
            if keep:
                if permute:  # back to the checkpoint's row order for the reference
                    hd = w.shape[0] // permute
                    dq = dq.reshape(permute, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
                dequantized[name] = dq.reshape(w.shape)
            return data
        out_tensors.append((g, list(shape), GGML[kind], n_bytes(shape, kind), produce))
    if arch == "qwen3moe":
        n_e = md[p + "expert_count"]
        for layer in range(cfg["num_hidden_layers"]):
            for proj, gname in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
                names = [f"{prefix}layers.{layer}.mlp.experts.{e}.{proj}.weight" for e in range(n_e)]
                if names[0] not in tensors:
                    continue
                shape = (n_e,) + tuple(tensors[names[0]].shape)
                kind = choose_type(gname, shape, args.type)

                def produce(names=names, kind=kind, shape=shape):
                    stack = np.stack([tensors[n]() for n in names])
                    data, dq = encode(stack.reshape(-1, stack.shape[-1]), kind)
                    if keep:
                        for e, n in enumerate(names):
                            dequantized[n] = dq.reshape(shape)[e]
                    return data
                out_tensors.append((f"blk.{layer}.{gname}.weight", list(shape), GGML[kind], n_bytes(shape, kind), produce))
    write_gguf(args.out, md, out_tensors)
    write_reference(args, cfg, dequantized)


def write_reference(args, cfg, dequantized):
    """The dequantized model as an f32 safetensors directory (--dequantized-out)."""
    if args.dequantized_out:
        os.makedirs(args.dequantized_out, exist_ok=True)
        cfg_out = dict(cfg)
        cfg_out["dtype"] = "float32"
        cfg_out.pop("torch_dtype", None)
        json.dump(cfg_out, open(os.path.join(args.dequantized_out, "config.json"), "w"), indent=2)
        write_f32_safetensors(os.path.join(args.dequantized_out, "model.safetensors"), dequantized)
        for extra in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
            if os.path.exists(os.path.join(args.model, extra)):
                shutil.copy(os.path.join(args.model, extra), args.dequantized_out)


def golden(path):
    """Random blocks of each format (valid scales, every bit pattern of the quants) and the
    float32 values the format defines for them: [u32 n_types] then per type
    [u32 ggml type][u32 rows][u32 cols][u32 n_bytes][bytes][rows*cols f32]."""
    rng = np.random.default_rng(1234)
    kinds = (("q8_0", 96), ("q4_k", 512), ("q6_k", 512), ("q5_k", 512), ("q4_0", 96), ("q4_1", 96),
             ("q5_0", 96), ("q5_1", 96), ("q2_k", 512), ("q3_k", 512), ("iq4_nl", 96), ("iq4_xs", 512))
    out = bytearray(struct.pack("<I", len(kinds)))
    for kind, cols in kinds:
        rows = 5
        per_block = BLOCK_BYTES[kind]
        nbytes = rows * cols // BLOCK[kind] * per_block
        raw = rng.integers(0, 256, nbytes, dtype=np.uint8)
        blocks = raw.reshape(-1, per_block)
        scales = f16(rng.uniform(-2, 2, (blocks.shape[0], 2))).view(np.uint8).reshape(-1, 4)
        if kind in ("q8_0", "q4_0", "q5_0", "iq4_nl", "iq4_xs"):
            blocks[:, 0:2] = scales[:, 0:2]
        elif kind == "q2_k":
            blocks[:, 80:84] = scales
        elif kind == "q3_k":
            blocks[:, 108:110] = scales[:, 0:2]
        elif kind in ("q4_1", "q5_1"):
            blocks[:, 0:4] = scales
        elif kind in ("q4_k", "q5_k"):
            blocks[:, 0:4] = scales
        else:
            blocks[:, 208:210] = scales[:, 0:2]
        b = blocks.reshape(rows, -1)
        values = QUANT[kind][1](b, cols)
        out += struct.pack("<IIII", GGML[kind], rows, cols, nbytes) + b.tobytes() + values.astype(np.float32).tobytes()
    with open(path, "wb") as f:
        f.write(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--out")
    ap.add_argument("--type", default="q8_0", choices=["f32", "f16", "bf16", "q8_0", "q4_k", "q5_k", "q6_k", "q4_k_m",
                                                       "q5_k_m", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k",
                                                       "q3_k_m", "iq4_nl", "iq4_xs"])
    ap.add_argument("--dequantized-out")
    ap.add_argument("--pre", default="qwen2", help="tokenizer.ggml.pre (qwen2, qwen35, llama-bpe)")
    ap.add_argument("--tokenizer", help="directory of tokenizer.json / tokenizer_config.json (default --model)")
    ap.add_argument("--golden")
    args = ap.parse_args()
    if args.golden:
        golden(args.golden)
        return
    if not args.model or not args.out:
        ap.error("--model and --out are required")
    convert(args)


if __name__ == "__main__":
    main()
