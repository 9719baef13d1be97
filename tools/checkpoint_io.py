"""Checkpoint I/O shared by Kestrel's quantized-checkpoint writers (make_gguf.py, make_fp8.py,
make_mlx.py, make_int4.py): safetensors read memory-mapped and written, bf16 rounding, and the
two directories each writer produces (the quantized checkpoint, and the same model with its
dequantized weights in f32, the reference its logits must equal). numpy only."""
import json
import os
import shutil
import struct

import numpy as np

ST_DTYPES = {"F32": np.float32, "F16": np.float16}
EXTRAS = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja")


def read_header(path):
    """(header length, header dict) of a safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return n, json.loads(f.read(n))


def read_safetensors(path):
    """name -> zero-argument function giving the tensor as float32 (memory-mapped: a model is
    converted one tensor at a time, whatever its size); each function has .shape."""
    n, header = read_header(path)
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue

        def load(e=e):
            raw = data[e["data_offsets"][0]:e["data_offsets"][1]]
            if e["dtype"] == "BF16":
                a = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            else:
                a = raw.view(ST_DTYPES[e["dtype"]]).astype(np.float32)
            return a.reshape(e["shape"])
        load.shape = tuple(e["shape"])
        out[name] = load
    return out


def load_model(model_dir):
    tensors = {}
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        for shard in sorted(set(json.load(open(index))["weight_map"].values())):
            tensors.update(read_safetensors(os.path.join(model_dir, shard)))
    else:
        tensors.update(read_safetensors(os.path.join(model_dir, "model.safetensors")))
    return tensors


def write_raw_safetensors(path, tensors):
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


def write_f32_safetensors(path, tensors):
    """tensors: name -> float32 array."""
    write_raw_safetensors(path, {n: ("F32", np.shape(a), np.ascontiguousarray(a, dtype=np.float32).tobytes())
                                 for n, a in tensors.items()})


def bf16(x):
    """(bf16 bits, their float32 values) of x, rounded to nearest even."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return r, (r.astype(np.uint32) << 16).view(np.float32)


def keep_bf16(name, w, out, deq):
    """A tensor the writer leaves unquantized: bf16 in the checkpoint, its value in the reference."""
    r, v = bf16(w)
    out[name] = ("BF16", w.shape, r.tobytes())
    deq[name] = v.reshape(w.shape)


def write_checkpoints(model_dir, cfg, quantized_cfg, out_dir, tensors, dequantized_dir, deq):
    """The quantized checkpoint (tensors: name -> (dtype, shape, bytes); config.json with the
    quantization fields of quantized_cfg added) and, when dequantized_dir is given, the f32
    reference directory; both with the model's tokenizer and generation files."""
    os.makedirs(out_dir, exist_ok=True)
    write_raw_safetensors(os.path.join(out_dir, "model.safetensors"), tensors)
    json.dump(dict(cfg, **quantized_cfg), open(os.path.join(out_dir, "config.json"), "w"), indent=2)
    dirs = [out_dir]
    if dequantized_dir:
        os.makedirs(dequantized_dir, exist_ok=True)
        json.dump(dict(cfg, dtype="float32"), open(os.path.join(dequantized_dir, "config.json"), "w"), indent=2)
        write_f32_safetensors(os.path.join(dequantized_dir, "model.safetensors"), deq)
        dirs.append(dequantized_dir)
    for d in dirs:
        for extra in EXTRAS:
            if os.path.exists(os.path.join(model_dir, extra)):
                shutil.copy(os.path.join(model_dir, extra), d)
