#!/usr/bin/env python3
"""Golden fixtures for the hybrid Gated-DeltaNet and mixture-of-experts models.

Tiny random-init Hugging Face models of the Qwen3.5 / Qwen3-Next / Qwen3-MoE families, saved in
the layouts published checkpoints use, and their logits from transformers in float32 (eager
attention, CPU, the torch fallbacks of the gated delta rule and the causal conv1d):

  qwen3_5        Qwen3_5ForCausalLM: 3 Gated DeltaNet layers then 1 full-attention layer
                 (full_attention_interval 4), grouped value heads (4 value heads on 2 key heads),
                 key dim 16 != value dim 24, partial RoPE (0.25 of head_dim 32), attention output
                 gate, (1 + w) RMSNorms; mtp.* weights added to the file (transformers ignores them)
  qwen3_5_vl     Qwen3_5ForConditionalGeneration with a one-block vision tower: text weights under
                 model.language_model.*, model.visual.* present
  qwen3_5_moe    Qwen3_5MoeForCausalLM: the same stack with mixture-of-experts MLPs (8 experts,
                 top 2, norm_topk_prob, shared expert with its sigmoid gate), experts stored fused
                 (experts.gate_up_proj / experts.down_proj)
  qwen3_next     Qwen3NextForCausalLM: fused in_proj_qkvz / in_proj_ba grouped per key head, layer
                 types alternating (given as layer_types), MoE without top-k renormalisation, experts stored
                 one tensor per expert, mtp.* weights added
  qwen3_moe      Qwen3MoeForCausalLM: Qwen3 attention (QK-norm) with MoE MLPs, layer 1 dense
                 (mlp_only_layers), experts one tensor per expert

Every norm weight, A_log and dt_bias is randomised (zero-initialised norms hide convention bugs).
Prompts of 7, 70 and 254 tokens (254 crosses 15 blocks of 16 and four chunks of 64); greedy
continues each for 24 tokens by full recomputation, and model.generate() (chunked prefill, then
the recurrent decode path) is recorded beside it as a cross-check.

Each directory gets reference.json and logits.bin as tools/make_fixtures.py writes them. With
--debug-dir, per-layer hidden states and the first linear-attention layer's intermediates of the
first prompt are written there (for diagnosing a mismatch; not committed), and with --sources-dir
the transformers modeling/configuration files of these families are copied there.

Run on the GPU machine (torch + transformers >= 5), from the repo root:
  python3 tools/make_hybrid_fixtures.py --out tests/data/models
"""

import argparse
import json
import os
import shutil
import sys
import traceback

import torch

import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as base  # noqa: E402  (full_logits, greedy helpers, dir_bytes)

VOCAB = 256
HIDDEN = 64
PROMPT_LENGTHS = (7, 70, 254)
GREEDY_TOKENS = 24
PROMPT_SEED = 4321
WEIGHT_STD = 0.08

GDN = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
           linear_value_head_dim=24, linear_conv_kernel_dim=4)
ATTN = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32)
COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96, max_position_embeddings=1024,
              rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=False, bos_token_id=None,
              eos_token_id=3)
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)


def fixtures():
    """(name, build function returning (model, zero_centered_norms), seed, options)."""
    from transformers import (Qwen3_5Config, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration,
                              Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, Qwen3_5TextConfig,
                              Qwen3MoeConfig, Qwen3MoeForCausalLM, Qwen3NextConfig,
                              Qwen3NextForCausalLM)
    rope_35 = {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
               "mrope_section": [1, 1, 2], "mrope_interleaved": True}

    def qwen3_5():
        cfg = Qwen3_5TextConfig(**COMMON, **ATTN, **GDN, num_hidden_layers=4,
                                rope_parameters=dict(rope_35))
        return Qwen3_5ForCausalLM(cfg)

    def qwen3_5_vl():
        text = dict(**COMMON, **ATTN, **GDN, num_hidden_layers=4, rope_parameters=dict(rope_35))
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4,
                      spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=HIDDEN,
                      num_position_embeddings=16)
        cfg = Qwen3_5Config(text_config=text, vision_config=vision, image_token_id=250,
                            video_token_id=251, vision_start_token_id=252, vision_end_token_id=253,
                            tie_word_embeddings=False)
        return Qwen3_5ForConditionalGeneration(cfg)

    def qwen3_5_moe():
        common = {k: v for k, v in COMMON.items() if k != "intermediate_size"}
        cfg = Qwen3_5MoeTextConfig(**common, **ATTN, **GDN, **MOE, num_hidden_layers=4,
                                   shared_expert_intermediate_size=48,
                                   rope_parameters=dict(rope_35))
        return Qwen3_5MoeForCausalLM(cfg)

    def qwen3_next():
        cfg = Qwen3NextConfig(**COMMON, **ATTN, **GDN, **MOE, num_hidden_layers=4,
                              layer_types=["linear_attention", "full_attention"] * 2,
                              shared_expert_intermediate_size=48,
                              norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[],
                              rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                               "partial_rotary_factor": 0.25})
        return Qwen3NextForCausalLM(cfg)

    def qwen3_moe():
        cfg = Qwen3MoeConfig(**COMMON, **ATTN, **MOE, num_hidden_layers=3, norm_topk_prob=False,
                             decoder_sparse_step=1, mlp_only_layers=[1], use_sliding_window=False,
                             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
        return Qwen3MoeForCausalLM(cfg)

    return [
        ("qwen3_5", qwen3_5, True, 201, {"mtp": True}),
        ("qwen3_5_vl", qwen3_5_vl, True, 202, {}),
        ("qwen3_5_moe", qwen3_5_moe, True, 203, {"experts": "fused"}),
        ("qwen3_next", qwen3_next, True, 204, {"experts": "per_expert", "mtp": True}),
        ("qwen3_moe", qwen3_moe, False, 205, {"experts": "per_expert"}),
    ]


def randomize(model, seed, zero_centered):
    """Weights std 0.08; norm weights 1 + 0.1 randn (0.1 randn where the norm computes 1 + w);
    A_log = log(uniform(0.5, 4)), dt_bias 0.5 randn, conv weights std 0.3."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("A_log"):
                p.copy_(torch.log(0.5 + 3.5 * torch.rand(p.shape, generator=g)))
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * noise)
            elif name.endswith("conv1d.weight"):
                p.copy_(0.3 * noise)
            elif name.endswith("linear_attn.norm.weight"):  # gated RMSNorm: plain weight
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(0.1 * noise if zero_centered else 1.0 + 0.1 * noise)
            else:
                p.copy_(WEIGHT_STD * noise)


def read_state(model_dir):
    tensors = {}
    for f in sorted(os.listdir(model_dir)):
        if f.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(model_dir, f)))
    return tensors


def write_state(model_dir, tensors):
    for f in os.listdir(model_dir):
        if f.endswith(".safetensors") or f == "model.safetensors.index.json":
            os.remove(os.path.join(model_dir, f))
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(model_dir, "model.safetensors"), metadata={"format": "pt"})


def to_expert_layout(tensors, layout):
    """Rewrites MoE expert tensors into `layout` ("fused" 3D gate_up_proj/down_proj, or
    "per_expert" experts.{e}.{gate,up,down}_proj.weight)."""
    out = {}
    fused_gu = {k: v for k, v in tensors.items() if k.endswith("mlp.experts.gate_up_proj")}
    fused_d = {k: v for k, v in tensors.items() if k.endswith("mlp.experts.down_proj")}
    per = {k: v for k, v in tensors.items() if ".mlp.experts." in k and k not in fused_gu
           and k not in fused_d}
    rest = {k: v for k, v in tensors.items() if k not in fused_gu and k not in fused_d and k not in per}
    out.update(rest)
    prefixes = sorted({k[: k.index("mlp.experts.") + len("mlp.experts.")]
                       for k in list(fused_gu) + list(fused_d) + list(per)})
    for p in prefixes:
        if p + "gate_up_proj" in tensors:
            gu, d = tensors[p + "gate_up_proj"], tensors[p + "down_proj"]  # [E,2I,H], [E,H,I]
            n_e, inter = gu.shape[0], gu.shape[1] // 2
            gate = [gu[e, :inter] for e in range(n_e)]
            up = [gu[e, inter:] for e in range(n_e)]
            down = [d[e] for e in range(n_e)]
        else:
            n_e = 1 + max(int(k[len(p):].split(".")[0]) for k in per if k.startswith(p))
            gate = [tensors[f"{p}{e}.gate_proj.weight"] for e in range(n_e)]
            up = [tensors[f"{p}{e}.up_proj.weight"] for e in range(n_e)]
            down = [tensors[f"{p}{e}.down_proj.weight"] for e in range(n_e)]
        if layout == "fused":
            out[p + "gate_up_proj"] = torch.stack([torch.cat([g_, u]) for g_, u in zip(gate, up)])
            out[p + "down_proj"] = torch.stack(down)
        else:
            for e in range(n_e):
                out[f"{p}{e}.gate_proj.weight"] = gate[e].clone()
                out[f"{p}{e}.up_proj.weight"] = up[e].clone()
                out[f"{p}{e}.down_proj.weight"] = down[e].clone()
    return out


def add_mtp(tensors, config, seed):
    """mtp.* tensors in the published layout (one extra full-attention decoder layer); the
    reference ignores them, Kestrel loads them into their own structure."""
    text = getattr(config, "text_config", config)
    h, hd = text.hidden_size, text.head_dim
    nh, nkv = text.num_attention_heads, text.num_key_value_heads
    g = torch.Generator().manual_seed(seed + 7)

    def w(*shape):
        return (WEIGHT_STD * torch.randn(shape, generator=g)).to(torch.bfloat16)

    p = "mtp.layers.0."
    mtp = {
        "mtp.fc.weight": w(h, 2 * h),
        "mtp.pre_fc_norm_embedding.weight": w(h),
        "mtp.pre_fc_norm_hidden.weight": w(h),
        "mtp.norm.weight": w(h),
        p + "input_layernorm.weight": w(h),
        p + "post_attention_layernorm.weight": w(h),
        p + "self_attn.q_proj.weight": w(2 * nh * hd, h),
        p + "self_attn.k_proj.weight": w(nkv * hd, h),
        p + "self_attn.v_proj.weight": w(nkv * hd, h),
        p + "self_attn.o_proj.weight": w(h, nh * hd),
        p + "self_attn.q_norm.weight": w(hd),
        p + "self_attn.k_norm.weight": w(hd),
    }
    n_experts = getattr(text, "num_experts", 0) or 0
    if n_experts > 0:
        inter = text.moe_intermediate_size
        for e in range(n_experts):
            mtp[f"{p}mlp.experts.{e}.gate_proj.weight"] = w(inter, h)
            mtp[f"{p}mlp.experts.{e}.up_proj.weight"] = w(inter, h)
            mtp[f"{p}mlp.experts.{e}.down_proj.weight"] = w(h, inter)
        mtp[p + "mlp.gate.weight"] = w(n_experts, h)
        sh = text.shared_expert_intermediate_size
        mtp[p + "mlp.shared_expert.gate_proj.weight"] = w(sh, h)
        mtp[p + "mlp.shared_expert.up_proj.weight"] = w(sh, h)
        mtp[p + "mlp.shared_expert.down_proj.weight"] = w(h, sh)
        mtp[p + "mlp.shared_expert_gate.weight"] = w(1, h)
    else:
        inter = text.intermediate_size
        mtp[p + "mlp.gate_proj.weight"] = w(inter, h)
        mtp[p + "mlp.up_proj.weight"] = w(inter, h)
        mtp[p + "mlp.down_proj.weight"] = w(h, inter)
    tensors.update(mtp)
    return sorted(mtp)


def make_prompts():
    g = torch.Generator().manual_seed(PROMPT_SEED)
    return [torch.randint(0, VOCAB - 8, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


@torch.no_grad()
def greedy_full(model, ids):
    seq = list(ids)
    for _ in range(GREEDY_TOKENS):
        seq.append(int(base.full_logits(model, seq)[-1].argmax()))
    return seq[len(ids):]


@torch.no_grad()
def debug_dump(model, ids, path):
    """Per-layer hidden states and the first linear-attention layer's intermediates."""
    captured = {}
    hooks = []
    for name, mod in model.named_modules():
        if ".linear_attn." in name + "." and name.count("layers.0.") and any(
                name.endswith(s) for s in ("in_proj_qkv", "in_proj_qkvz", "in_proj_z", "in_proj_b",
                                           "in_proj_a", "in_proj_ba", "norm", "out_proj")):
            def hook(m, inp, out, name=name):
                captured[name] = {"inputs": [i.float().tolist() for i in inp if torch.is_tensor(i)],
                                  "output": out.float().tolist() if torch.is_tensor(out) else None}
            hooks.append(mod.register_forward_hook(hook))
    out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    for h in hooks:
        h.remove()
    hs = [h[0].float().tolist() for h in (out.hidden_states or [])]
    with open(path, "w") as f:
        json.dump({"prompt": ids, "hidden_states": hs, "layer0_linear_attn": captured}, f)


def build(name, make, zero_centered, seed, options, out_root, prompts, debug_dir):
    model_dir = os.path.join(out_root, name)
    if os.path.isdir(model_dir):
        shutil.rmtree(model_dir)
    os.makedirs(model_dir)
    torch.manual_seed(seed)
    model = make().float().eval()
    randomize(model, seed, zero_centered)
    model = model.to(torch.bfloat16)
    model.save_pretrained(model_dir)
    config = model.config
    saved_names = sorted(read_state(model_dir))
    del model

    # The reference: the saved bf16 weights reloaded through the saved config, in float32.
    auto = (transformers.AutoModelForImageTextToText if name == "qwen3_5_vl"
            else transformers.AutoModelForCausalLM)
    ref = auto.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    logits, argmax, greedy, greedy_gen, shapes = [], [], [], [], []
    for ids in prompts:
        lg = base.full_logits(ref, ids)
        logits.append(lg)
        argmax.append(lg.argmax(dim=-1).tolist())
        shapes.append(list(lg.shape))
        greedy.append(greedy_full(ref, ids))
        try:
            base.GREEDY_TOKENS = GREEDY_TOKENS
            greedy_gen.append(base.greedy_generate(ref, ids))
        except Exception as e:
            print(f"  [{name}] model.generate failed ({type(e).__name__}: {e}); skipped")
            greedy_gen.append(None)
    for a, b in zip(greedy, greedy_gen):
        if b is not None and a != b:
            print(f"  [{name}] WARNING: generate() {b} != full recompute {a}")
    if debug_dir:
        try:
            debug_dump(ref, prompts[0], os.path.join(debug_dir, f"{name}_debug.json"))
        except Exception as e:
            print(f"  [{name}] debug dump failed: {type(e).__name__}: {e}")

    # Rewrite the file into the published layout, then check a reload gives the same logits.
    tensors = read_state(model_dir)
    layout_note = "as saved by save_pretrained"
    if options.get("experts"):
        tensors = to_expert_layout(tensors, options["experts"])
        layout_note = options["experts"]
    mtp_names = add_mtp(tensors, config, seed) if options.get("mtp") else []
    write_state(model_dir, tensors)
    reload_ok = None
    try:
        cls = type(ref)
        again = cls.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
        d = float((base.full_logits(again, prompts[1]) - logits[1]).abs().max())
        reload_ok = d == 0.0
        print(f"  [{name}] reload of the rewritten file: max |d logits| = {d}")
    except Exception as e:
        print(f"  [{name}] reload of the rewritten file failed: {type(e).__name__}: {e}")

    all_logits = torch.cat(logits, dim=0).contiguous()
    if not bool(torch.isfinite(all_logits).all()):
        sys.exit(f"{name}: non-finite logits")
    assert sys.byteorder == "little"
    with open(os.path.join(model_dir, "logits.bin"), "wb") as f:
        f.write(all_logits.numpy().tobytes())
    cfg = ref.config
    reference = {
        "model": name,
        "architecture": type(ref).__name__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "weights_dtype": "bfloat16",
        "reference_dtype": "float32",
        "attn_implementation": "eager",
        "layer_types": getattr(getattr(cfg, "text_config", cfg), "layer_types", None),
        "expert_layout": layout_note,
        "reload_identical": reload_ok,
        "saved_tensor_names": saved_names,
        "mtp_tensors": mtp_names,
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
    return {"name": name, "arch": type(ref).__name__, "bytes": base.dir_bytes(model_dir),
            "logit_std": float(all_logits.std()), "reload_ok": reload_ok}


def copy_sources(dest):
    root = os.path.dirname(transformers.__file__)
    os.makedirs(dest, exist_ok=True)
    for fam in ("qwen3_5", "qwen3_5_moe", "qwen3_next", "qwen3_moe"):
        d = os.path.join(root, "models", fam)
        for f in ("modeling_" + fam + ".py", "configuration_" + fam + ".py"):
            if os.path.exists(os.path.join(d, f)):
                shutil.copy(os.path.join(d, f), os.path.join(dest, f))
    for rel in ("conversion_mapping.py", "integrations/moe.py", "configuration_utils.py",
                "modeling_rope_utils.py"):
        p = os.path.join(root, rel)
        if os.path.exists(p):
            shutil.copy(p, os.path.join(dest, rel.replace("/", "_")))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--debug-dir")
    ap.add_argument("--sources-dir")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    if args.sources_dir:
        copy_sources(args.sources_dir)
    if args.debug_dir:
        os.makedirs(args.debug_dir, exist_ok=True)
    out_root = os.path.abspath(args.out)
    os.makedirs(out_root, exist_ok=True)
    prompts = make_prompts()
    summary, failed = [], []
    for name, make, zero_centered, seed, options in fixtures():
        if args.only and name not in args.only:
            continue
        print(f"building {name} ...", flush=True)
        try:
            summary.append(build(name, make, zero_centered, seed, options, out_root, prompts,
                                 args.debug_dir))
        except Exception:
            traceback.print_exc()
            failed.append(name)
    print(f"\ntransformers {transformers.__version__}, torch {torch.__version__}; prompts of "
          f"{list(PROMPT_LENGTHS)} tokens; greedy {GREEDY_TOKENS}")
    for s in summary:
        print(f"{s['name']:14} {s['arch']:34} {s['bytes'] / 1024:6.0f} KB  logit std "
              f"{s['logit_std']:.3f}  reload identical: {s['reload_ok']}")
    if failed:
        sys.exit("failed: " + ", ".join(failed))


if __name__ == "__main__":
    main()
