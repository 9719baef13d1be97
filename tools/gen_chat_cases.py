#!/usr/bin/env python3
"""Writes tests/data/chat/cases.jsonl: chat conversations that exercise real chat templates.

Each line is {"name", "messages", "tools" (list or null), "add_generation_prompt", "kwargs"}.
tools/golden_chat.py renders them with transformers (goldens), tools/jinja_reference.py with
plain jinja2 set up like transformers, and tests/chat/test_chat_golden.cpp with Kestrel.

    python3 tools/gen_chat_cases.py [--out tests/data/chat/cases.jsonl]
"""

import argparse
import json
import os
import sys

# ---------------------------------------------------------------- tools (JSON schemas)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "web_search",
        "description": "Search the web. Returns the top results as {title, url, snippet}.",
        "parameters": {
            "type": "object",
            "required": ["query"],  # key order differs from the usual on purpose
            "properties": {
                "query": {"type": "string"},
                "max_results": {"type": "integer", "minimum": 1, "maximum": 20, "default": 5},
                "filters": {
                    "type": "object",
                    "properties": {
                        "site": {"type": "string"},
                        "recency_days": {"type": ["integer", "null"]},
                        "lang": {"type": "array", "items": {"type": "string"}},
                    },
                },
            },
        },
    },
}
CALC = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Évalue une expression — 数学 ✓ \"quoted\" and \\backslash\\ and\nnewline",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"},
                                                        "precision": {"type": "number", "default": 1.0}},
                       "required": ["expression"], "additionalProperties": False},
    },
}
NO_PARAMS = {"type": "function", "function": {"name": "get_time", "description": "Current time",
                                              "parameters": {"type": "object", "properties": {}}}}
BARE = {"name": "legacy_tool", "description": "A tool given without the function wrapper",
        "parameters": {"type": "object", "properties": {"x": {"type": "number"}}}}

# ---------------------------------------------------------------- messages

SYS = {"role": "system", "content": "You are a helpful assistant."}
SYS_LONG = {"role": "system", "content": "You are Kestrel.\nFollow the rules:\n1. Be brief.\n2. Be correct.\n"}
U1 = {"role": "user", "content": "Hello!"}
A1 = {"role": "assistant", "content": "Hi! How can I help you today?"}
U2 = {"role": "user", "content": "What's the weather in Paris?"}
U3 = {"role": "user", "content": "And tomorrow?"}


def call(name, args, id_=None, as_string=False):
    c = {"type": "function", "function": {"name": name,
                                          "arguments": json.dumps(args, ensure_ascii=False) if as_string else args}}
    if id_:
        c["id"] = id_
    return c


def tool_msg(content, name=None, id_=None):
    m = {"role": "tool", "content": content}
    if name:
        m["name"] = name
    if id_:
        m["tool_call_id"] = id_
    return m


CALL_DICT = {"role": "assistant", "content": "", "tool_calls": [call("get_current_weather",
                                                                      {"location": "Paris, France", "unit": "celsius"}, "call_1")]}
CALL_STR = {"role": "assistant", "content": "", "tool_calls": [call("get_current_weather",
                                                                     {"location": "Paris, France"}, "call_1", as_string=True)]}
CALL_WITH_TEXT = {"role": "assistant", "content": "Let me check that for you.",
                  "tool_calls": [call("get_current_weather", {"location": "Paris"}, "call_2")]}
CALL_MULTI = {"role": "assistant", "content": "", "tool_calls": [
    call("get_current_weather", {"location": "Paris"}, "c1"),
    call("web_search", {"query": "Paris events", "max_results": 3, "filters": {"lang": ["fr", "en"], "recency_days": None}}, "c2"),
    call("calculate", {"expression": "2*(3+4)", "precision": 1.0}, "c3", as_string=True)]}
TOOL_RESULT = tool_msg('{"temperature": 18, "unit": "celsius", "condition": "cloudy"}', "get_current_weather", "call_1")
TOOL_RESULTS = [tool_msg('{"temperature": 18}', "get_current_weather", "c1"),
                tool_msg('[{"title": "Fête", "url": "https://example.org/a?b=1&c=2"}]', "web_search", "c2"),
                tool_msg("14", "calculate", "c3")]
A_FINAL = {"role": "assistant", "content": "It is 18°C and cloudy in Paris."}
A_THINK = {"role": "assistant", "content": "<think>\nThe user greets me. I should greet back.\n</think>\n\nHello! Nice to meet you."}
A_THINK_NO_NL = {"role": "assistant", "content": "<think>short</think>Answer right away."}
A_REASONING = {"role": "assistant", "content": "The answer is 4.", "reasoning_content": "2+2=4, simple arithmetic."}
A_REASONING_NONE = {"role": "assistant", "content": "Plain answer.", "reasoning_content": None}
A_REASONING_EMPTY = {"role": "assistant", "content": "Plain answer.", "reasoning_content": ""}


def conv(*msgs):
    return [dict(m) for m in msgs]


CONVERSATIONS = {
    "single_user": conv(U1),
    "system_user": conv(SYS, U1),
    "system_long_user": conv(SYS_LONG, U2),
    "multi_turn": conv(SYS, U1, A1, U2),
    "multi_turn_no_system": conv(U1, A1, U2, {"role": "assistant", "content": "Sunny."}, U3),
    "ends_with_assistant": conv(SYS, U1, A1),
    "think_in_content": conv(U1, A_THINK, U2),
    "think_in_last_assistant": conv(U1, A_THINK),
    "think_no_newlines": conv(U1, A_THINK_NO_NL, U3),
    "reasoning_content": conv(SYS, {"role": "user", "content": "What is 2+2?"}, A_REASONING, U3),
    "reasoning_content_last": conv({"role": "user", "content": "What is 2+2?"}, A_REASONING),
    "reasoning_none": conv(U1, A_REASONING_NONE, U3),
    "reasoning_empty_last": conv(U1, A_REASONING_EMPTY),
    "tool_call_dict_args": conv(SYS, U2, CALL_DICT, TOOL_RESULT),
    "tool_call_dict_args_final": conv(SYS, U2, CALL_DICT, TOOL_RESULT, A_FINAL),
    "tool_call_string_args": conv(U2, CALL_STR, TOOL_RESULT),
    "tool_call_with_text": conv(U2, CALL_WITH_TEXT, TOOL_RESULT, A_FINAL, U3),
    "tool_calls_multi": conv(SYS, U2, CALL_MULTI, *TOOL_RESULTS),
    "tool_calls_multi_final": conv(U2, CALL_MULTI, *TOOL_RESULTS, A_FINAL),
    "tool_call_after_think": conv(U2, {"role": "assistant", "content": "<think>\nNeed weather.\n</think>\n\n",
                                       "tool_calls": [call("get_current_weather", {"location": "Paris"})]}, TOOL_RESULT),
    "tool_call_reasoning_field": conv(U2, {"role": "assistant", "content": "", "reasoning_content": "I need the weather tool.",
                                           "tool_calls": [call("get_current_weather", {"location": "Paris"})]}, TOOL_RESULT),
    "tool_call_flat_no_function_key": conv(U2, {"role": "assistant", "content": "",
                                                "tool_calls": [{"name": "get_current_weather", "arguments": {"location": "Rome"}}]},
                                           TOOL_RESULT),
    "tool_call_nested_args": conv(U2, {"role": "assistant", "content": "", "tool_calls": [call("web_search", {
        "query": "q", "filters": {"site": "example.org", "lang": ["en"], "recency_days": 7},
        "weights": [1.0, 0.5, 2], "flag": True, "none": None, "unicode": "日本語 😀"})]}, tool_msg("ok")),
    "tool_response_user_lookalike": conv({"role": "user", "content": "<tool_response>\nfake\n</tool_response>"}, A1, U1),
    "multi_step_tools": conv(SYS, U2, CALL_DICT, TOOL_RESULT,
                             {"role": "assistant", "content": "",
                              "tool_calls": [call("web_search", {"query": "Paris weather tomorrow"})]},
                             tool_msg("Rain expected."), A_FINAL),
    "tool_without_user": conv(SYS, CALL_DICT, TOOL_RESULT),
    "only_system": conv(SYS),
    "only_assistant": conv(A1),
    "unicode_content": conv({"role": "system", "content": "Réponds en français. 日本語も話せます。"},
                            {"role": "user", "content": "Ça va? 👋🏽 Здравствуйте! مرحبا שלום e\u0301 \u200bzero-width"}),
    "unicode_emoji_assistant": conv(U1, {"role": "assistant", "content": "🎉🎉 ✓ — “quotes” ‘single’ …"}, U3),
    "empty_user_content": conv({"role": "user", "content": ""}),
    "empty_assistant_content": conv(U1, {"role": "assistant", "content": ""}, U3),
    "whitespace_content": conv({"role": "user", "content": "   \n\t  padded question  \n\n"}, {"role": "assistant", "content": "\n\nanswer\n\n"}, U3),
    "special_token_text": conv({"role": "user", "content": "Print <|im_start|> and <|im_end|> and <|eot_id|> literally."}),
    "braces_and_jinja_text": conv({"role": "user", "content": "{{ not a template }} {% if %} {# x #}"}),
    "long_content": conv(SYS, {"role": "user", "content": "lorem ipsum " * 400}),
    "extra_message_keys": conv({"role": "user", "content": "Hi", "name": "alice", "id": 7}),
    "tool_role_names": conv(U2, CALL_DICT, tool_msg("18C", "get_current_weather", "call_1"), U3),
    "consecutive_users": conv(U1, U2, U3),
    "consecutive_assistants": conv(U1, A1, {"role": "assistant", "content": "Anything else?"}),
    "system_not_first": conv(U1, {"role": "system", "content": "Late system message."}, U2),
    "newline_heavy": conv({"role": "user", "content": "\n\n\n"}, {"role": "assistant", "content": "<think>\n\n</think>\n\n\n\nx"}, U1),
    "think_without_close": conv(U1, {"role": "assistant", "content": "<think>never closed"}, U3),
    "close_without_open": conv(U1, {"role": "assistant", "content": "text</think>after"}, U3),
    "many_turns": conv(SYS, *[m for i in range(6) for m in (
        {"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": f"Answer {i}."})], U3),
}

TOOLSETS = {
    "weather": [WEATHER],
    "all": [WEATHER, SEARCH, CALC, NO_PARAMS],
    "bare": [BARE, WEATHER],
}


def build_cases():
    cases = []

    def add(name, messages, tools=None, agp=False, kwargs=None):
        cases.append({"name": name, "messages": messages, "tools": tools, "add_generation_prompt": agp,
                      "kwargs": kwargs or {}})

    # every conversation, with and without the generation prompt
    for cname, msgs in CONVERSATIONS.items():
        add(f"{cname}", msgs, None, False)
        add(f"{cname}__gen", msgs, None, True)
    # thinking switches
    for cname in ["single_user", "multi_turn", "think_in_content", "reasoning_content", "tool_call_dict_args"]:
        for value in (True, False):
            add(f"{cname}__gen__thinking_{str(value).lower()}", CONVERSATIONS[cname], None, True,
                {"enable_thinking": value})
    # tools offered
    for cname in ["single_user", "system_user", "system_long_user", "multi_turn", "tool_call_dict_args",
                  "tool_call_dict_args_final", "tool_call_string_args", "tool_calls_multi", "tool_calls_multi_final",
                  "tool_call_with_text", "multi_step_tools", "tool_call_nested_args", "unicode_content",
                  "tool_without_user", "only_system", "think_in_content", "reasoning_content"]:
        for tname, tools in TOOLSETS.items():
            if tname != "weather" and cname not in ("single_user", "system_user", "tool_calls_multi", "tool_without_user"):
                continue
            add(f"{cname}__tools_{tname}__gen", CONVERSATIONS[cname], tools, True)
    add("tool_calls_multi__tools_all__gen__thinking_false", CONVERSATIONS["tool_calls_multi"], TOOLSETS["all"], True,
        {"enable_thinking": False})
    add("single_user__tools_empty_list__gen", CONVERSATIONS["single_user"], [], True)
    # extra template variables
    add("single_user__date_string", CONVERSATIONS["single_user"], None, True, {"date_string": "26 Jul 2024"})
    add("system_user__custom_kwargs", CONVERSATIONS["system_user"], None, True,
        {"custom_flag": True, "date_string": "01 Jan 2025", "tools_in_user_message": False})
    add("single_user__documents", CONVERSATIONS["single_user"], None, True,
        {"documents": [{"title": "Doc A", "text": "Alpha."}, {"title": "Doc B", "text": "Beta."}]})
    add("single_user__bos_override", CONVERSATIONS["single_user"], None, True, {"bos_token": "<BOS>"})
    # continue_final_message
    add("continue_final_message", conv(U1, {"role": "assistant", "content": "Sure, here is"}), None, False,
        {"continue_final_message": True})
    add("continue_final_message_trailing_space", conv(U1, {"role": "assistant", "content": "Partial answer  "}), None,
        False, {"continue_final_message": True})
    # errors
    add("error_empty_messages", [], None, True)
    add("error_continue_and_generation_prompt", conv(U1, A1), None, True, {"continue_final_message": True})
    add("content_none_with_tool_calls", conv(U2, {"role": "assistant", "content": None,
                                                  "tool_calls": [call("get_current_weather", {"location": "Paris"})]},
                                             TOOL_RESULT), [WEATHER], True)
    add("content_parts_list", conv({"role": "user", "content": [{"type": "text", "text": "Describe "},
                                                                {"type": "text", "text": "this."}]}), None, True)
    add("system_content_parts_with_tools", conv({"role": "system", "content": [{"type": "text", "text": "sys"}]}, U1),
        [WEATHER], True)
    add("missing_content_key", conv({"role": "user"}), None, True)
    add("missing_role_key", conv({"content": "no role"}), None, True)
    add("assistant_content_int", conv(U1, {"role": "assistant", "content": 42}, U3), None, True)
    return cases


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--out", default=os.path.join(here, "..", "tests", "data", "chat", "cases.jsonl"))
    args = parser.parse_args()
    cases = build_cases()
    names = [c["name"] for c in cases]
    assert len(names) == len(set(names)), "duplicate case names"
    with open(args.out, "w", encoding="utf-8") as out:
        for c in cases:
            out.write(json.dumps(c, ensure_ascii=False) + "\n")
    print(f"{len(cases)} cases -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
