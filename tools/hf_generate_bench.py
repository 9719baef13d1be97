#!/usr/bin/env python3
"""transformers `generate` (bf16, greedy) on a model directory, for the side-by-side with
`kestrel bench --device cuda`: decode tok/s at batch 1 (128-token prompt) and at batch 64 with
2,048-token contexts, and the time to prefill 2,048 tokens. Decode rates are differences of two
generate calls (N and 1 new tokens) so the prefill is taken out. Prints one JSON object.

  python3 tools/hf_generate_bench.py --model DIR [--repeats 3]
"""
import argparse
import json
import statistics
import sys
import time

import torch
from transformers import AutoModelForCausalLM


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=64)
    args = ap.parse_args()
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, device_map="cuda")
    model.eval()
    load_s = time.perf_counter() - t0
    vocab = model.config.vocab_size
    g = torch.Generator(device="cpu").manual_seed(0)
    out = {"engine": "transformers", "transformers": __import__("transformers").__version__,
           "torch": torch.__version__, "dtype": "bfloat16",
           "attn_implementation": model.config._attn_implementation, "load_s": load_s}

    def gen(ids, n):
        return model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                              pad_token_id=0, attention_mask=torch.ones_like(ids))

    with torch.inference_mode():
        # Prefill 2,048 tokens: one forward with logits for the last position only.
        ids = torch.randint(0, vocab, (1, 2048), generator=g).cuda()
        model(ids, logits_to_keep=1)
        secs = [timed(lambda: model(ids, logits_to_keep=1)) for _ in range(args.repeats)]
        s = statistics.median(secs)
        out["prefill_2048"] = {"ms": 1e3 * s, "tok_per_s": 2048 / s}
        print(f"prefill 2048: {1e3 * s:.1f} ms", file=sys.stderr)

        for batch, ctx in ((1, 128), (64, 2048)):
            ids = torch.randint(0, vocab, (batch, ctx), generator=g).cuda()
            gen(ids, 2)
            n = args.decode_tokens
            rates = []
            for _ in range(args.repeats):
                t1 = timed(lambda: gen(ids, 1))
                tn = timed(lambda: gen(ids, n + 1))
                rates.append(batch * n / (tn - t1))
            r = statistics.median(rates)
            out[f"decode_batch{batch}_ctx{ctx}"] = {"tok_per_s": r, "ms_per_step": 1e3 * batch / r}
            print(f"decode batch {batch} ctx {ctx}: {r:.1f} tok/s", file=sys.stderr)
            del ids
            torch.cuda.empty_cache()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
