#!/usr/bin/env python3
"""Writes tests/data/tokenizer/corpus.jsonl: varied strings for the tokenizer golden tests.

Each line is {"text": "..."}. The corpus is deterministic (fixed seed, stdlib only) so that the
golden files produced from it by tools/golden_tokenizer.py stay line-aligned with it.

Usage: python3 tools/gen_tokenizer_corpus.py [--out tests/data/tokenizer/corpus.jsonl]
"""

import argparse
import json
import os
import random

SEED = 20250611

WORDS = (
    "the of and to in is that it was for on are as with his they at be this have from or one "
    "had by word but not what all were we when your can said there use an each which she do how "
    "their if will up other about out many then them these so some her would make like him into "
    "time has look two more write go see number no way could people my than first water been call "
    "who oil its now find long down day did get come made may part tokenizer kestrel inference "
    "engine attention transformer gradient cache prefix decode encode stream latency throughput"
).split()

SPECIAL_TOKENS = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>",
    "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|python_tag|>",
    "<|finetune_right_pad_id|>", "<|reserved_special_token_0|>", "<|reserved_special_token_5|>",
    "<|reserved_special_token_250|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
    "<tool_response>", "</tool_response>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<|vision_start|>", "<|image_pad|>",
    "<|box_start|>", "<|quad_end|>", "<|object_ref_start|>",
]
PARTIAL_TOKENS = [
    "<|im_start", "<|im_", "im_end|>", "<|endoftext", "|endoftext|>", "<|begin_of_text",
    "<|eot_id", "<think", "think>", "</think", "<|", "|>", "<||>", "< |im_start| >",
    "<|IM_START|>", "<|im_start|", "<<|im_start|>>", "<|im_start|im_end|>", "<|eot_id||>",
    "<|reserved_special_token_|>", "<|reserved_special_token_999|>", "<tool_call", "<|fim",
]

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]

SCRIPTS = {
    "zh": "我们今天讨论一下分词器的实现细节。这个模型在推理时需要非常快速，而且结果必须与参考实现完全一致！"
          "北京、上海和深圳都是中国的大城市；人工智能正在改变世界。",
    "ja": "東京は日本の首都です。ひらがなとカタカナ、そして漢字を混ぜて書きます。ｶﾀｶﾅ（半角）もあります。"
          "トークナイザーのテストを行っています。よろしくお願いします！",
    "ko": "안녕하세요, 세계! 한국어 토크나이저를 시험하고 있습니다. 서울은 대한민국의 수도입니다.",
    "ar": "مرحبا بالعالم! هذه جملة عربية لاختبار المقسم. اللُّغَةُ العَرَبِيَّةُ جَمِيلَةٌ جِدًّا.",
    "he": "שלום עולם! זהו משפט בעברית לבדיקה. עִבְרִית עִם נִקּוּד.",
    "hi": "नमस्ते दुनिया! यह हिंदी में एक वाक्य है। क़ ख़ ग़ ज़ ड़ फ़ — नुक़्ता वाले अक्षर।",
    "th": "สวัสดีชาวโลก นี่คือประโยคภาษาไทยสำหรับการทดสอบ",
    "ru": "Привет, мир! Это предложение на русском языке. Ёжик в тумане; «кавычки» — тире.",
    "el": "Γειά σου κόσμε! Αυτή είναι μια ελληνική πρόταση. ΆΈΉΊΌΎΏ ΐΰ",
    "vi": "Xin chào thế giới! Tiếng Việt có nhiều dấu: ắ ằ ẳ ẵ ặ ấ ầ ẩ ẫ ậ ố ồ ổ ỗ ộ.",
    "de": "Grüß Gott! Die Straße ist schön. ÄÖÜ äöü ß ẞ — „Anführungszeichen“.",
    "fr": "Ça va? L'été dernier, j'ai mangé des crêpes à la crème brûlée. Œuvre, cœur.",
    "tr": "İstanbul'da ılık bir gün. IĞDIR ığdır İi Iı.",
    "am": "ሰላም ለዓለም! ይህ የአማርኛ ዓረፍተ ነገር ነው።",
    "ta": "வணக்கம் உலகம்! இது தமிழ் வாக்கியம்.",
    "ka": "გამარჯობა მსოფლიო!",
    "hy": "Բարեւ աշխարհ!",
    "bn": "হ্যালো বিশ্ব! এটি একটি বাংলা বাক্য।",
    "my": "မင်္ဂလာပါ ကမ္ဘာလောက",
}

EMOJI = [
    "😀", "😂", "🥲", "👍", "👍🏻", "👍🏽", "👍🏿", "👩‍💻", "👨‍👩‍👧‍👦", "🧑🏽‍🚀", "❤️", "❤️‍🔥",
    "🏳️‍🌈", "🏴‍☠️", "🇺🇸", "🇯🇵", "🇩🇪", "🇫🇷🇮🇹", "1️⃣", "#️⃣", "☺️", "✌🏾", "🫠", "🦀", "🐍",
    "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "👁️‍🗨️", "🤷‍♀️", "💁🏼‍♂️", "🧔🏻‍♀️",
]

COMBINING = [
    "e\u0301", "a\u0308", "o\u0302\u0301", "u\u031b\u0300", "n\u0303", "c\u0327", "A\u030a",
    "a\u0301\u0316", "a\u0316\u0301", "a\u0323\u0302", "a\u0302\u0323", "i\u0307\u0301",
    "\u1100\u1161", "\u1100\u1161\u11a8", "\u1112\u1161\u11ab\u1100\u1173\u11af",  # Hangul jamo
    "\u212b", "\u2126", "\u212a", "\uf900", "\uf9d2", "\u0958", "\u095f", "\u0344", "\u0340",
    "\u0915\u093c", "\u09c7\u09be", "\u0b47\u0b3e", "\u0dd9\u0dcf", "\u1025\u102e",
    "\u0898a", "a\u0898\u0316", "e\u1df6\u0301", "\U00011935\U00011930", "\u0f71\u0f72",
    "\u05d1\u05bc", "\u0627\u0653", "\u0648\u0654", "x\u0301\u0301\u0301\u0301", "\u0301abc",
    "\u0308", "\u20dd", "A\u20e3", "e\u0304\u0301\u0323",
]

SPACES = [
    " ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2028", "\u2029", "\u0085",
    "\u200b", "\ufeff", "\u180e", "\u202f", "\u205f", "\u1680", "\u2000", "\u2003", "\u2009",
    "\u200a", "\x0b", "\x0c", "\u200c", "\u200d", "\u2060", "\u00ad", "\u200e", "\u200f",
    "\u202a", "\u202e", "\x1c", "\x1d", "\x1e", "\x1f",
]

UNICODE_DIGITS = [
    "٠١٢٣٤٥٦٧٨٩", "۰۱۲۳", "०१२३४५६७८९", "০১২৩", "１２３４５", "²³¹", "⁰⁴⁵", "₀₁₂", "ⅠⅡⅢⅫ",
    "ⅰⅱⅲ", "①②③⑩⑳", "½¾⅓", "𝟎𝟏𝟐𝟗", "〇一二三", "〡〢〣", "𐒠𐒡", "᭐᭑",
]

# Code point ranges used for random valid Unicode (surrogates excluded by construction).
RANDOM_RANGES = [
    (0x20, 0x7E), (0xA0, 0x24F), (0x250, 0x2FF), (0x300, 0x36F), (0x370, 0x52F),
    (0x530, 0x58F), (0x590, 0x6FF), (0x700, 0x8FF), (0x900, 0xDFF), (0xE00, 0xFFF),
    (0x1000, 0x1FFF), (0x2000, 0x2BFF), (0x2E80, 0x2FDF), (0x3000, 0x30FF), (0x3100, 0x4DBF),
    (0x4E00, 0x9FFF), (0xA000, 0xABFF), (0xAC00, 0xD7AF), (0xF900, 0xFAFF), (0xFB00, 0xFFFD),
    (0x10000, 0x1007F), (0x10300, 0x1034F), (0x10400, 0x104FF), (0x11000, 0x1107F),
    (0x11900, 0x1195F), (0x13000, 0x1342F), (0x16800, 0x16AFF), (0x1D400, 0x1D7FF),
    (0x1F000, 0x1FAFF), (0x20000, 0x2A6DF), (0x2F800, 0x2FA1F), (0xE0000, 0xE007F),
    (0xF0000, 0xF00FF), (0x10FF00, 0x10FFFF),
]


def escape_line_breakers(line):
    # json.dumps(ensure_ascii=False) leaves these raw; escape them so that no line reader can
    # mistake them for line ends.
    for ch in ("\u0085", "\u2028", "\u2029"):
        line = line.replace(ch, "\\u%04x" % ord(ch))
    return line


def rand_word(rng, lo=1, hi=10):
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(lo, hi)))


def rand_ident(rng):
    style = rng.randrange(4)
    parts = [rng.choice(WORDS) for _ in range(rng.randint(1, 3))]
    if style == 0:
        return "_".join(parts)
    if style == 1:
        return parts[0] + "".join(p.capitalize() for p in parts[1:])
    if style == 2:
        return "".join(p.capitalize() for p in parts)
    return "_".join(parts).upper()


def rand_sentence(rng, n_words=None):
    n = n_words or rng.randint(3, 18)
    words = [rng.choice(WORDS) for _ in range(n)]
    if rng.random() < 0.5:
        words[0] = words[0].capitalize()
    s = " ".join(words)
    return s + rng.choice([".", "!", "?", "", "...", ";", ":", ",", " —"])


def rand_unicode(rng, n):
    out = []
    for _ in range(n):
        lo, hi = rng.choice(RANDOM_RANGES)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def code_python(rng):
    f, a, b = rand_ident(rng), rand_ident(rng), rand_ident(rng)
    return (
        f"def {f}({a}, {b}=None):\n"
        f"    \"\"\"{rand_sentence(rng)}\"\"\"\n"
        f"    if {b} is None:\n"
        f"        {b} = [{rng.randint(0, 999)}, {rng.random():.4f}, 'x']\n"
        f"    for i in range({a}):\n"
        f"        print(f\"{{i}}: {{{b}[i % 3]!r}}\")  # {rand_sentence(rng, 4)}\n"
        f"    return {{'{a}': {a}, \"{b}\": {b}}}\n"
    )


def code_cpp(rng):
    cls, m = rand_ident(rng).title().replace("_", ""), rand_ident(rng)
    return (
        f"#include <vector>\n\ntemplate <typename T>\nclass {cls} {{\n public:\n"
        f"  explicit {cls}(size_t n) : data_(n) {{}}\n"
        f"  T& {m}(size_t i) {{ return data_[i]; }}  // {rand_sentence(rng, 5)}\n"
        f"  std::vector<std::pair<int, T>> items() const;\n\n private:\n"
        f"  std::vector<T> data_;\n}};\n\nint main() {{\n"
        f"  {cls}<float> x({rng.randint(1, 4096)});\n  x.{m}(0) += 1.5e-3f;\n"
        f"  return x.{m}(0) > 0 ? 0 : -1;\n}}\n"
    )


def code_js(rng):
    f = rand_ident(rng)
    return (
        f"const {f} = async (req, res) => {{\n"
        f"\tconst {{ id, name }} = req.params;\n"
        f"\tif (!id || id.length !== {rng.randint(1, 64)}) return res.status(400).json({{ error: 'bad id' }});\n"
        f"\tconst rows = await db.query(`SELECT * FROM users WHERE id = ${{id}}`);\n"
        f"\treturn res.json(rows.map((r) => ({{ ...r, tag: r.tag ?? 'none' }})));\n}};\n"
        f"export default {f};\n"
    )


def code_rust(rng):
    f = rand_ident(rng).lower()
    return (
        f"impl<'a> Tokenizer<'a> {{\n"
        f"    pub fn {f}(&mut self, s: &'a str) -> Result<Vec<u32>, Error> {{\n"
        f"        let mut out = Vec::with_capacity(s.len() / {rng.randint(2, 5)});\n"
        f"        for (i, c) in s.char_indices() {{ if c.is_whitespace() {{ continue; }} out.push(i as u32); }}\n"
        f"        Ok(out)\n    }}\n}}\n"
    )


def code_go(rng):
    return (
        f"package main\n\nimport \"fmt\"\n\nfunc {rand_ident(rng).title().replace('_', '')}(xs []int) (int, error) {{\n"
        f"\tsum := 0\n\tfor _, x := range xs {{\n\t\tsum += x * {rng.randint(2, 99)}\n\t}}\n"
        f"\tif sum < 0 {{\n\t\treturn 0, fmt.Errorf(\"negative: %d\", sum)\n\t}}\n\treturn sum, nil\n}}\n"
    )


def code_misc(rng):
    kind = rng.randrange(6)
    if kind == 0:
        return (f"SELECT u.id, COUNT(*) AS n FROM users u JOIN orders o ON o.user_id = u.id\n"
                f"WHERE o.created_at >= '2024-0{rng.randint(1, 9)}-01' GROUP BY u.id HAVING n > {rng.randint(1, 50)};")
    if kind == 1:
        return (f"<!DOCTYPE html>\n<html lang=\"en\">\n  <body class=\"{rand_ident(rng)}\">\n"
                f"    <p>{rand_sentence(rng)}</p>&nbsp;&amp;&lt;\n  </body>\n</html>")
    if kind == 2:
        obj = {"name": rand_ident(rng), "arguments": {"query": rand_sentence(rng), "k": rng.randint(1, 100)}}
        return "<tool_call>\n" + json.dumps(obj, ensure_ascii=False) + "\n</tool_call>"
    if kind == 3:
        return (f"#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do\n  grep -n \"{rand_word(rng)}\" \"$f\" | awk '{{print $1}}' >> out.log 2>&1\ndone")
    if kind == 4:
        return (f"server:\n  host: 0.0.0.0\n  port: {rng.randint(1024, 65535)}\n  tls: false\nmodels:\n"
                f"  - name: {rand_ident(rng)}\n    max_tokens: {rng.randint(1, 32768)}\n")
    return (f"# {rand_sentence(rng)}\n\n- **bold** and _italic_ and `code`\n- [link](https://example.com/{rand_word(rng)}?q=1&r=2)\n\n"
            f"| a | b |\n|---|---|\n| {rng.randint(0, 9)} | {rand_word(rng)} |\n\n```python\nprint('hi')\n```\n")


CODE_GENERATORS = [code_python, code_cpp, code_js, code_rust, code_go, code_misc]


def gen_code(rng):
    text = rng.choice(CODE_GENERATORS)(rng)
    variant = rng.randrange(5)
    if variant == 0:
        text = text.replace("\n", "\r\n")
    elif variant == 1:
        text = "\n".join(line + " " * rng.randint(0, 3) for line in text.split("\n"))
    elif variant == 2:
        text = text.replace("    ", "\t")
    return text


def gen_whitespace(rng):
    parts = []
    for _ in range(rng.randint(1, 8)):
        if rng.random() < 0.6:
            parts.append("".join(rng.choice(SPACES) for _ in range(rng.randint(1, 6))))
        else:
            parts.append(rng.choice([rand_word(rng), rng.choice(WORDS), "!", "123", "中文", "x"]))
    return "".join(parts)


def gen_numbers(rng):
    kind = rng.randrange(8)
    if kind == 0:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 40)))
    if kind == 1:
        return f"{rng.randint(-10**9, 10**9):,}"
    if kind == 2:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 8)}f} and {rng.uniform(0, 1):.3e}"
    if kind == 3:
        return f"v{rng.randint(0, 20)}.{rng.randint(0, 99)}.{rng.randint(0, 999)}-rc{rng.randint(1, 9)}"
    if kind == 4:
        return rand_word(rng) + str(rng.randint(0, 10**rng.randint(1, 12))) + rand_word(rng, 0, 3)
    if kind == 5:
        return rng.choice(UNICODE_DIGITS) + rng.choice(["", " ", "x", "1"]) + rng.choice(UNICODE_DIGITS)
    if kind == 6:
        return f"0x{rng.getrandbits(64):x} 0b{rng.getrandbits(12):b} {rng.randint(0, 255)}.{rng.randint(0, 255)}.0.1:{rng.randint(1, 65535)}"
    return f"+1 ({rng.randint(100, 999)}) {rng.randint(100, 999)}-{rng.randint(1000, 9999)}, 2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:00:00Z"


def case_variant(rng, s):
    return "".join(c.upper() if rng.random() < 0.5 else c for c in s)


def gen_contractions(rng):
    parts = []
    for _ in range(rng.randint(1, 6)):
        c = case_variant(rng, rng.choice(CONTRACTIONS))
        if rng.random() < 0.1:
            c = c.replace("s", "\u017f").replace("S", "\u017f")  # long s folds to s
        if rng.random() < 0.1:
            c = c.replace("'", "\u2019")
        before = rng.choice(["I", "you", "DON", "it", "we", "they", "", " ", "x", "'", "Y'all", "rock"])
        after = rng.choice(["", " ", "a", "ing", "!", "'", "s", "LL", "\n", "123"])
        parts.append(before + c + after)
    return rng.choice([" ", "", "  "]).join(parts)


def gen_script(rng):
    lang = rng.choice(sorted(SCRIPTS))
    text = SCRIPTS[lang]
    start = rng.randint(0, max(0, len(text) - 5))
    piece = text[start:start + rng.randint(3, 80)]
    if rng.random() < 0.3:
        piece += " " + rand_sentence(rng, 4)
    if rng.random() < 0.2:
        piece = rng.choice(SPACES) + piece + rng.choice(SPACES)
    return piece


def gen_emoji(rng):
    parts = []
    for _ in range(rng.randint(1, 8)):
        parts.append(rng.choice(EMOJI))
        if rng.random() < 0.4:
            parts.append(rng.choice([" ", "", "x", "!", "\n", " hello "]))
    return "".join(parts)


def gen_combining(rng):
    parts = []
    for _ in range(rng.randint(1, 6)):
        parts.append(rng.choice(COMBINING))
        if rng.random() < 0.5:
            parts.append(rng.choice([" ", "", "x", "abc", "1", "!", "\u3000"]))
    return "".join(parts)


def gen_special(rng):
    parts = []
    for _ in range(rng.randint(1, 7)):
        r = rng.random()
        if r < 0.45:
            parts.append(rng.choice(SPECIAL_TOKENS))
        elif r < 0.65:
            parts.append(rng.choice(PARTIAL_TOKENS))
        else:
            parts.append(rng.choice([rand_sentence(rng, 3), "\n", " ", "user\n", "assistant\n", "system", "  "]))
    return "".join(parts)


def gen_chat(rng):
    turns = []
    for role in ["system", "user", "assistant", "user", "assistant"][: rng.randint(2, 5)]:
        body = rand_sentence(rng)
        if role == "assistant" and rng.random() < 0.5:
            body = "<think>\n" + rand_sentence(rng) + "\n</think>\n\n" + body
        if rng.random() < 0.5:
            turns.append(f"<|im_start|>{role}\n{body}<|im_end|>\n")
        else:
            turns.append(f"<|start_header_id|>{role}<|end_header_id|>\n\n{body}<|eot_id|>")
    prefix = "<|begin_of_text|>" if rng.random() < 0.3 else ""
    return prefix + "".join(turns)


def gen_long(rng):
    kind = rng.randrange(7)
    if kind == 0:
        return rand_word(rng, 200, 600)
    if kind == 1:
        return rng.choice("=-*#_~.!/\\") * rng.randint(50, 600)
    if kind == 2:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(100, 1200)))
    if kind == 3:
        return " " * rng.randint(20, 700) + rand_word(rng) + "\n" * rng.randint(1, 40)
    if kind == 4:
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(100, 800))) + "=="
    if kind == 5:
        return "https://example.com/" + "/".join(rand_word(rng) for _ in range(rng.randint(5, 30))) + "?a=1&b=%20x#frag"
    return "".join(rng.choice(WORDS) for _ in range(rng.randint(50, 200)))  # no spaces


def gen_random_unicode(rng):
    return rand_unicode(rng, rng.randint(1, 60))


def gen_byte_level_chars(rng):
    # Text that contains the ByteLevel alphabet itself (U+0100..U+0143, Latin-1) and controls.
    chars = [chr(c) for c in range(0x100, 0x144)] + [chr(c) for c in range(0x80, 0x100)]
    chars += [chr(c) for c in range(0, 0x20)] + ["\x7f", "Ġ", "Ċ", "ĉ", "Ã©", "âĢĻ"]
    return "".join(rng.choice(chars) for _ in range(rng.randint(1, 30)))


def gen_prose(rng):
    sentences = [rand_sentence(rng) for _ in range(rng.randint(1, 6))]
    text = " ".join(sentences)
    if rng.random() < 0.3:
        text = '"' + text + '" — ' + rng.choice(WORDS).capitalize() + " (" + str(rng.randint(1900, 2030)) + ")"
    if rng.random() < 0.2:
        text = text.upper()
    return text


def gen_mixed(rng):
    gens = [gen_prose, gen_numbers, gen_script, gen_emoji, gen_combining, gen_special,
            gen_whitespace, gen_contractions, gen_random_unicode]
    return rng.choice(["", " ", "\n"]).join(rng.choice(gens)(rng) for _ in range(rng.randint(2, 5)))


GENERATORS = [
    (gen_code, 350), (gen_whitespace, 220), (gen_numbers, 200), (gen_contractions, 160),
    (gen_script, 260), (gen_emoji, 120), (gen_combining, 150), (gen_special, 200),
    (gen_chat, 100), (gen_long, 70), (gen_random_unicode, 200), (gen_byte_level_chars, 80),
    (gen_prose, 200), (gen_mixed, 200),
]


def fixed_cases():
    cases = ["", " ", "  ", "\n", "\r\n", "\t", "a", "A", "0", "'", "'s", "''", "<", "<|", "|>"]
    cases += [chr(c) for c in range(0x20, 0x7F)]  # every printable ASCII character alone
    cases += ["é", "中", "😀", "\u00a0", "\u3000", "\u2028", "\u0085", "\ufeff", "\u200b", "\u180e"]
    cases += [t for t in SPECIAL_TOKENS] + [t for t in PARTIAL_TOKENS]
    cases += ["Hello world", "Hello, world!", " Hello", "hello  world", "hello \n world",
              "I'm here. You're there. It's fine. We've won. They'll see. He'd go. Don't.",
              "I'M HERE. YOU'RE THERE. IT'S FINE. WE'VE WON. THEY'LL SEE. HE'D GO. DON'T.",
              "1 12 123 1234 12345 123456 1234567 12345678 123456789 1234567890",
              "   leading spaces", "trailing spaces   ", "\n\n\nnewlines\n\n\n", "a\r\nb\rc\nd",
              "tab\tseparated\tvalues\t", "x\u3000\u3000y", "emoji👍🏽 mix", "<|im_start|>user\nhi<|im_end|>\n"]
    return cases


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    default_out = os.path.join(here, "..", "tests", "data", "tokenizer", "corpus.jsonl")
    parser.add_argument("--out", default=os.path.normpath(default_out))
    args = parser.parse_args()

    rng = random.Random(SEED)
    texts = fixed_cases()
    for gen, count in GENERATORS:
        texts.extend(gen(rng) for _ in range(count))
    # Interleave categories so that any prefix of the corpus is varied.
    order = list(range(len(texts)))
    rng.shuffle(order)
    texts = [texts[i] for i in order]

    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    n_bytes = 0
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        for t in texts:
            line = escape_line_breakers(json.dumps({"text": t}, ensure_ascii=False))
            f.write(line + "\n")
            n_bytes += len(line.encode("utf-8")) + 1
    print(f"wrote {len(texts)} lines, {n_bytes} bytes to {args.out}")


if __name__ == "__main__":
    main()
