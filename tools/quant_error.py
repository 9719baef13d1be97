#!/usr/bin/env python3
"""Logit error of quantized checkpoints against their bf16 baseline, as Kestrel computes them:
runs `kestrel logits` on the baseline and on each quantized model with the same prompt ids and
prints, per model, max |logit - baseline| / range and the RMS error / RMS of the baseline (last
position), and at how many positions the argmax agrees. JSON lines on stdout.

  quant_error.py --kestrel build/release/kestrel --baseline DIR --models A.gguf B_dir ... \\
                 [--ids 1,2,3,...] [--device cpu] [-- extra kestrel flags]
"""
import argparse
import json
import math
import subprocess
import sys


def logits(kestrel, model, ids, device, extra):
    out = subprocess.run([kestrel, "logits", "--model", model, "--device", device, "--ids", ids] + extra,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kestrel", required=True)
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--ids", default="9707,11,1879,374,264,1273,315,279,3460,1614,13,576,3974,13876,38835,34208")
    ap.add_argument("--device", default="cpu")
    args, extra = ap.parse_known_args()
    extra = [e for e in extra if e != "--"]
    base = logits(args.kestrel, args.baseline, args.ids, args.device, extra)
    b = base["last_logits"]
    rng = max(b) - min(b)
    rms_b = math.sqrt(sum(x * x for x in b) / len(b))
    for m in args.models:
        q = logits(args.kestrel, m, args.ids, args.device, extra)
        d = [x - y for x, y in zip(q["last_logits"], b)]
        print(json.dumps({
            "model": m,
            "max_abs_over_range": max(abs(x) for x in d) / rng,
            "rms_over_rms": math.sqrt(sum(x * x for x in d) / len(d)) / rms_b,
            "argmax_equal": sum(int(x == y) for x, y in zip(q["argmax"], base["argmax"])),
            "positions": len(base["argmax"]),
        }))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
