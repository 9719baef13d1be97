#!/usr/bin/env python3
"""Reference renderer: jinja2 configured exactly as transformers configures it for chat templates.

transformers compiles chat templates with
    ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                  extensions=[AssistantTracker, jinja2.ext.loopcontrols])
plus the filter tojson = json.dumps(x, ensure_ascii=False, indent, separators, sort_keys) and the
globals raise_exception(msg) and strftime_now(fmt), and renders with
    messages=..., tools=..., documents=..., add_generation_prompt=...,
    **{**tokenizer.special_tokens_map, **kwargs}.
This module rebuilds that environment on plain jinja2 (no transformers needed), so Kestrel's
interpreter can be checked here; tools/golden_chat.py produces the real goldens with transformers.

As a command it takes the same arguments and writes the same format as tools/golden_chat.py:
    jinja_reference.py --tokenizer-dir DIR --name NAME --cases cases.jsonl --out golden.jsonl
"""

import argparse
import json
import os
import sys
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

SPECIAL_TOKEN_NAMES = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token"]
# apply_chat_template's own parameters: they never reach the template.
CALL_PARAMETERS = {"tokenize", "padding", "truncation", "max_length", "return_tensors",
                   "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
                   "continue_final_message", "chat_template"}


class GenerationBlock(Extension):
    """{% generation %}...{% endgeneration %}: transformers' AssistantTracker tag. Without an
    assistant-mask request it renders its body unchanged, which is all this replicates."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def _token_string(value):
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def special_tokens_from_dir(tokenizer_dir):
    """The special_tokens_map transformers 5 builds from the tokenizer files: the named special
    tokens that are set (not None), plus the names of a dict-valued extra_special_tokens."""
    config, map_file = {}, {}
    path = os.path.join(tokenizer_dir, "tokenizer_config.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    path = os.path.join(tokenizer_dir, "special_tokens_map.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            map_file = json.load(f)
    out = {}
    for name in SPECIAL_TOKEN_NAMES:
        source = config if name in config else map_file
        tok = _token_string(source.get(name))
        if tok is not None:
            out[name] = tok
    if isinstance(config.get("extra_special_tokens"), dict):
        for key, value in config["extra_special_tokens"].items():
            tok = _token_string(value)
            if tok is not None:
                out[key] = tok
    return out


def templates_from_dir(tokenizer_dir):
    """{name: source}: "default" and, where the tokenizer has one, "tool_use"."""
    templates = {}
    path = os.path.join(tokenizer_dir, "chat_template.jinja")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            templates["default"] = f.read()
    else:
        with open(os.path.join(tokenizer_dir, "tokenizer_config.json"), encoding="utf-8") as f:
            template = json.load(f).get("chat_template")
        if isinstance(template, list):
            templates.update({t["name"]: t["template"] for t in template})
        elif template is not None:
            templates["default"] = template
    path = os.path.join(tokenizer_dir, "additional_chat_templates", "tool_use.jinja")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            templates["tool_use"] = f.read()
    return templates


def pick_template(templates, tools):
    """transformers' get_chat_template: "tool_use" when tools are given, else "default"."""
    if tools is not None and "tool_use" in templates:
        return templates["tool_use"]
    if "default" in templates:
        return templates["default"]
    raise ValueError("This model has multiple chat templates with no default specified!")


def render_chat(template, special_tokens, messages, tools=None, add_generation_prompt=False,
                kwargs=None):
    """apply_chat_template(messages, tools=..., add_generation_prompt=..., tokenize=False,
    **kwargs) for one conversation."""
    kwargs = dict(kwargs or {})
    continue_final_message = bool(kwargs.get("continue_final_message", False))
    documents = kwargs.pop("documents", None)
    if not isinstance(messages, list) or not messages:
        raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one "
                         "message.")
    if continue_final_message and add_generation_prompt:
        raise ValueError(
            "continue_final_message and add_generation_prompt are not compatible. Use "
            "continue_final_message when you want the model to continue the final message, and "
            "add_generation_prompt when you want to add a header that will prompt it to start a new "
            "assistant message instead.")
    template_kwargs = {**special_tokens,
                       **{k: v for k, v in kwargs.items() if k not in CALL_PARAMETERS}}
    compiled = make_env().from_string(template)
    rendered = compiled.render(messages=messages, tools=tools, documents=documents,
                               add_generation_prompt=add_generation_prompt, **template_kwargs)
    if continue_final_message:
        final_message = messages[-1]["content"]
        if isinstance(final_message, (list, tuple)):
            for block in reversed(final_message):
                if "text" in block:
                    final_message = block["text"]
                    break
            else:
                raise ValueError("continue_final_message is set but we could not find any text to "
                                 "continue in the final message!")
        if final_message.strip() not in rendered:
            raise ValueError(
                "continue_final_message is set but the final message does not appear in the chat "
                "after applying the chat template! This can happen if the chat template deletes "
                "portions of the final message. Please verify the chat template and final message "
                "in your chat to ensure they are compatible.")
        loc = rendered.rindex(final_message.strip())
        if rendered[loc:loc + len(final_message.lstrip())] == final_message:
            rendered = rendered[:loc + len(final_message.lstrip())]
        else:
            rendered = rendered[:loc + len(final_message.strip())]
    return rendered


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer-dir", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--cases", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    templates = templates_from_dir(args.tokenizer_dir)
    special = special_tokens_from_dir(args.tokenizer_dir)
    n_ok = n_err = 0
    with open(args.cases, encoding="utf-8") as f_in, open(args.out, "w", encoding="utf-8") as out:
        for line in f_in:
            if not line.strip():
                continue
            case = json.loads(line)
            row = {"name": case["name"]}
            try:
                template = pick_template(templates, case.get("tools"))
                row["rendered"] = render_chat(template, special, case["messages"], case.get("tools"),
                                              bool(case.get("add_generation_prompt", False)),
                                              case.get("kwargs") or {})
                n_ok += 1
            except Exception as e:  # every failure is data for the test
                row["error"] = str(e)
                n_err += 1
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{args.name}: {n_ok} rendered, {n_err} errors -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
