#!/usr/bin/env python3
"""Writes a quantized random-init model at real size from a random bf16 one
(tools/make_random_model.py): every linear layer of the decoder layers (q/k/v/o, gate/up/down,
Gated DeltaNet projections, shared experts; not the router, the embedding or the LM head) gets
random codes in the format's published layout, everything else is copied byte for byte.

  --format fp8    F8_E4M3 weights with an F32 weight_scale_inv per 128 x 128 block and
                  quantization_config {"quant_method": "fp8", "weight_block_size": [128, 128]}
                  (Qwen's *-FP8 releases)
  --format mlx4   MLX affine 4-bit: U32 words, BF16 scales and biases per --group-size (64)
                  columns, config "quantization": {"group_size": 64, "bits": 4}
  --format gptq   GPTQ int4: qweight I32 [in/8, out], qzeros I32 [in/G, out/8] (zero 8, stored
                  as 7), F16 scales [in/G, out], g_idx I32 [in] = i / G, group --group-size (128)
  --format gptq-act-order   the same with desc_act: g_idx groups over a permuted order of the
                  inputs (one order per input width, as q/k/v and gate/up of a GPTQ layer share)

The codes are random (normal values rounded to e4m3; uniform 4-bit codes with a scale and bias
that give the bf16 model's std), which is all a speed benchmark needs; the quantization tools
(make_fp8.py, make_mlx.py, make_int4.py) quantize real weights for the correctness tests but
are too slow for 8B parameters. numpy only.

  make_random_quantized.py --model DIR --out DIR --format fp8|mlx4|gptq|gptq-act-order
                           [--group-size G] [--std 0.02]
"""
import argparse
import concurrent.futures as cf
import json
import os
import re
import shutil
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_io import bf16, read_header  # noqa: E402

LINEAR = re.compile(r"^model\.layers\.\d+\..*(_proj|shared_expert\.(gate|up|down)_proj)\.weight$")


def fp8_codes(rng, n, std):
    """e4m3fn codes of N(0, 16) values (scale std/16 gives the model's std): via f16 bits."""
    h = (rng.standard_normal(n, dtype=np.float32) * 16).astype(np.float16).view(np.uint16)
    sign = (h >> 15).astype(np.uint8)
    exp = ((h >> 10) & 31).astype(np.int16) - 8  # f16 bias 15 -> e4m3 bias 7
    man = ((h >> 7) & 7).astype(np.uint8)
    code = (np.clip(exp, 0, 15).astype(np.uint8) << 3) | man
    code[exp <= 0] = 0  # tiny values flush to zero
    code[code == 0x7F] = 0x7E  # largest finite, never NaN
    return code | (sign << 7)


def tensors_of(name, shape, fmt, gs, std):
    """[(name, dtype, shape, generator(rng) -> bytes)] replacing one linear weight."""
    rows, cols = shape
    if fmt == "fp8":
        sr, sc = -(-rows // 128), -(-cols // 128)
        return [(name, "F8_E4M3", [rows, cols], lambda rng: fp8_codes(rng, rows * cols, std)),
                (name + "_scale_inv", "F32", [sr, sc],
                 lambda rng: np.full(sr * sc, std / 16, np.float32))]
    base = name[: -len(".weight")]
    s = std / 4.6  # uniform 0..15 codes have sd 4.6
    if fmt.startswith("gptq"):
        g = cols // gs

        def g_idx(rng):
            gi = (np.arange(cols) // gs).astype(np.int32)
            if fmt == "gptq-act-order":  # one input order per width (a fixed seed)
                gi[np.random.default_rng(cols).permutation(cols)] = np.arange(cols) // gs
            return gi
        return [(base + ".qweight", "I32", [cols // 8, rows],
                 lambda rng: rng.integers(0, 2**32, rows * cols // 8, dtype=np.uint32)),
                (base + ".qzeros", "I32", [g, rows // 8],
                 lambda rng: np.full(g * rows // 8, 0x77777777, np.uint32)),
                (base + ".scales", "F16", [g, rows], lambda rng: np.full(g * rows, s, np.float16)),
                (base + ".g_idx", "I32", [cols], g_idx)]
    g = cols // gs
    return [(name, "U32", [rows, cols // 8],
             lambda rng: rng.integers(0, 2**32, rows * cols // 8, dtype=np.uint32)),
            (base + ".scales", "BF16", [rows, g], lambda rng: bf16(np.full(rows * g, s, np.float32))[0]),
            (base + ".biases", "BF16", [rows, g],
             lambda rng: bf16(np.full(rows * g, -7.5 * s, np.float32))[0])]


SIZES = {"F8_E4M3": 1, "U32": 4, "I32": 4, "F32": 4, "BF16": 2, "F16": 2}


def convert_shard(src, dst, fmt, gs, std, seed):
    n, hdr = read_header(src)
    meta = hdr.pop("__metadata__", None)
    data = np.memmap(src, dtype=np.uint8, mode="r", offset=8 + n)
    out = []  # (name, dtype, shape, source: ("copy", b, e) | ("gen", fn))
    for name, e in sorted(hdr.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        if LINEAR.match(name) and len(e["shape"]) == 2 and e["shape"][1] % gs == 0:
            for t in tensors_of(name, e["shape"], fmt, gs, std):
                out.append((t[0], t[1], t[2], ("gen", t[3])))
        else:
            out.append((name, e["dtype"], e["shape"], ("copy",) + tuple(e["data_offsets"])))
    header, off = {}, 0
    for name, dtype, shape, _ in out:
        nbytes = int(np.prod(shape)) * SIZES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + nbytes]}
        off += nbytes
    if meta is not None:
        header["__metadata__"] = meta
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((-len(raw)) % 8)
    with open(dst + ".partial", "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        with cf.ThreadPoolExecutor(max_workers=os.cpu_count() or 4) as pool:
            jobs = []
            for i, (name, dtype, shape, source) in enumerate(out):
                if source[0] == "gen":
                    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, i])))
                    jobs.append(pool.submit(source[1], rng))
                else:
                    jobs.append(None)
            for (name, dtype, shape, source), job in zip(out, jobs):
                if job is None:
                    f.write(memoryview(data[source[1]:source[2]]))
                else:
                    f.write(memoryview(np.ascontiguousarray(job.result())))
    os.replace(dst + ".partial", dst)
    return {name: os.path.basename(dst) for name, *_ in out}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a random bf16 model directory")
    ap.add_argument("--out", required=True)
    ap.add_argument("--format", required=True, choices=["fp8", "mlx4", "gptq", "gptq-act-order"])
    ap.add_argument("--group-size", type=int, help="MLX group size (default 64), GPTQ (128)")
    ap.add_argument("--std", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cfg = json.load(open(os.path.join(args.model, "config.json")))
    gptq = args.format.startswith("gptq")
    gs = 128 if args.format == "fp8" else args.group_size or (128 if gptq else 64)
    if args.format == "fp8":
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": [128, 128]}
    elif gptq:
        cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": gs,
                                      "desc_act": args.format == "gptq-act-order", "sym": False,
                                      "checkpoint_format": "gptq"}
    else:
        cfg["quantization"] = {"group_size": gs, "bits": 4}
    json.dump(cfg, open(os.path.join(args.out, "config.json"), "w"), indent=2, sort_keys=True)
    for fn in os.listdir(args.model):
        if not fn.endswith(".safetensors") and fn != "config.json" and fn != "model.safetensors.index.json":
            shutil.copy(os.path.join(args.model, fn), os.path.join(args.out, fn))
    shards = sorted(fn for fn in os.listdir(args.model) if fn.endswith(".safetensors"))
    weight_map = {}
    for i, fn in enumerate(shards):
        weight_map.update(convert_shard(os.path.join(args.model, fn), os.path.join(args.out, fn), args.format, gs,
                                        args.std, args.seed * 1000 + i))
        print(f"wrote {fn}", file=sys.stderr)
    if len(shards) > 1:
        json.dump({"metadata": {}, "weight_map": weight_map},
                  open(os.path.join(args.out, "model.safetensors.index.json"), "w"), indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
