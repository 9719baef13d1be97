#!/usr/bin/env python3
"""Golden chat renderings from transformers (5.x), for tests/chat/test_chat_golden.cpp.

Run where transformers is installed (no network needed):
    python3 tools/golden_chat.py --tokenizer-dir tests/data/npm/qwen3 --name qwen3 \
        --cases tests/data/chat/cases.jsonl --out tests/data/chat/golden_qwen3.jsonl

For every case of cases.jsonl ({"name", "messages", "tools", "add_generation_prompt", "kwargs"})
it writes one line: {"name", "rendered"} with
    tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=...,
                                  tokenize=False, **kwargs)
or {"name", "error"} with str(exception) when transformers raises. Every case is answered.
"""

import argparse
import json
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer-dir", required=True, help="directory with tokenizer_config.json")
    parser.add_argument("--name", required=True, help="short name of the tokenizer (for the log)")
    parser.add_argument("--cases", required=True, help="cases.jsonl from tools/gen_chat_cases.py")
    parser.add_argument("--out", required=True, help="output golden_NAME.jsonl")
    args = parser.parse_args()

    import transformers
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_dir)
    n_ok = n_err = 0
    with open(args.cases, encoding="utf-8") as f_in, open(args.out, "w", encoding="utf-8") as out:
        for line in f_in:
            if not line.strip():
                continue
            case = json.loads(line)  # json keeps object key order, as a client's request has it
            row = {"name": case.get("name", "")}
            try:
                rendered = tokenizer.apply_chat_template(
                    case["messages"],
                    tools=case.get("tools"),
                    add_generation_prompt=bool(case.get("add_generation_prompt", False)),
                    tokenize=False,
                    **(case.get("kwargs") or {}),
                )
                if not isinstance(rendered, str):
                    raise TypeError(f"apply_chat_template returned {type(rendered).__name__}")
                row["rendered"] = rendered
                n_ok += 1
            except Exception as e:  # noqa: BLE001 - every failure is recorded as data
                row["error"] = str(e) or type(e).__name__
                n_err += 1
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{args.name}: transformers {transformers.__version__}: {n_ok} rendered, {n_err} errors "
          f"-> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
