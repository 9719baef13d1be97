#!/usr/bin/env python3
"""Train "kestrel-tiny": a ~9 M-parameter Qwen3ForCausalLM with its own byte-level BPE tokenizer.

A demo and test model for Kestrel, trained in a few minutes on one GPU from an offline corpus:
the .py sources and .rst/.md/.txt docs of this machine's Python standard library and
site-packages, plus ChatML examples (docstring -> function) extracted from them with `ast`.
It is useless for anything real; its point is to be a *real* (non-random) Qwen3 model with a
Qwen-structured tokenizer and chat template, small enough to commit-adjacent and to run on CPU,
whose greedy outputs are meaningful enough to catch engine bugs.

Output directory (default <repo>/out/kestrel-tiny, which .gitignore ignores):
  config.json, model.safetensors      transformers' save_pretrained, bf16, tied embeddings
  generation_config.json               eos [<|im_end|>, <|endoftext|>], sampling defaults
  tokenizer.json                       same pipeline as Qwen2/Qwen3's (NFC, Split regex + ByteLevel, BPE)
  tokenizer_config.json                Qwen2Tokenizer, eos <|im_end|>, pad <|endoftext|>, ChatML template
  golden.json                          greedy continuations + last-position logits, float32 eager reference
  MODEL_CARD.md                        what this is, corpus, training numbers, held-out loss

Phases and rough times on one H200 (16 cores): corpus scan + ast (~15-40 s), BPE training (~10-20 s),
encoding (~10-20 s), training (--train-seconds, default 330 s), eval + save + checks + golden (~15 s).
Total stays under 8 minutes. `--smoke` runs the same code end to end on a tiny corpus/model in < 30 s.

Requires: torch, transformers >= 5, tokenizers, numpy. No network (HF_HUB_OFFLINE is set).

  python3 tools/train_tiny.py --smoke
  python3 tools/train_tiny.py                      # full run, ~7.5 min
  python3 tools/train_tiny.py --out /tmp/kt --train-seconds 300
"""

from __future__ import annotations

import os

# Offline, and let the Rust tokenizer use all cores. Must be set before importing HF libraries.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

import argparse  # noqa: E402
import ast  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import multiprocessing as mp  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import site  # noqa: E402
import sys  # noqa: E402
import sysconfig  # noqa: E402
import textwrap  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T_START = time.time()

# The pre-tokenizer regex of Qwen2/Qwen2.5/Qwen3 (single digits, unlike Llama 3's \p{N}{1,3}).
SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)
EOT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIALS = [EOT, IM_START, IM_END]
SYSTEM_PROMPT = "You are a helpful Python coding assistant."

# ChatML, Qwen-style: optional system turn (merged with a tool list when `tools` is given),
# assistant tool calls as <tool_call>{json}</tool_call>, tool results as a user turn wrapped in
# <tool_response>. add_generation_prompt appends '<|im_start|>assistant\n'.
# Only uses Jinja features that Qwen's own templates use.
CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first %}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and message.content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"""

GOLDEN_CODE_PROMPTS = [
    "def fibonacci(n):",
    "import os\n\ndef list_files(path):",
    "class Stack:\n    def __init__(self):",
    "# Compute the mean of a list\ndef mean(xs):",
    "for i in range(",
]
GOLDEN_CHAT = [
    {"role": "system", "content": SYSTEM_PROMPT},
    {"role": "user", "content": "Return True if the number n is prime."},
]
# Sampling defaults written to generation_config.json (greedy is always available to clients).
GEN_DEFAULTS = {"temperature": 0.7, "top_p": 0.95, "top_k": 20}

DOC_EXTS = (".py", ".rst", ".md", ".txt")
SKIP_DIRS = {"__pycache__", "site-packages", "dist-packages", ".git", ".hg", "node_modules"}
SKIP_BASENAMES = ("license", "licence", "copying", "notice", "authors", "entry_points", "top_level",
                  "requires", "sources", "dependency_links", "namespace_packages", "installer")


def log(msg: str) -> None:
    print(f"[train_tiny {time.time() - T_START:7.1f}s] {msg}", flush=True)


def sha(s: str) -> str:
    return hashlib.sha256(s.encode("utf-8", "surrogatepass")).hexdigest()


# ======================================================================================
# 1. Corpus
# ======================================================================================


def corpus_roots(smoke: bool) -> list[tuple[str, str]]:
    """(label, path) for stdlib and site-packages, de-duplicated by real path."""
    paths = sysconfig.get_paths()
    cands = [("stdlib", paths.get("stdlib")), ("stdlib", paths.get("platstdlib"))]
    if not smoke:
        cands += [("site", paths.get("purelib")), ("site", paths.get("platlib"))]
        try:
            cands += [("site", p) for p in site.getsitepackages()]
        except AttributeError:  # some virtualenvs
            pass
        try:
            cands.append(("site", site.getusersitepackages()))
        except AttributeError:
            pass
    seen, roots = set(), []
    for label, p in cands:
        if not p or not os.path.isdir(p):
            continue
        rp = os.path.realpath(p)
        if rp in seen:
            continue
        seen.add(rp)
        roots.append((f"{label}{len(roots)}", rp))
    return roots


def scan_files(roots) -> list[tuple[str, str]]:
    """All candidate files as (sort key, path); the key is a hash of label/relpath."""
    root_set = {r for _, r in roots}
    out = []
    for label, root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            keep = []
            for d in dirnames:
                if d in SKIP_DIRS or d.endswith((".dist-info", ".egg-info")) or d.startswith("."):
                    continue
                if os.path.realpath(os.path.join(dirpath, d)) in root_set:
                    continue
                keep.append(d)
            dirnames[:] = sorted(keep)
            for fn in filenames:
                if not fn.endswith(DOC_EXTS):
                    continue
                if fn.lower().startswith(SKIP_BASENAMES):
                    continue
                path = os.path.join(dirpath, fn)
                rel = os.path.relpath(path, root)
                key = hashlib.sha1(f"{label}/{rel}".encode("utf-8", "surrogateescape")).hexdigest()
                out.append((key, path))
    out.sort()
    return out


def iter_functions(node):
    """Functions and methods reachable through statement bodies (module, class, if/try/with/loops)."""
    for field in ("body", "orelse", "finalbody", "handlers"):
        for child in getattr(node, field, None) or ():
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield child
            elif isinstance(child, (ast.stmt, ast.excepthandler)):
                yield from iter_functions(child)


def chat_examples_from_source(text: str, file_hash: str, max_per_file: int) -> list[str]:
    """Deterministic ChatML examples: docstring (user) -> function source (assistant)."""
    if '"""' not in text and "'''" not in text:
        return []  # (almost) no docstrings to find; skip the parse
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            tree = ast.parse(text)
        except Exception:  # SyntaxError, RecursionError, ValueError (null bytes), ...
            return []
    nodes = sorted(iter_functions(tree), key=lambda n: (n.lineno, n.col_offset))
    lines = text.split("\n")  # text has "\n" line ends only, as ast numbers them
    out = []
    for n in nodes:
        doc = ast.get_docstring(n, clean=True)
        if not doc or not (40 <= len(doc) <= 1200):
            continue
        if n.end_lineno is None or n.end_lineno - n.lineno < 3 or n.end_lineno - n.lineno > 120:
            continue
        # Whole lines from `def` to the end of the body (decorators are not included).
        src = textwrap.dedent("\n".join(lines[n.lineno - 1:n.end_lineno])).strip("\n")
        if not (80 <= len(src) <= 3000) or src.count("\n") < 3:
            continue
        h = int(hashlib.sha1(f"{file_hash}:{n.lineno}:{n.name}".encode()).hexdigest()[:8], 16)
        variant = (h // 3) % 3
        if variant == 0:
            user = doc
        elif variant == 1:
            user = f"Write a Python function `{n.name}`.\n\n{doc}"
        else:
            user = f"{doc}\n\nImplement this in Python."
        ex = ""
        if h % 3 == 0:
            ex += f"{IM_START}system\n{SYSTEM_PROMPT}{IM_END}\n"
        ex += f"{IM_START}user\n{user}{IM_END}\n{IM_START}assistant\n{src}{IM_END}\n"
        out.append(ex)
        if len(out) >= max_per_file:
            break
    return out


def load_file(job):
    """Worker: read + filter one file. Returns (key, text, file_hash, chats) or None."""
    key, path, max_bytes, max_chats = job
    try:
        st = os.stat(path)
        if st.st_size > max_bytes or st.st_size < 200:
            return None
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if "\x00" in text:
        return None
    text = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    if any(s in text for s in SPECIALS):
        return None  # never let the corpus spell our control tokens
    lines = text.split("\n")
    if max(len(l) for l in lines) > 1000 or len(text) / max(1, len(lines)) > 150:
        return None  # minified / data tables
    if not text.strip():
        return None
    fh = sha(text)
    chats = chat_examples_from_source(text, fh, max_chats) if path.endswith(".py") and max_chats > 0 else []
    return key, text, fh, chats


def build_corpus(args) -> dict:
    roots = corpus_roots(args.smoke)
    log("corpus roots: " + ", ".join(f"{l}={p}" for l, p in roots))
    cands = scan_files(roots)
    log(f"scanned {len(cands):,} candidate files")
    cap = int(args.max_corpus_mb * 1e6)
    max_bytes = int(args.max_file_kb * 1000)
    jobs = [(k, p, max_bytes, args.chats_per_file) for k, p in cands]
    train_raw, held_raw, train_chat, held_chat = [], [], [], []
    seen_hash = set()
    n_read = n_dup = n_skip = 0
    raw_bytes = 0
    ctx = mp.get_context("fork")
    with ctx.Pool(processes=args.workers) as pool:
        for res in pool.imap(load_file, jobs, chunksize=16):
            n_read += 1
            if res is None:
                n_skip += 1
                continue
            _, text, fh, chats = res
            if fh in seen_hash:
                n_dup += 1
                continue
            seen_hash.add(fh)
            held = int(fh[:8], 16) % 10000 < int(args.heldout_frac * 10000)
            (held_raw if held else train_raw).append(text)
            (held_chat if held else train_chat).extend(chats)
            raw_bytes += len(text.encode("utf-8"))
            if raw_bytes >= cap:
                break
        pool.terminate()
    if not held_raw:  # tiny corpora (smoke): hold out the last file
        held_raw.append(train_raw.pop())
    # Chat examples: at most chat_frac of the raw bytes, in a deterministic (hash) order.
    def cap_chats(chats, raw_list):
        budget = args.chat_frac * sum(len(t) for t in raw_list)
        chats = sorted(chats, key=sha)
        out, tot = [], 0
        for c in chats:
            if tot + len(c) > budget:
                break
            out.append(c)
            tot += len(c)
        return out

    n_chat_found = len(train_chat) + len(held_chat)
    train_chat, held_chat = cap_chats(train_chat, train_raw), cap_chats(held_chat, held_raw)
    stats = {
        "roots": [p for _, p in roots],
        "candidate_files": len(cands),
        "files_read": n_read,
        "files_skipped": n_skip,
        "files_duplicate": n_dup,
        "train_files": len(train_raw),
        "heldout_files": len(held_raw),
        "train_raw_bytes": sum(len(t.encode()) for t in train_raw),
        "heldout_raw_bytes": sum(len(t.encode()) for t in held_raw),
        "chat_examples_found": n_chat_found,
        "train_chat_examples": len(train_chat),
        "heldout_chat_examples": len(held_chat),
        "train_chat_bytes": sum(len(t.encode()) for t in train_chat),
        "heldout_chat_bytes": sum(len(t.encode()) for t in held_chat),
    }
    log("corpus: " + json.dumps(stats))
    rng = random.Random(args.seed)
    train_docs = train_raw + train_chat
    held_docs = held_raw + held_chat
    rng.shuffle(train_docs)
    rng.shuffle(held_docs)
    return {"train_docs": train_docs, "held_docs": held_docs, "train_raw": train_raw, "stats": stats}


# ======================================================================================
# 2. Tokenizer
# ======================================================================================


def qwen_style_tokenizer_json(raw_json: str) -> dict:
    """Rewrite a trained tokenizer's JSON into exactly the layout of Qwen3's tokenizer.json."""
    d = json.loads(raw_json)
    m = d["model"]
    assert m["type"] == "BPE", m["type"]
    merges = [mg.split(" ") if isinstance(mg, str) else list(mg) for mg in m["merges"]]
    assert all(len(mg) == 2 for mg in merges)
    byte_level = {"add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    added = []
    for a in d["added_tokens"]:
        added.append({"id": a["id"], "content": a["content"], "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": SPLIT_REGEX}, "behavior": "Isolated", "invert": False},
                dict({"type": "ByteLevel"}, **byte_level),
            ],
        },
        "post_processor": dict({"type": "ByteLevel"}, **byte_level),
        "decoder": dict({"type": "ByteLevel"}, **byte_level),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": m["vocab"],
            "merges": merges,
        },
    }


def train_tokenizer(args, train_raw: list[str]):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    budget = int(args.tok_train_mb * 1e6)
    sample, tot = [], 0
    for t in train_raw:  # already in a deterministic pseudo-random (path-hash) order
        sample.append(t)
        tot += len(t)
        if tot >= budget:
            break
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.bpe_vocab,
        min_frequency=2,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )

    def batches():
        for i in range(0, len(sample), 256):
            yield sample[i:i + 256]

    tok.train_from_iterator(batches(), trainer=trainer, length=len(sample))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    d = qwen_style_tokenizer_json(tok.to_str())
    final = Tokenizer.from_str(json.dumps(d, ensure_ascii=False))
    # The rewrite must not change behaviour.
    probe = sample[:20] + [f"{IM_START}user\nhi{IM_END}\n{EOT}", "  x = 1\r\n\tÿ ü 中文 🙂 123456"]
    for s in probe:
        a = tok.encode(s, add_special_tokens=False).ids
        b = final.encode(s, add_special_tokens=False).ids
        assert a == b, "tokenizer.json rewrite changed the encoding"
    n_bpe = len(d["model"]["vocab"])
    ids = {a["content"]: a["id"] for a in d["added_tokens"]}
    assert [ids[s] for s in SPECIALS] == [n_bpe, n_bpe + 1, n_bpe + 2], ids
    log(f"tokenizer: {n_bpe} BPE tokens ({len(d['model']['merges'])} merges) + 3 specials, "
        f"trained on {tot / 1e6:.1f} MB ({len(sample)} files)")
    return final, d, ids, tot


def encode_docs(tok, docs: list[str], eot_id: int, batch: int = 1024) -> np.ndarray:
    """Concatenate docs, each followed by <|endoftext|>, as uint16 ids."""
    enc = getattr(tok, "encode_batch_fast", None) or tok.encode_batch
    eot = np.array([eot_id], dtype=np.uint16)
    parts = []
    for i in range(0, len(docs), batch):
        for e in enc(docs[i:i + batch], add_special_tokens=False):
            parts.append(np.asarray(e.ids, dtype=np.uint16))
            parts.append(eot)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)


def tokenizer_config(ids: dict, model_max_length: int, tokenizer_class: str) -> dict:
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(ids[s]): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                          "single_word": False, "special": True}
            for s in SPECIALS
        },
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": model_max_length,
        "pad_token": EOT,
        "split_special_tokens": False,
        "tokenizer_class": tokenizer_class,
        "unk_token": None,
    }


def render_chat_reference(messages, tools=None, add_generation_prompt=False) -> str:
    """Python mirror of CHAT_TEMPLATE, used to check what transformers renders."""
    out = ""
    if tools:
        out += f"{IM_START}system\n"
        if messages[0]["role"] == "system":
            out += messages[0]["content"] + "\n\n"
        out += ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
        for t in tools:
            out += "\n" + json.dumps(t, ensure_ascii=False)
        out += ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                "\"arguments\": <args-json-object>}\n</tool_call>" + IM_END + "\n")
    elif messages[0]["role"] == "system":
        out += f"{IM_START}system\n{messages[0]['content']}{IM_END}\n"
    for i, m in enumerate(messages):
        if m["role"] == "system" and i == 0:
            continue
        if m["role"] == "assistant":
            out += f"{IM_START}assistant\n"
            if isinstance(m.get("content"), str):
                out += m["content"]
            for j, tc in enumerate(m.get("tool_calls") or []):
                if (j == 0 and m.get("content")) or j > 0:
                    out += "\n"
                tc = tc.get("function", tc)
                a = tc["arguments"]
                a = a if isinstance(a, str) else json.dumps(a, ensure_ascii=False)
                out += '<tool_call>\n{"name": "' + tc["name"] + '", "arguments": ' + a + "}\n</tool_call>"
            out += f"{IM_END}\n"
        elif m["role"] == "tool":
            out += f"{IM_START}user\n<tool_response>\n{m['content']}\n</tool_response>{IM_END}\n"
        else:
            out += f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n"
    if add_generation_prompt:
        out += f"{IM_START}assistant\n"
    return out


def check_hf_tokenizer(out_dir: str, raw_tok, probe_texts: list[str]):
    """AutoTokenizer must load offline from our files and agree with the raw tokenizer."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(out_dir)
    assert hf.eos_token == IM_END, hf.eos_token
    assert hf.pad_token == EOT, hf.pad_token
    assert hf.bos_token is None, hf.bos_token
    hf.model_max_length = 1 << 30  # probes are whole files; silence the "longer than max length" warning
    for s in probe_texts:
        a = hf(s, add_special_tokens=True)["input_ids"]
        b = raw_tok.encode(s, add_special_tokens=False).ids
        if a != b:
            raise AssertionError(f"AutoTokenizer ({type(hf).__name__}) differs from tokenizer.json on {s[:80]!r}: "
                                 f"{a[:20]} vs {b[:20]}")
        dec = hf.decode(a)
        import unicodedata
        if dec != unicodedata.normalize("NFC", s):
            raise AssertionError(f"decode round trip failed on {s[:80]!r}: {dec[:80]!r}")
    # Chat template: all roles, tools, tool calls, generation prompt.
    tools = [{"type": "function", "function": {
        "name": "run_python", "description": "Run Python code and return stdout.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}]
    conv = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "What is 2**10?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "run_python",
                                                          "arguments": {"code": "print(2**10)"}}}]},
        {"role": "tool", "content": "1024"},
        {"role": "assistant", "content": "2**10 is 1024."},
        {"role": "user", "content": "Thanks! Now ü and 中文?"},
    ]
    cases = [
        (GOLDEN_CHAT, None, True),
        (GOLDEN_CHAT, None, False),
        ([{"role": "user", "content": "hi"}], None, True),
        (conv, None, True),
        (conv, tools, True),
        (conv[1:], tools, False),
    ]
    for msgs, tl, agp in cases:
        got = hf.apply_chat_template(msgs, tools=tl, tokenize=False, add_generation_prompt=agp)
        want = render_chat_reference(msgs, tl, agp)
        if got != want:
            raise AssertionError(f"chat template renders\n{got!r}\nexpected\n{want!r}")
    log(f"AutoTokenizer OK ({type(hf).__name__}): {len(probe_texts)} encode/decode probes, "
        f"{len(cases)} chat-template cases")
    return hf


# ======================================================================================
# 3. Model + training
# ======================================================================================


def model_config(args, vocab_size: int, ids: dict):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        hidden_act="silu",
        max_position_embeddings=args.max_position,
        initializer_range=0.02,
        rms_norm_eps=1e-6,
        use_cache=True,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": float(args.rope_theta)},
        attention_bias=False,
        use_sliding_window=False,
        max_window_layers=args.layers,
        attention_dropout=0.0,
        bos_token_id=ids[EOT],
        eos_token_id=ids[IM_END],
    )


def lr_at(step: int, total: int | None, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    if total is None:
        return args.lr
    p = min(1.0, (step - args.warmup) / max(1, total - args.warmup))
    lo = args.lr * args.min_lr_frac
    return lo + 0.5 * (args.lr - lo) * (1.0 + math.cos(math.pi * p))


def evaluate(model, ids_t, T: int, max_tokens: int, batch: int, device, vocab: int) -> tuple[float, int]:
    """Mean next-token loss over the first non-overlapping T-windows (fixed token budget)."""
    import torch
    import torch.nn.functional as F

    n_win = min((ids_t.numel() - 1) // T, max(1, max_tokens // T))
    tot, cnt = 0.0, 0
    model.eval()
    with torch.no_grad():
        for w0 in range(0, n_win, batch):
            w1 = min(n_win, w0 + batch)
            starts = torch.arange(w0, w1, device=device) * T
            idx = starts[:, None] + torch.arange(T + 1, device=device)[None]
            win = ids_t[idx].long()
            x, y = win[:, :-1], win[:, 1:]
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                logits = model(input_ids=x, use_cache=False).logits
            tot += F.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1), reduction="sum").item()
            cnt += y.numel()
    model.train()
    return tot / max(1, cnt), cnt


def train(args, model, train_t, device, vocab: int) -> dict:
    import torch
    import torch.nn.functional as F

    T, B = args.seq_len, args.batch
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    fused = device.type == "cuda"
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed)
    n = train_t.numel()
    ar = torch.arange(T + 1, device=device)

    def get_batch():
        starts = torch.randint(0, n - T - 1, (B,), device=device, generator=gen)
        win = train_t[starts[:, None] + ar[None]].long()
        return win[:, :-1], win[:, 1:]

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    # torch.compile fuses HF's many small elementwise ops (RMSNorm casts, RoPE, SiLU): ~2x faster for
    # this tiny model on an H200 (74 vs 150 ms/step at 128x1024), for ~30 s of compilation at step 0,
    # which counts against --train-seconds. Falls back to eager if compilation fails.
    fwd = model
    compiled = False
    if args.compile:
        fwd = torch.compile(model)
        compiled = True

    calib0, calib1 = args.calib_steps
    total = None
    step = 0
    loss_acc = torch.zeros((), device=device)
    acc_n = 0
    history = []
    model.train()
    sync()
    t0 = time.time()
    t_calib0 = t0
    last_log = t0
    hard_stop = args.train_seconds * 1.05 + 2
    while True:
        if total is not None and step >= total:
            break
        if time.time() - t0 > hard_stop:
            log(f"hard time stop at step {step}")
            break
        lr = lr_at(step, total, args)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = get_batch()
        try:
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                logits = fwd(input_ids=x, use_cache=False).logits
        except Exception as e:  # only expected from torch.compile's first call
            if not compiled or step > 0:
                raise
            log(f"WARNING: torch.compile failed ({type(e).__name__}: {str(e)[:300]}); training without it")
            fwd, compiled = model, False
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                logits = fwd(input_ids=x, use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1))
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_acc += loss.detach()
        acc_n += 1
        step += 1
        if step == 1 and compiled:
            sync()
            log(f"torch.compile + first step took {time.time() - t0:.1f} s")
        if step == calib0:
            sync()
            t_calib0 = time.time()
        elif step == calib1 and total is None:
            sync()
            now = time.time()
            per_step = (now - t_calib0) / (calib1 - calib0)
            remaining = args.train_seconds - (now - t0)
            total = max(args.warmup + 1, step + int(remaining / per_step))
            log(f"calibrated: {per_step * 1000:.1f} ms/step, {B * T / per_step / 1e6:.2f} M tok/s "
                f"-> {total} steps ({total * B * T / 1e6:.0f} M tokens) in {args.train_seconds:.0f} s")
        now = time.time()
        if now - last_log >= args.log_every or (total is not None and step >= total):
            l = (loss_acc / max(1, acc_n)).item()
            el = now - t0
            history.append({"step": step, "loss": round(l, 4), "lr": lr, "elapsed_s": round(el, 1)})
            log(f"step {step}/{total or '?'} loss {l:.4f} lr {lr:.2e} gnorm {float(gnorm):.2f} "
                f"{step * B * T / el / 1e6:.2f} M tok/s elapsed {el:.0f}s")
            loss_acc.zero_()
            acc_n = 0
            last_log = now
    sync()
    wall = time.time() - t0
    return {"steps": step, "planned_steps": total, "tokens_seen": step * B * T, "train_wall_s": wall,
            "history": history, "compiled": compiled}


# ======================================================================================
# 4. Golden outputs (float32 eager reference from the saved bf16 weights)
# ======================================================================================


def make_golden(out_dir: str, hf_tok, raw_tok, ids: dict, heldout_windows, train_model_losses) -> dict:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig

    ref = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager")
    ref.eval()
    assert next(ref.parameters()).dtype == torch.float32
    emb = ref.get_input_embeddings().weight
    head = ref.get_output_embeddings().weight
    assert torch.equal(emb, head), "lm_head is not tied to embed_tokens after loading"
    eos = [ids[IM_END], ids[EOT]]
    ref.generation_config = GenerationConfig(do_sample=False, max_new_tokens=32, eos_token_id=eos,
                                             pad_token_id=ids[EOT])
    # Sanity: the reloaded fp32 model must score held-out windows like the trained model did.
    with torch.no_grad():
        for (x, y), want in zip(heldout_windows, train_model_losses):
            got = torch.nn.functional.cross_entropy(ref(input_ids=x).logits.reshape(-1, emb.shape[0]),
                                                    y.reshape(-1)).item()
            if abs(got - want) > 0.05 + 0.02 * want:
                raise AssertionError(f"reloaded model loss {got:.4f} vs trained model {want:.4f}")
    prompts = [{"kind": "code", "text": p} for p in GOLDEN_CODE_PROMPTS]
    chat_text = hf_tok.apply_chat_template(GOLDEN_CHAT, tokenize=False, add_generation_prompt=True)
    prompts.append({"kind": "chat", "messages": GOLDEN_CHAT, "add_generation_prompt": True, "text": chat_text})
    cases = []
    for p in prompts:
        pid = hf_tok(p["text"], add_special_tokens=False)["input_ids"]
        assert pid == raw_tok.encode(p["text"], add_special_tokens=False).ids
        x = torch.tensor([pid], dtype=torch.long)
        with torch.no_grad():
            logits = ref(input_ids=x).logits[0].float()
            out = ref.generate(input_ids=x, attention_mask=torch.ones_like(x))
        new = out[0, len(pid):].tolist()
        last = logits[-1]
        top = torch.topk(last, 10)
        # Independent greedy loop without KV cache, as a cross-check of generate().
        seq = list(pid)
        nocache, margins = [], []
        with torch.no_grad():
            for _ in range(32):
                lg = ref(input_ids=torch.tensor([seq])).logits[0, -1].float()
                t2 = torch.topk(lg, 2)
                t = int(t2.indices[0])
                margins.append(round(float(t2.values[0] - t2.values[1]), 5))
                nocache.append(t)
                seq.append(t)
                if t in eos:
                    break
        case = dict(p)
        case.update({
            "prompt_ids": pid,
            "output_ids": new,
            "output_text": hf_tok.decode(new),
            "finish_reason": "stop" if new and new[-1] in eos else "length",
            "last_logits_argmax": int(last.argmax()),
            "last_logits_top10": [[int(i), round(float(v), 5)] for v, i in zip(top.values, top.indices)],
            "output_margins": margins,
            "prompt_argmax": [int(v) for v in logits.argmax(-1).tolist()],
        })
        assert new and new[0] == case["last_logits_argmax"], "generate()'s first token is not the argmax"
        if nocache != new:
            log(f"WARNING: generate() and the no-cache greedy loop differ on {p['text'][:30]!r}")
            case["no_cache_output_ids"] = nocache
        cases.append(case)
    return {
        "description": "Greedy continuations of kestrel-tiny. Reference: transformers generate(do_sample=False, "
                       "max_new_tokens=32, eos_token_id=[<|im_end|>, <|endoftext|>]) on the saved bf16 weights "
                       "loaded as float32 with attn_implementation='eager', on CPU. output_ids are the new tokens "
                       "only (they end with the EOS id when finish_reason is 'stop'). last_logits_* are the "
                       "float32 logits at the last prompt position; prompt_argmax is the argmax at every prompt "
                       "position (prefill check). output_margins[i] is the float32 logit gap between the best and second-best "
                       "token at generation step i (from a no-KV-cache greedy loop): where it is tiny, a bf16 engine "
                       "may legitimately pick the other token.",
        "reference": {"transformers": transformers.__version__, "torch": torch.__version__, "dtype": "float32",
                      "weights_dtype": "bfloat16", "attn_implementation": "eager", "device": "cpu"},
        "eos_token_ids": eos,
        "max_new_tokens": 32,
        "cases": cases,
    }


# ======================================================================================
# 5. Main
# ======================================================================================


def dir_bytes(d: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if os.path.isfile(os.path.join(d, f)))


def write_json(path: str, obj, indent=2) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=indent, ensure_ascii=False)
        f.write("\n")


def model_card(args, info: dict) -> str:
    s, c, tr = info["corpus"], info["config"], info["train"]
    return f"""# kestrel-tiny

A tiny **Qwen3ForCausalLM** trained from scratch in a few minutes on one GPU by
`tools/train_tiny.py` of the Kestrel repository. It is a **demo and test model for Kestrel**
(an LLM inference engine): a real, non-random model with a Qwen-structured tokenizer and a ChatML
chat template, small enough to run anywhere. It is **not useful for anything real**: it writes
Python-looking text, often wrong, and knows nothing.

## Architecture

| | |
|---|---|
| class | Qwen3ForCausalLM (q_norm/k_norm, GQA, SwiGLU, RMSNorm, RoPE) |
| parameters | {info['n_params']:,} (tied input/output embeddings) |
| hidden size | {c['hidden_size']} |
| layers | {c['num_hidden_layers']} |
| attention heads / KV heads / head dim | {c['num_attention_heads']} / {c['num_key_value_heads']} / {c['head_dim']} (q width {c['num_attention_heads'] * c['head_dim']} != hidden) |
| intermediate size | {c['intermediate_size']} |
| vocab size | {c['vocab_size']} (tokenizer: {info['n_tok']} tokens; ids {info['n_tok']}..{c['vocab_size'] - 1} are unused padding rows) |
| max position embeddings | {c['max_position_embeddings']} (trained on sequences of {args.seq_len}) |
| RoPE theta | {args.rope_theta:g} (default RoPE; config.json spells it `rope_parameters`, as transformers 5 writes it) |
| RMSNorm eps | 1e-6 |
| weights | bfloat16, `model.safetensors` (lm_head tied, not stored) |

## Tokenizer

Byte-level BPE trained with Hugging Face `tokenizers` on {info['tok_train_mb']:.1f} MB of the training
split, with exactly the pipeline of Qwen2/Qwen3's `tokenizer.json`: NFC normalizer; pre-tokenizer
`Split` (Qwen's regex, Isolated) + `ByteLevel(add_prefix_space=false, use_regex=false)`; ByteLevel
post-processor and decoder; BPE without unk, byte fallback or merge skipping.
{info['n_bpe']} BPE tokens (256 byte symbols + {info['n_bpe'] - 256} merges) and three special tokens
after them: `<|endoftext|>` = {info['ids'][EOT]}, `<|im_start|>` = {info['ids'][IM_START]},
`<|im_end|>` = {info['ids'][IM_END]}.

`tokenizer_config.json`: `tokenizer_class` {info['tokenizer_class']}, no BOS, `eos_token` `<|im_end|>`,
`pad_token` `<|endoftext|>`, and a ChatML `chat_template` in the style of Qwen's (system / user / assistant /
tool roles, `tools` listed in the system turn, assistant `tool_calls` rendered as
`<tool_call>{{"name": ..., "arguments": ...}}</tool_call>`, tool results as a user turn in
`<tool_response>`; `add_generation_prompt` appends `<|im_start|>assistant\\n`).

## Generation defaults

`generation_config.json`: `eos_token_id` [{info['ids'][IM_END]}, {info['ids'][EOT]}] (`<|im_end|>`, `<|endoftext|>`),
`pad_token_id` {info['ids'][EOT]}, `do_sample` true, temperature {GEN_DEFAULTS['temperature']}, top_p {GEN_DEFAULTS['top_p']},
top_k {GEN_DEFAULTS['top_k']}. Chosen like Qwen3's defaults (0.6 / 0.95 / 20) but a little warmer, since a
tiny model falls into repetition loops under greedy or cold sampling; top_k 20 cuts its long tail of junk.

## Training data

Offline, from the training machine's Python installation ({platform.python_implementation()} {platform.python_version()}):
`.py` sources and `.rst`/`.md`/`.txt` docs of the standard library and site-packages
(roots: {', '.join('`' + r + '`' for r in s['roots'])}).
Files over {args.max_file_kb:g} KB, non-UTF-8 files, minified/data-table files (a line over 1000 characters or
a mean line over 150), licence/metadata files, and files containing the special-token strings are skipped;
exact duplicates are removed by content hash. Files are visited in a fixed pseudo-random order (hash of
their relative path) until {args.max_corpus_mb:g} MB of text are collected. A file goes to the held-out split
when its content hash falls in the first {args.heldout_frac * 100:g}% of the hash space.

| | train | held out |
|---|---|---|
| files | {s['train_files']:,} | {s['heldout_files']:,} |
| raw text bytes | {s['train_raw_bytes']:,} | {s['heldout_raw_bytes']:,} |
| ChatML examples | {s['train_chat_examples']:,} | {s['heldout_chat_examples']:,} |
| ChatML bytes | {s['train_chat_bytes']:,} | {s['heldout_chat_bytes']:,} |
| tokens (incl. separators) | {info['train_tokens']:,} | {info['heldout_tokens']:,} |

({s['candidate_files']:,} candidate files, {s['files_skipped']:,} skipped by the filters, {s['files_duplicate']:,} duplicates;
{info['bytes_per_token']:.2f} bytes per token on the training split.)

ChatML examples are built with `ast` from functions that have a docstring (40-1200 characters, source
80-3000 characters, at most {args.chats_per_file} per file): `<|im_start|>user\\n{{docstring}}<|im_end|>\\n<|im_start|>assistant\\n{{function source}}<|im_end|>\\n`,
a third of them with a system turn ("{SYSTEM_PROMPT}") and two thirds with the docstring wrapped in a short
instruction; they are capped at {args.chat_frac * 100:g}% of the raw bytes. Every document (file or example) is followed by
`<|endoftext|>`; documents are shuffled (seed {args.seed}) and concatenated; training windows are drawn at
random offsets.

## Training

AdamW (fused, betas 0.9/0.95, weight decay {args.weight_decay} on matrices), peak LR {args.lr:g}, {args.warmup} warm-up steps,
cosine decay to {args.min_lr_frac:g}x, gradient clipping {args.grad_clip}, bf16 autocast, TF32,
{'torch.compile' if tr['compiled'] else 'eager (no torch.compile)'}, batch {args.batch} x {args.seq_len} tokens,
seed {args.seed}. The number of steps is fixed after a short calibration so the run fits its time budget
(--train-seconds {args.train_seconds:g}).

| | |
|---|---|
| steps | {tr['steps']:,} |
| tokens seen | {tr['tokens_seen']:,} ({tr['tokens_seen'] / max(1, info['train_tokens']):.1f} epochs) |
| training wall time | {tr['train_wall_s']:.0f} s |
| whole script wall time | {info['total_wall_s']:.0f} s |
| device | {info['device_name']} |
| final train loss (last log interval) | {tr['history'][-1]['loss'] if tr['history'] else float('nan'):.4f} |
| **held-out loss per token** | **{info['heldout_loss']:.4f}** nats (perplexity {math.exp(info['heldout_loss']):.2f}) on {info['heldout_eval_tokens']:,} tokens |
| train-split loss, same budget | {info['train_eval_loss']:.4f} |

Software: torch {info['versions']['torch']}, transformers {info['versions']['transformers']}, tokenizers {info['versions']['tokenizers']}.

## Files

`config.json`, `model.safetensors`, `generation_config.json`, `tokenizer.json`, `tokenizer_config.json`,
`golden.json` (greedy continuations of 5 code prompts and 1 chat prompt, with prompt ids, output ids and
the float32 reference logits at the last prompt position, for checking inference engines), `MODEL_CARD.md`.

## Intended use

Testing and demonstrating Kestrel (and other engines): loading, tokenization, chat templates, prefill and
decode numerics against transformers, sampling, streaming. Not for any real task.
"""


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="output dir (default <repo>/out/kestrel-tiny; smoke: /tmp/kestrel-tiny-smoke)")
    ap.add_argument("--smoke", action="store_true", help="tiny corpus (stdlib only) + tiny model, < 30 s end to end")
    # corpus
    ap.add_argument("--max-corpus-mb", type=float, default=300.0, help="raw text to collect (MB)")
    ap.add_argument("--max-file-kb", type=float, default=200.0)
    ap.add_argument("--heldout-frac", type=float, default=0.02)
    ap.add_argument("--chats-per-file", type=int, default=3)
    ap.add_argument("--chat-frac", type=float, default=0.2, help="ChatML bytes as a fraction of raw bytes")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    # tokenizer
    ap.add_argument("--bpe-vocab", type=int, default=8000, help="BPE vocab incl. the 256 byte symbols")
    ap.add_argument("--tok-train-mb", type=float, default=40.0)
    ap.add_argument("--vocab-multiple", type=int, default=128, help="pad the embedding rows to a multiple")
    ap.add_argument("--tokenizer-class", default="Qwen2Tokenizer",
                    help="tokenizer_config.json tokenizer_class (Qwen2Tokenizer like Qwen3; or PreTrainedTokenizerFast)")
    # model
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--max-position", type=int, default=2048)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    # training
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--train-seconds", type=float, default=330.0,
                    help="wall-clock budget of the training loop, torch.compile included")
    ap.add_argument("--no-compile", dest="compile", action="store_false", help="train without torch.compile")
    ap.add_argument("--eval-tokens", type=int, default=1_000_000)
    ap.add_argument("--eval-batch", type=int, default=64)
    ap.add_argument("--log-every", type=float, default=15.0, help="seconds between progress lines")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--max-dir-mb", type=float, default=32.0, help="fail if the output dir is larger (MiB)")
    ap.add_argument("--device", default=None)
    args = ap.parse_args(argv)
    if args.smoke:
        args.out = args.out or "/tmp/kestrel-tiny-smoke"
        args.max_corpus_mb = 2.0
        args.tok_train_mb = 1.0
        args.bpe_vocab = 700
        args.hidden, args.layers, args.heads, args.kv_heads = 64, 2, 4, 2
        args.head_dim, args.intermediate = 32, 128
        args.seq_len, args.batch, args.warmup = 128, 16, 10
        args.train_seconds, args.eval_tokens, args.log_every = 4.0, 16_384, 2.0
        args.lr = 2e-3
        args.compile = False  # compiling alone would take ~30 s
    args.out = os.path.abspath(args.out or os.path.join(REPO_ROOT, "out", "kestrel-tiny"))
    if args.device == "cpu":
        args.compile = False
    args.calib_steps = (3, 8) if args.smoke else (10, 40)
    if args.warmup <= args.calib_steps[1]:
        args.warmup = args.calib_steps[1] + 1
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    log(f"args: {json.dumps({k: v for k, v in vars(args).items()})}")

    # ---- 1. corpus (forks workers: before torch/CUDA are initialised) ----
    corpus = build_corpus(args)

    # ---- 2. tokenizer ----
    raw_tok, tok_json, ids, tok_train_chars = train_tokenizer(args, corpus["train_raw"])
    n_tok = len(tok_json["model"]["vocab"]) + len(tok_json["added_tokens"])
    vocab = ((n_tok + args.vocab_multiple - 1) // args.vocab_multiple) * args.vocab_multiple

    # ---- 3. encode ----
    t = time.time()
    train_ids = encode_docs(raw_tok, corpus["train_docs"], ids[EOT])
    held_ids = encode_docs(raw_tok, corpus["held_docs"], ids[EOT])
    train_bytes = sum(len(d.encode("utf-8")) for d in corpus["train_docs"])
    log(f"encoded {len(train_ids):,} train / {len(held_ids):,} held-out tokens in {time.time() - t:.1f} s "
        f"({train_bytes / max(1, len(train_ids)):.2f} bytes/token)")
    probe_texts = corpus["held_docs"][:40] + [
        "def f(x):\n    return x  # ü é 中文 🙂\r\n\t\tdone   \n\n\n",
        f"{IM_START}user\nhello{IM_END}\n{IM_START}assistant\n",
        "It's 12345 o'clock, isn't it? I'LL see. ",
        "Cafe\u0301 and caf\u00e9",  # NFC
    ]
    corpus_stats = corpus["stats"]
    del corpus

    # ---- 4. model + training ----
    import torch
    import tokenizers
    import transformers
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(args.seed)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 for any fp32 matmul during training
    if device.type != "cuda":
        args.compile = False
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, tokenizers {tokenizers.__version__}, "
        f"device {device_name}")

    cfg = model_config(args, vocab, ids)
    model = Qwen3ForCausalLM(cfg).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params:,} parameters, vocab {vocab} (tokenizer {n_tok})")
    train_t = torch.from_numpy(train_ids.astype(np.int32)).to(device)
    held_t = torch.from_numpy(held_ids.astype(np.int32)).to(device)
    if train_t.numel() < 4 * args.seq_len or held_t.numel() < args.seq_len + 2:
        raise SystemExit("corpus too small for the sequence length")

    tr = train(args, model, train_t, device, vocab)
    held_loss, held_cnt = evaluate(model, held_t, args.seq_len, args.eval_tokens, args.eval_batch, device, vocab)
    train_loss, _ = evaluate(model, train_t, args.seq_len, args.eval_tokens, args.eval_batch, device, vocab)
    log(f"HELD-OUT LOSS {held_loss:.4f} nats/token (ppl {math.exp(held_loss):.2f}) on {held_cnt:,} tokens; "
        f"train-split loss {train_loss:.4f}; {tr['steps']} steps, {tr['tokens_seen'] / 1e6:.0f} M tokens in "
        f"{tr['train_wall_s']:.0f} s")
    # A few held-out windows scored by the trained model, re-checked after the bf16 save/fp32 reload.
    T = min(args.seq_len, 256)
    check_windows, check_losses = [], []
    model.eval()
    model = model.to(torch.bfloat16)  # score with the very weights that will be saved (bf16)
    with torch.no_grad():
        for k in range(2):
            w = held_t[k * (T + 1):(k + 1) * (T + 1)].long()[None]
            x, y = w[:, :-1], w[:, 1:]
            logits = model(input_ids=x, use_cache=False).logits.float()
            check_losses.append(torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1)).item())
            check_windows.append((x.cpu(), y.cpu()))

    # ---- 5. save ----
    out = args.out
    if os.path.isdir(out):
        if os.listdir(out) and not os.path.exists(os.path.join(out, "MODEL_CARD.md")) and not args.smoke:
            raise SystemExit(f"{out} exists and does not look like a kestrel-tiny dir; remove it first")
        shutil.rmtree(out)
    os.makedirs(out)
    model = model.to(torch.bfloat16).cpu()
    model.save_pretrained(out)
    cfg_path = os.path.join(out, "config.json")
    with open(cfg_path) as f:
        saved_cfg = json.load(f)
    if saved_cfg.get("dtype") is None and saved_cfg.get("torch_dtype") is None:
        saved_cfg["dtype"] = "bfloat16"
        write_json(cfg_path, saved_cfg)
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok_json, f, indent=2, ensure_ascii=False)
        f.write("\n")
    write_json(os.path.join(out, "tokenizer_config.json"),
               tokenizer_config(ids, args.max_position, args.tokenizer_class))
    gen_cfg = {
        "bos_token_id": ids[EOT],
        "do_sample": True,
        "eos_token_id": [ids[IM_END], ids[EOT]],
        "pad_token_id": ids[EOT],
        **GEN_DEFAULTS,
        "transformers_version": transformers.__version__,
    }
    write_json(os.path.join(out, "generation_config.json"), gen_cfg)  # overwrites save_pretrained's
    st_files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
    if st_files != ["model.safetensors"]:
        raise SystemExit(f"expected one model.safetensors, got {st_files}")
    log(f"saved to {out}: {sorted(os.listdir(out))}")

    # ---- 6. checks + golden ----
    hf_tok = check_hf_tokenizer(out, raw_tok, probe_texts)
    golden = make_golden(out, hf_tok, raw_tok, ids, check_windows, check_losses)
    golden["model"] = {"name": "kestrel-tiny", "n_params": n_params, "heldout_loss": round(held_loss, 5)}
    write_json(os.path.join(out, "golden.json"), golden, indent=1)

    info = {
        "n_params": n_params, "n_tok": n_tok, "n_bpe": len(tok_json["model"]["vocab"]), "ids": ids,
        "config": saved_cfg, "corpus": None, "train": tr, "heldout_loss": held_loss, "heldout_eval_tokens": held_cnt,
        "train_eval_loss": train_loss, "train_tokens": int(len(train_ids)), "heldout_tokens": int(len(held_ids)),
        "bytes_per_token": train_bytes / max(1, len(train_ids)), "tokenizer_class": args.tokenizer_class,
        "device_name": device_name, "tok_train_mb": tok_train_chars / 1e6,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__},
    }
    info["corpus"] = corpus_stats
    info["total_wall_s"] = time.time() - T_START
    with open(os.path.join(out, "MODEL_CARD.md"), "w", encoding="utf-8") as f:
        f.write(model_card(args, info))

    for fn in os.listdir(out):
        os.chmod(os.path.join(out, fn), 0o644)  # save_pretrained writes model.safetensors as 0600
    size = dir_bytes(out)
    limit = int(args.max_dir_mb * 1024 * 1024)
    for c in golden["cases"]:
        shown = c["text"] if c["kind"] == "code" else "[chat] " + c["messages"][-1]["content"]
        log(f"sample: {shown!r} -> {c['output_text']!r}")
    log(f"output dir {out}: {size / 1e6:.2f} MB")
    if size > limit:
        raise SystemExit(f"FAIL: {out} is {size:,} bytes, over the {limit:,}-byte limit")
    log(f"DONE in {time.time() - T_START:.0f} s: held-out loss {held_loss:.4f}, {n_params:,} params, "
        f"{tr['steps']} steps, {tr['tokens_seen'] / 1e6:.0f} M tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
