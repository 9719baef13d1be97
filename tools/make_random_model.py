#!/usr/bin/env python3
"""Write a random-init Hugging Face model directory at real size, without torch.

Kestrel uses these directories to test loading, memory planning and speed on real
shapes (Qwen3-0.6B, Qwen3-8B, Llama-3.1-8B) without downloading any weights. The
numbers are random, so the model's text is noise; only shapes, names, dtypes and
file layout match the published checkpoints.

What is written into --out:
  config.json                      legacy spelling (rope_theta + rope_scaling), torch_dtype bfloat16
  generation_config.json           eos/bos/pad ids and sampling defaults of the real model
  model.safetensors                (one shard), or
  model-0000i-of-0000n.safetensors + model.safetensors.index.json (sharded)
  tokenizer.json, tokenizer_config.json, ...   copied from --tokenizer-dir

Weights: bf16, N(0, --std) for matrices and biases, 1.0 for every RMSNorm weight.
Deterministic: tensor k, chunk j is drawn from numpy's PCG64 seeded with
SeedSequence([seed, k, j]); the result does not depend on the thread count.

Streaming: all shapes are known up front, so each shard's header is computed before
its data; tensors are then generated chunk by chunk (a few MB each, on a thread pool)
and written in order. Memory stays bounded (~ threads x chunk), whatever the model size.

Needs only Python 3 + numpy (works with Debian's python3-numpy).

Examples:
  python3 tools/make_random_model.py --preset qwen3-0.6b --out /tmp/qwen3-0.6b-random
  python3 tools/make_random_model.py --preset llama-3.1-8b --out /data/llama8b-random
  python3 tools/make_random_model.py --config-json my/config.json --tokenizer-dir tok/ --out /tmp/m
  python3 tools/make_random_model.py --smoke
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import shutil
import sys
import time
from collections import deque

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# --------------------------------------------------------------------------------------
# Presets: config.json exactly as the published checkpoints spell it (legacy rope keys).
# --------------------------------------------------------------------------------------

_QWEN3_COMMON = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "model_type": "qwen3",
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

_QWEN3_GENERATION = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
}

PRESETS = {
    "qwen3-0.6b": {
        "config": dict(
            _QWEN3_COMMON,
            hidden_size=1024,
            intermediate_size=3072,
            max_position_embeddings=40960,
            max_window_layers=28,
            num_attention_heads=16,
            num_hidden_layers=28,
            tie_word_embeddings=True,
        ),
        "generation": _QWEN3_GENERATION,
        "tokenizer_dir": "tests/data/npm/qwen3",
    },
    "qwen3-8b": {
        "config": dict(
            _QWEN3_COMMON,
            hidden_size=4096,
            intermediate_size=12288,
            max_position_embeddings=40960,
            max_window_layers=36,
            num_attention_heads=32,
            num_hidden_layers=36,
            tie_word_embeddings=False,
        ),
        "generation": _QWEN3_GENERATION,
        "tokenizer_dir": "tests/data/npm/qwen3",
    },
    "llama-3.1-8b": {
        "config": {
            "architectures": ["LlamaForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 128000,
            "eos_token_id": [128001, 128008, 128009],
            "hidden_act": "silu",
            "hidden_size": 4096,
            "initializer_range": 0.02,
            "intermediate_size": 14336,
            "max_position_embeddings": 131072,
            "mlp_bias": False,
            "model_type": "llama",
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "num_key_value_heads": 8,
            "pretraining_tp": 1,
            "rms_norm_eps": 1e-05,
            "rope_scaling": {
                "factor": 8.0,
                "high_freq_factor": 4.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3",
            },
            "rope_theta": 500000.0,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "use_cache": True,
            "vocab_size": 128256,
        },
        "generation": {
            "bos_token_id": 128000,
            "do_sample": True,
            "eos_token_id": [128001, 128008, 128009],
            "temperature": 0.6,
            "top_p": 0.9,
        },
        "tokenizer_dir": "tests/data/npm/llama3",
    },
}

# Qwen3.5-27B-shaped hybrid (3 Gated DeltaNet layers, then one gated full-attention layer; about
# 27B parameters). For the CPU, scale it down with e.g. --set num_hidden_layers=8.
PRESETS["qwen3.5-27b"] = {
    "config": {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "attention_bias": False,
        "attn_output_gate": True,
        "bos_token_id": 248044,
        "eos_token_id": 248044,
        "full_attention_interval": 4,
        "head_dim": 256,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 48,
        "linear_value_head_dim": 128,
        "max_position_embeddings": 262144,
        "num_attention_heads": 24,
        "num_hidden_layers": 64,
        "num_key_value_heads": 4,
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000000,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 248320,
    },
    "generation": {"bos_token_id": 248044, "eos_token_id": 248044, "do_sample": True,
                   "temperature": 0.6, "top_k": 20, "top_p": 0.95},
    "tokenizer_dir": "tests/data/npm/qwen3",
}

# Qwen3.5-35B-A3B-shaped hybrid MoE (40 layers: 3 Gated DeltaNet then 1 gated attention; every
# layer a 256-expert top-8 MoE with a gated shared expert; about 35B parameters, 3B active per
# token; 70 GB in bf16), otherwise the 27B's settings. The experts use the fused transformers-5
# layout (experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I]). Scale it down with e.g.
# --set num_hidden_layers=20.
PRESETS["qwen3.5-35b-a3b"] = {
    "config": {
        **{k: v for k, v in PRESETS["qwen3.5-27b"]["config"].items() if k != "intermediate_size"},
        "architectures": ["Qwen3_5MoeForCausalLM"],
        "model_type": "qwen3_5_moe_text",
        "hidden_size": 2048,
        "linear_num_value_heads": 32,
        "moe_intermediate_size": 512,
        "num_attention_heads": 16,
        "num_experts": 256,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 40,
        "num_key_value_heads": 2,
        "shared_expert_intermediate_size": 512,
    },
    "generation": PRESETS["qwen3.5-27b"]["generation"],
    "tokenizer_dir": PRESETS["qwen3.5-27b"]["tokenizer_dir"],
}

# A tiny Qwen3-shaped model for --smoke: real vocabulary (so the real tokenizer fits),
# untied head, q dim (4*16=64) != hidden (48), GQA 2:1, and small shards to exercise sharding.
SMOKE_CONFIG = dict(
    _QWEN3_COMMON,
    head_dim=16,
    hidden_size=48,
    intermediate_size=96,
    max_position_embeddings=4096,
    max_window_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
    tie_word_embeddings=False,
)

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_5_text", "qwen3_5_moe_text")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


def log(msg: str) -> None:
    print(f"[make_random_model {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------------------
# Config handling
# --------------------------------------------------------------------------------------


def to_legacy_rope(cfg: dict) -> dict:
    """transformers >= 5 writes `rope_parameters`; published checkpoints use rope_theta + rope_scaling."""
    cfg = dict(cfg)
    rp = cfg.pop("rope_parameters", None)
    if isinstance(rp, dict) and rp:
        if "rope_theta" in rp and "rope_theta" not in cfg:
            cfg["rope_theta"] = rp["rope_theta"]
        scaling = {k: v for k, v in rp.items() if k != "rope_theta"}
        rtype = scaling.get("rope_type", scaling.get("type", "default"))
        if rtype == "default" and set(scaling) <= {"rope_type", "type"}:
            cfg.setdefault("rope_scaling", None)
        else:
            cfg["rope_scaling"] = scaling
    # transformers 5 writes `dtype`; the published spelling is `torch_dtype`.
    if "dtype" in cfg:
        cfg.pop("dtype")
    cfg["torch_dtype"] = "bfloat16"
    return cfg


def parse_override(s: str):
    if "=" not in s:
        raise SystemExit(f"--set expects key=value, got {s!r}")
    k, v = s.split("=", 1)
    try:
        v = json.loads(v)
    except json.JSONDecodeError:
        pass  # plain string
    return k, v


def tensor_plan(cfg: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, init) in Hugging Face naming and order. init is 'normal' or 'ones'."""
    mt = cfg.get("model_type")
    if mt not in SUPPORTED_TYPES:
        raise SystemExit(f"model_type {mt!r} is not supported (supported: {', '.join(SUPPORTED_TYPES)})")
    H = int(cfg["hidden_size"])
    L = int(cfg["num_hidden_layers"])
    nh = int(cfg["num_attention_heads"])
    nkv = int(cfg.get("num_key_value_heads") or nh)
    hd = int(cfg.get("head_dim") or (H // nh))
    I = int(cfg.get("intermediate_size", 0))
    V = int(cfg["vocab_size"])
    tied = bool(cfg.get("tie_word_embeddings", False))
    qkv_bias = mt == "qwen2" or bool(cfg.get("attention_bias", False))
    o_bias = mt != "qwen2" and bool(cfg.get("attention_bias", False))
    mlp_bias = bool(cfg.get("mlp_bias", False))
    qk_norm = mt in ("qwen3", "qwen3_5_text", "qwen3_5_moe_text")
    hybrid = mt in ("qwen3_5_text", "qwen3_5_moe_text")
    moe = mt == "qwen3_5_moe_text"

    plan = [("model.embed_tokens.weight", (V, H), "normal")]
    if hybrid:
        # (1 + w) norms: small random w; the gated norm of the delta rule is a plain weight.
        interval = int(cfg.get("full_attention_interval", 4))
        types = cfg.get("layer_types") or [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(L)]
        nk, nv = int(cfg["linear_num_key_heads"]), int(cfg["linear_num_value_heads"])
        dk, dv = int(cfg["linear_key_head_dim"]), int(cfg["linear_value_head_dim"])
        K = int(cfg["linear_conv_kernel_dim"])
        conv_dim = 2 * nk * dk + nv * dv
        for i in range(L):
            p = f"model.layers.{i}."
            plan.append((p + "input_layernorm.weight", (H,), "normal"))
            if types[i] == "linear_attention":
                a = p + "linear_attn."
                plan += [(a + "in_proj_qkv.weight", (conv_dim, H), "normal"),
                         (a + "in_proj_z.weight", (nv * dv, H), "normal"),
                         (a + "in_proj_b.weight", (nv, H), "normal"),
                         (a + "in_proj_a.weight", (nv, H), "normal"),
                         (a + "conv1d.weight", (conv_dim, 1, K), "normal"),
                         (a + "A_log", (nv,), "normal"),
                         (a + "dt_bias", (nv,), "ones"),
                         (a + "norm.weight", (dv,), "ones"),
                         (a + "out_proj.weight", (H, nv * dv), "normal")]
            else:
                a = p + "self_attn."
                plan += [(a + "q_proj.weight", (2 * nh * hd, H), "normal"),
                         (a + "k_proj.weight", (nkv * hd, H), "normal"),
                         (a + "v_proj.weight", (nkv * hd, H), "normal"),
                         (a + "o_proj.weight", (H, nh * hd), "normal"),
                         (a + "q_norm.weight", (hd,), "normal"),
                         (a + "k_norm.weight", (hd,), "normal")]
            plan.append((p + "post_attention_layernorm.weight", (H,), "normal"))
            if moe:
                E, Ie = int(cfg["num_experts"]), int(cfg["moe_intermediate_size"])
                Is = int(cfg.get("shared_expert_intermediate_size", 0))
                m = p + "mlp."
                plan += [(m + "gate.weight", (E, H), "normal"),
                         (m + "experts.gate_up_proj", (E, 2 * Ie, H), "normal"),
                         (m + "experts.down_proj", (E, H, Ie), "normal")]
                if Is:
                    plan += [(m + "shared_expert.gate_proj.weight", (Is, H), "normal"),
                             (m + "shared_expert.up_proj.weight", (Is, H), "normal"),
                             (m + "shared_expert.down_proj.weight", (H, Is), "normal"),
                             (m + "shared_expert_gate.weight", (1, H), "normal")]
            else:
                plan += [(p + "mlp.gate_proj.weight", (I, H), "normal"),
                         (p + "mlp.up_proj.weight", (I, H), "normal"),
                         (p + "mlp.down_proj.weight", (H, I), "normal")]
        plan.append(("model.norm.weight", (H,), "normal"))
        if not tied:
            plan.append(("lm_head.weight", (V, H), "normal"))
        return plan
    for i in range(L):
        p = f"model.layers.{i}."
        plan.append((p + "input_layernorm.weight", (H,), "ones"))
        plan.append((p + "self_attn.q_proj.weight", (nh * hd, H), "normal"))
        if qkv_bias:
            plan.append((p + "self_attn.q_proj.bias", (nh * hd,), "normal"))
        plan.append((p + "self_attn.k_proj.weight", (nkv * hd, H), "normal"))
        if qkv_bias:
            plan.append((p + "self_attn.k_proj.bias", (nkv * hd,), "normal"))
        plan.append((p + "self_attn.v_proj.weight", (nkv * hd, H), "normal"))
        if qkv_bias:
            plan.append((p + "self_attn.v_proj.bias", (nkv * hd,), "normal"))
        plan.append((p + "self_attn.o_proj.weight", (H, nh * hd), "normal"))
        if o_bias:
            plan.append((p + "self_attn.o_proj.bias", (H,), "normal"))
        if qk_norm:
            plan.append((p + "self_attn.q_norm.weight", (hd,), "ones"))
            plan.append((p + "self_attn.k_norm.weight", (hd,), "ones"))
        plan.append((p + "post_attention_layernorm.weight", (H,), "ones"))
        plan.append((p + "mlp.gate_proj.weight", (I, H), "normal"))
        if mlp_bias:
            plan.append((p + "mlp.gate_proj.bias", (I,), "normal"))
        plan.append((p + "mlp.up_proj.weight", (I, H), "normal"))
        if mlp_bias:
            plan.append((p + "mlp.up_proj.bias", (I,), "normal"))
        plan.append((p + "mlp.down_proj.weight", (H, I), "normal"))
        if mlp_bias:
            plan.append((p + "mlp.down_proj.bias", (H,), "normal"))
    plan.append(("model.norm.weight", (H,), "ones"))
    if not tied:
        plan.append(("lm_head.weight", (V, H), "normal"))
    return plan


# --------------------------------------------------------------------------------------
# bf16 generation
# --------------------------------------------------------------------------------------


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), round to nearest even. Consumes x (in place).

    NaN/Inf are not expected (inputs are finite normals); they are not special-cased.
    """
    u = x.view(np.uint32)
    lsb = u >> 16
    lsb &= 1
    lsb += 0x7FFF
    u += lsb
    u >>= 16
    return u.astype(np.uint16)


BF16_ONE = np.uint16(0x3F80)


def make_chunk(seed: int, tensor_idx: int, chunk_idx: int, n: int, init: str, std: float) -> np.ndarray:
    if init == "ones":
        return np.full(n, BF16_ONE, dtype=np.uint16)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, tensor_idx, chunk_idx])))
    x = rng.standard_normal(n, dtype=np.float32)
    x *= np.float32(std)
    return f32_to_bf16_bits(x)


# --------------------------------------------------------------------------------------
# safetensors writing
# --------------------------------------------------------------------------------------


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def plan_shards(plan, max_shard_bytes: int):
    """Greedy split in plan order; a tensor larger than the limit gets its own shard."""
    shards, cur, cur_bytes = [], [], 0
    for k, (name, shape, init) in enumerate(plan):
        nbytes = numel(shape) * 2
        if cur and cur_bytes + nbytes > max_shard_bytes:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(k)
        cur_bytes += nbytes
    if cur:
        shards.append(cur)
    return shards


def build_header(plan, idxs) -> bytes:
    hdr = {"__metadata__": {"format": "pt"}}
    off = 0
    for k in idxs:
        name, shape, _ = plan[k]
        nbytes = numel(shape) * 2
        hdr[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
    raw = json.dumps(hdr, separators=(",", ":")).encode("utf-8")
    raw += b" " * ((-len(raw)) % 8)  # data starts 8-byte aligned, as safetensors does
    return raw


def write_model(out_dir: str, plan, seed: int, std: float, max_shard_bytes: int, threads: int,
                chunk_elems: int) -> list[str]:
    shards = plan_shards(plan, max_shard_bytes)
    n = len(shards)
    if n == 1:
        names = ["model.safetensors"]
    else:
        names = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    total_bytes = sum(numel(s) * 2 for _, s, _ in plan)
    log(f"{len(plan)} tensors, {sum(numel(s) for _, s, _ in plan):,} parameters, "
        f"{total_bytes / 1e9:.3f} GB bf16, {n} shard(s), {threads} threads")

    done_bytes = 0
    t0 = time.time()
    last_print = t0
    max_inflight = max(2, 2 * threads)
    with cf.ThreadPoolExecutor(max_workers=threads) as pool:
        for si, idxs in enumerate(shards):
            path = os.path.join(out_dir, names[si])
            header = build_header(plan, idxs)
            with open(path + ".partial", "wb") as f:
                f.write(len(header).to_bytes(8, "little"))
                f.write(header)
                # Jobs for this shard, in order: (tensor k, chunk j, count)
                jobs = []
                for k in idxs:
                    name, shape, init = plan[k]
                    ne = numel(shape)
                    for j, start in enumerate(range(0, ne, chunk_elems)):
                        jobs.append((k, j, min(chunk_elems, ne - start), init))
                inflight: deque = deque()
                it = iter(jobs)
                exhausted = False
                while True:
                    while not exhausted and len(inflight) < max_inflight:
                        job = next(it, None)
                        if job is None:
                            exhausted = True
                            break
                        k, j, cnt, init = job
                        inflight.append(pool.submit(make_chunk, seed, k, j, cnt, init, std))
                    if not inflight:
                        break
                    arr = inflight.popleft().result()
                    f.write(memoryview(arr))
                    done_bytes += arr.nbytes
                    now = time.time()
                    if now - last_print > 5:
                        last_print = now
                        rate = done_bytes / max(now - t0, 1e-9) / 1e9
                        log(f"  {done_bytes / 1e9:.2f}/{total_bytes / 1e9:.2f} GB ({rate:.2f} GB/s)")
            os.replace(path + ".partial", path)
            log(f"wrote {names[si]} ({os.path.getsize(path) / 1e9:.3f} GB, {len(idxs)} tensors)")

    if n > 1:
        index = {
            "metadata": {"total_size": total_bytes, "total_parameters": total_bytes // 2},
            "weight_map": {plan[k][0]: names[si] for si, idxs in enumerate(shards) for k in idxs},
        }
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
    dt = time.time() - t0
    log(f"weights done in {dt:.1f} s ({total_bytes / 1e9 / max(dt, 1e-9):.2f} GB/s)")
    return names


# --------------------------------------------------------------------------------------
# Verification (re-reads what was written)
# --------------------------------------------------------------------------------------


def read_header(path: str):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n <= 0 or n > 100_000_000:
            raise AssertionError(f"{path}: bad header length {n}")
        hdr = json.loads(f.read(n))
    return n, hdr


def bf16_bits_to_f32(u: np.ndarray) -> np.ndarray:
    return (u.astype(np.uint32) << 16).view(np.float32)


def verify(out_dir: str, plan, std: float, seed: int, chunk_elems: int) -> None:
    files = sorted(p for p in os.listdir(out_dir) if p.endswith(".safetensors"))
    idx_path = os.path.join(out_dir, "model.safetensors.index.json")
    weight_map = None
    if os.path.exists(idx_path):
        with open(idx_path) as f:
            index = json.load(f)
        weight_map = index["weight_map"]
        assert sorted(set(weight_map.values())) == files, (sorted(set(weight_map.values())), files)
        assert index["metadata"]["total_size"] == sum(numel(s) * 2 for _, s, _ in plan)
    else:
        assert files == ["model.safetensors"], files
    expected = {name: (shape, k) for k, (name, shape, _) in enumerate(plan)}
    seen = {}
    for fn in files:
        path = os.path.join(out_dir, fn)
        n, hdr = read_header(path)
        assert (8 + n) % 8 == 0
        hdr.pop("__metadata__", None)
        spans = sorted((v["data_offsets"][0], v["data_offsets"][1], name) for name, v in hdr.items())
        pos = 0
        for b, e, name in spans:
            assert b == pos, f"{fn}: {name} starts at {b}, expected {pos}"
            v = hdr[name]
            assert v["dtype"] == "BF16"
            assert e - b == numel(v["shape"]) * 2, name
            pos = e
            assert name in expected, f"unexpected tensor {name}"
            assert tuple(v["shape"]) == tuple(expected[name][0]), name
            assert name not in seen, f"duplicate tensor {name}"
            if weight_map is not None:
                assert weight_map[name] == fn, name
            seen[name] = (fn, 8 + n + b, v["shape"])
        size = os.path.getsize(path)
        assert size == 8 + n + pos, f"{fn}: size {size} != {8 + n + pos}"
    missing = set(expected) - set(seen)
    assert not missing, f"missing tensors: {sorted(missing)[:5]}"

    # Value checks on a few tensors: statistics, and bit-exact regeneration of the first chunk.
    probe = [plan[0][0], plan[1][0], plan[2][0], plan[-1][0]]
    for name in probe:
        fn, off, shape = seen[name]
        k = expected[name][1]
        cnt = min(numel(shape), chunk_elems, 1 << 20)
        data = np.fromfile(os.path.join(out_dir, fn), dtype=np.uint16, count=cnt, offset=off)
        vals = bf16_bits_to_f32(data)
        init = plan[k][2]
        if init == "ones":
            assert np.all(vals == 1.0), name
        else:
            s = float(vals.std())
            assert abs(s - std) < 0.1 * std + 1e-4, f"{name}: std {s} vs {std}"
            assert abs(float(vals.mean())) < 0.05 * std + 3 * std / np.sqrt(cnt), name
            first = make_chunk(seed, k, 0, min(numel(shape), chunk_elems), init, std)[:cnt]
            assert np.array_equal(first, data), f"{name}: data differs from regeneration"
    # The bf16 conversion itself: round to nearest even, against exact decisions.
    t = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-8 + 2**-20, -2.5, 0.02], dtype=np.float32)
    got = f32_to_bf16_bits(t.copy())
    want = np.array([0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC020, 0x3CA4], dtype=np.uint16)
    assert np.array_equal(got, want), (got, want)
    log(f"verify: {len(seen)} tensors in {len(files)} file(s): headers, offsets, sizes, index, values OK")

    # Optional cross-check with the safetensors library where it is installed (GPU machine).
    try:
        from safetensors import safe_open  # type: ignore
        import torch  # type: ignore  # noqa: F401
    except Exception:
        return
    for fn in files:
        with safe_open(os.path.join(out_dir, fn), framework="pt") as f:
            for name in list(f.keys())[:3]:
                t = f.get_tensor(name)
                assert str(t.dtype) == "torch.bfloat16" and tuple(t.shape) == tuple(expected[name][0])
    log("verify: safetensors.safe_open reads the files")


# --------------------------------------------------------------------------------------


def copy_tokenizer(tok_dir: str | None, out_dir: str, vocab_size: int) -> None:
    if not tok_dir:
        log("WARNING: no tokenizer directory: the model directory has no tokenizer files")
        return
    if not os.path.isdir(tok_dir):
        raise SystemExit(f"--tokenizer-dir {tok_dir} is not a directory")
    copied = []
    for fn in TOKENIZER_FILES:
        src = os.path.join(tok_dir, fn)
        if os.path.isfile(src):
            shutil.copyfile(src, os.path.join(out_dir, fn))
            copied.append(fn)
    if "tokenizer.json" not in copied:
        raise SystemExit(f"{tok_dir} has no tokenizer.json")
    with open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    max_id = max(list(tj["model"]["vocab"].values()) + [a["id"] for a in tj.get("added_tokens", [])])
    if max_id >= vocab_size:
        raise SystemExit(f"tokenizer has id {max_id} >= vocab_size {vocab_size}")
    log(f"copied {', '.join(copied)} from {tok_dir} (max token id {max_id} < vocab {vocab_size})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), help="a published architecture at real size")
    ap.add_argument("--config-json", help="any HF config.json of model_type " + "/".join(SUPPORTED_TYPES))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config key (value parsed as JSON), e.g. --set num_hidden_layers=2")
    ap.add_argument("--out", help="output directory (created; must be empty or absent unless --force)")
    ap.add_argument("--tokenizer-dir", help="copy tokenizer files from here (default: the preset's "
                    "tests/data/npm/<name> in the repo, if present)")
    ap.add_argument("--no-tokenizer", action="store_true", help="write no tokenizer files")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--std", type=float, default=0.02, help="std of the normal init (default 0.02)")
    ap.add_argument("--max-shard-gb", type=float, default=5.0, help="shard size limit in GB (default 5)")
    ap.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--chunk-mb", type=float, default=8.0, help="bf16 MB generated per work item")
    ap.add_argument("--no-verify", action="store_true")
    ap.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny Qwen3-shaped model with the real Qwen3 tokenizer, small shards, verified")
    args = ap.parse_args(argv)

    generation = None
    tok_dir = args.tokenizer_dir
    if args.smoke:
        cfg = dict(SMOKE_CONFIG)
        generation = dict(_QWEN3_GENERATION)
        args.out = args.out or "/tmp/kestrel-random-smoke"
        args.force = True
        args.max_shard_gb = 0.008  # 8 MB: ~4 shards
        if tok_dir is None:
            tok_dir = os.path.join(REPO_ROOT, "tests/data/npm/qwen3")
    elif args.preset:
        if args.config_json:
            raise SystemExit("give --preset or --config-json, not both")
        p = PRESETS[args.preset]
        cfg = dict(p["config"])
        generation = dict(p["generation"])
        if tok_dir is None:
            tok_dir = os.path.join(REPO_ROOT, p["tokenizer_dir"])
    elif args.config_json:
        with open(args.config_json) as f:
            cfg = json.load(f)
        gpath = os.path.join(os.path.dirname(os.path.abspath(args.config_json)), "generation_config.json")
        if os.path.exists(gpath):
            with open(gpath) as f:
                generation = json.load(f)
    else:
        raise SystemExit("give --preset, --config-json or --smoke")
    for s in args.set:
        k, v = parse_override(s)
        cfg[k] = v
    cfg = to_legacy_rope(cfg)
    if generation is None:
        generation = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if cfg.get(k) is not None}
    if args.no_tokenizer:
        tok_dir = None
    elif tok_dir and not os.path.isdir(tok_dir) and args.tokenizer_dir is None:
        log(f"WARNING: default tokenizer dir {tok_dir} is missing (run the test data set-up, or pass --tokenizer-dir)")
        tok_dir = None
    if not args.out:
        raise SystemExit("--out is required")

    plan = tensor_plan(cfg)  # validates model_type
    out = os.path.abspath(args.out)
    if os.path.isdir(out) and os.listdir(out):
        if not args.force:
            raise SystemExit(f"{out} is not empty (use --force to overwrite)")
        for fn in os.listdir(out):
            p = os.path.join(out, fn)
            if os.path.isfile(p) and (fn.endswith(".safetensors") or fn.endswith(".json") or fn.endswith(
                    ".partial") or fn in TOKENIZER_FILES):
                os.remove(p)
    os.makedirs(out, exist_ok=True)

    t0 = time.time()
    total_bytes = sum(numel(s) * 2 for _, s, _ in plan)
    free = shutil.disk_usage(out).free
    if free < total_bytes * 1.02 + 50e6:
        raise SystemExit(f"not enough disk in {out}: need {total_bytes / 1e9:.2f} GB, have {free / 1e9:.2f} GB")

    copy_tokenizer(tok_dir, out, int(cfg["vocab_size"]))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(generation, f, indent=2, sort_keys=True)
        f.write("\n")

    chunk_elems = max(1024, int(args.chunk_mb * 1e6 / 2))
    write_model(out, plan, args.seed, args.std, int(args.max_shard_gb * 1e9), max(1, args.threads), chunk_elems)
    if not args.no_verify:
        verify(out, plan, args.std, args.seed, chunk_elems)
    log(f"done: {out} in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
