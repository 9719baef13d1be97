#!/usr/bin/env python3
"""Golden fixtures for the model tests: tiny random-init Hugging Face models and their logits.

Each model directory (default tests/data/models/<name>/) holds what `save_pretrained` wrote
(config.json, generation_config.json, bf16 safetensors) plus the reference computed by
transformers in float32 from those same bf16 weights (eager attention, CPU):

  reference.json  {"prompts": [[ids]], "argmax": [[per position]], "greedy": [[16 ids]],
                   "logits_shape": [[n_pos, vocab]], "inv_freq": [...], "attention_scaling": x, ...}
  logits.bin      float32 little-endian logits of every position, prompts concatenated

"greedy" continues each prompt for 16 tokens, recomputing the full forward at every step with
no KV cache and no EOS stop; "greedy_generate" is model.generate(do_sample=False) with EOS
disabled, kept to show the cached path agrees.

Needs torch and transformers >= 5 (rope_parameters, dtype=); no network. Run from the repo root:
  python3 tools/make_fixtures.py --out tests/data/models
"""

import argparse
import copy
import json
import os
import shutil
import sys

import torch

import transformers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

VOCAB = 512
HIDDEN = 64
INTERMEDIATE = 96
LAYERS = 2
HEADS = 4
KV_HEADS = 2
MAX_POSITION = 512
PROMPT_LENGTHS = (7, 33, 70)  # 70 > 64, the original context of the scaled-RoPE models
GREEDY_TOKENS = 16
WEIGHT_STD = 0.08
PROMPT_SEED = 1234

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    intermediate_size=INTERMEDIATE,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    num_key_value_heads=KV_HEADS,
    max_position_embeddings=MAX_POSITION,
    rms_norm_eps=1e-5,
    hidden_act="silu",
)


def fixtures():
    """(name, model class, config, seed, options) for every fixture."""
    return [
        # GQA + llama3 RoPE; with theta 5e5 and head_dim 16 the three llama3 bands all occur
        # (wavelengths 6.3 < 16 kept, 32.5 blended, >= 168 > 64 divided).
        ("llama3", LlamaForCausalLM,
         LlamaConfig(**COMMON, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                     rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                      "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 64}),
         101, {}),
        # No sliding window; saved in shards so the index path is exercised.
        ("mistral", MistralForCausalLM,
         MistralConfig(**COMMON, sliding_window=None, head_dim=None, tie_word_embeddings=False,
                       bos_token_id=1, eos_token_id=2,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
         102, {"max_shard_size": "100KB"}),
        # Tied embeddings and q/k/v biases (randomized below, never zero).
        ("qwen2", Qwen2ForCausalLM,
         Qwen2Config(**COMMON, tie_word_embeddings=True, use_sliding_window=False,
                     bos_token_id=None, eos_token_id=3,
                     rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
         103, {}),
        # head_dim 32 != hidden / heads (16); QK-norm; untied.
        ("qwen3", Qwen3ForCausalLM,
         Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=False, use_sliding_window=False,
                     bos_token_id=None, eos_token_id=3,
                     rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
         104, {}),
        # yarn: factor 4 over an original context of 64 (attention_factor 0.1 ln 4 + 1).
        ("qwen3_yarn", Qwen3ForCausalLM,
         Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=False, use_sliding_window=False,
                     bos_token_id=None, eos_token_id=3,
                     rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                      "original_max_position_embeddings": 64}),
         105, {}),
        # Linear scaling, q/k/v/o and MLP biases; config.json rewritten by hand into the legacy
        # spelling (rope_theta + rope_scaling {"type": ...}, torch_dtype) after saving.
        ("llama_linear_legacy", LlamaForCausalLM,
         LlamaConfig(**COMMON, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                     attention_bias=True, mlp_bias=True,
                     rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                      "factor": 2.0}),
         106, {"legacy_config": True}),
    ]


def randomize(model, seed):
    """Every parameter random: norms 1 + 0.1 randn, everything else (biases too) std 0.08."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied parameters appear once
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(WEIGHT_STD * noise)


def rewrite_config_legacy(model_dir):
    """config.json in the spelling of published checkpoints: rope_theta + rope_scaling."""
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    rope = dict(cfg.pop("rope_parameters", None) or cfg.pop("rope_scaling"))
    cfg["rope_theta"] = rope.pop("rope_theta")
    rope_type = rope.pop("rope_type")
    cfg["rope_scaling"] = {"type": rope_type, **rope}
    if "dtype" in cfg:
        cfg["torch_dtype"] = cfg.pop("dtype")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def make_prompts():
    g = torch.Generator().manual_seed(PROMPT_SEED)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


@torch.no_grad()
def full_logits(model, ids):
    return model(input_ids=torch.tensor([ids], dtype=torch.long)).logits[0].float()


@torch.no_grad()
def greedy_full_recompute(model, ids):
    seq = list(ids)
    for _ in range(GREEDY_TOKENS):
        seq.append(int(full_logits(model, seq)[-1].argmax()))
    return seq[len(ids):]


@torch.no_grad()
def greedy_generate(model, ids):
    """model.generate(do_sample=False) with EOS disabled everywhere generate() looks for it."""
    saved = (model.generation_config.eos_token_id, model.config.eos_token_id)
    model.generation_config.eos_token_id = None
    model.config.eos_token_id = None
    try:
        gen = copy.deepcopy(model.generation_config)
        gen.do_sample = False
        gen.max_new_tokens = GREEDY_TOKENS
        gen.min_new_tokens = None
        gen.temperature = None
        gen.top_p = None
        gen.top_k = None
        gen.pad_token_id = 0
        x = torch.tensor([ids], dtype=torch.long)
        out = model.generate(x, attention_mask=torch.ones_like(x), generation_config=gen)
        return out[0, len(ids):].tolist()
    finally:
        model.generation_config.eos_token_id, model.config.eos_token_id = saved


def rotary_info(model):
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if rotary is None:
        return None, None
    inv_freq = getattr(rotary, "inv_freq", None)
    scaling = getattr(rotary, "attention_scaling", None)
    return (inv_freq.float().tolist() if inv_freq is not None else None,
            float(scaling) if scaling is not None else None)


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def build(name, model_cls, config, seed, options, out_root, prompts):
    model_dir = os.path.join(out_root, name)
    if os.path.isdir(model_dir):
        shutil.rmtree(model_dir)
    os.makedirs(model_dir)

    torch.manual_seed(seed)
    model = model_cls(config).float().eval()
    randomize(model, seed)
    model = model.to(torch.bfloat16)
    save_kwargs = {}
    if "max_shard_size" in options:
        save_kwargs["max_shard_size"] = options["max_shard_size"]
    model.save_pretrained(model_dir, **save_kwargs)
    if options.get("legacy_config"):
        rewrite_config_legacy(model_dir)
    del model

    # The reference: the saved bf16 weights, reloaded through the saved config, in float32.
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                               attn_implementation="eager").eval()
    logits, argmax, greedy, greedy_gen, shapes = [], [], [], [], []
    for ids in prompts:
        lg = full_logits(ref, ids)
        logits.append(lg)
        argmax.append(lg.argmax(dim=-1).tolist())
        shapes.append(list(lg.shape))
        greedy.append(greedy_full_recompute(ref, ids))
        try:
            greedy_gen.append(greedy_generate(ref, ids))
        except Exception as e:  # the cached path is a cross-check only
            print(f"  [{name}] model.generate failed ({type(e).__name__}: {e}); skipped")
            greedy_gen.append(None)
    for a, b in zip(greedy, greedy_gen):
        if b is not None and a != b:
            print(f"  [{name}] WARNING: generate() {b} != full recompute {a}")

    all_logits = torch.cat(logits, dim=0).contiguous()
    if not bool(torch.isfinite(all_logits).all()):
        sys.exit(f"{name}: non-finite logits")
    # Raw float32 bytes (no numpy needed); the machine is little-endian like the format.
    assert sys.byteorder == "little"
    with open(os.path.join(model_dir, "logits.bin"), "wb") as f:
        f.write(bytes(all_logits.view(torch.uint8).reshape(-1).tolist()))

    inv_freq, attention_scaling = rotary_info(ref)
    rope = getattr(ref.config, "rope_parameters", None)
    reference = {
        "model": name,
        "architecture": type(ref).__name__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "weights_dtype": "bfloat16",
        "reference_dtype": "float32",
        "attn_implementation": "eager",
        "config_spelling": "legacy rope_theta + rope_scaling" if options.get("legacy_config")
                           else "rope_parameters",
        "rope_parameters": json.loads(json.dumps(rope, default=str)) if rope else None,
        "inv_freq": inv_freq,
        "attention_scaling": attention_scaling,
        "prompts": prompts,
        "argmax": argmax,
        "greedy": greedy,
        "greedy_generate": greedy_gen,
        "logits_shape": shapes,
        "logits_file": "logits.bin",
        "logits_format": "float32 little-endian, row-major [n_pos, vocab] per prompt, concatenated",
    }
    with open(os.path.join(model_dir, "reference.json"), "w") as f:
        json.dump(reference, f, indent=1)
        f.write("\n")

    spread = float(torch.cat(logits).std())
    files = sorted(os.listdir(model_dir))
    return {
        "name": name,
        "arch": type(ref).__name__,
        "files": files,
        "bytes": dir_bytes(model_dir),
        "weight_bytes": sum(os.path.getsize(os.path.join(model_dir, f))
                            for f in files if f.endswith(".safetensors")),
        "sharded": "model.safetensors.index.json" in files,
        "logit_std": spread,
        "rope": rope,
        "attention_scaling": attention_scaling,
    }


def main():
    default_out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data",
                               "models")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=default_out, help="output directory (one subdir per model)")
    ap.add_argument("--only", nargs="*", help="build only these fixtures")
    args = ap.parse_args()

    major = int(transformers.__version__.split(".")[0])
    if major < 5:
        sys.exit(f"transformers >= 5 is required (rope_parameters, dtype=); found "
                 f"{transformers.__version__}")
    torch.set_grad_enabled(False)
    out_root = os.path.abspath(args.out)
    os.makedirs(out_root, exist_ok=True)
    prompts = make_prompts()

    summary = []
    for name, cls, config, seed, options in fixtures():
        if args.only and name not in args.only:
            continue
        print(f"building {name} ...", flush=True)
        summary.append(build(name, cls, config, seed, options, out_root, prompts))

    print(f"\ntransformers {transformers.__version__}, torch {torch.__version__}; "
          f"prompts of {list(PROMPT_LENGTHS)} tokens; out: {out_root}")
    print(f"{'model':22} {'arch':20} {'KB':>6} {'weights KB':>10} {'shards':>6} {'logit std':>9}"
          f"  rope / attention_scaling")
    for s in summary:
        rope = s["rope"] or {}
        rope_text = f"{rope.get('rope_type', '?')} theta={rope.get('rope_theta')}"
        print(f"{s['name']:22} {s['arch']:20} {s['bytes'] / 1024:6.0f} "
              f"{s['weight_bytes'] / 1024:10.0f} {'yes' if s['sharded'] else 'no':>6} "
              f"{s['logit_std']:9.3f}  {rope_text} / {s['attention_scaling']}")
        if s["weight_bytes"] > 400 * 1024:
            print(f"  WARNING: {s['name']} weights exceed 400 KB")
        if s["logit_std"] < 0.1:
            print(f"  WARNING: {s['name']} logits are nearly flat")


if __name__ == "__main__":
    main()
