#!/usr/bin/env python3
"""Writes tests/data/chat/jinja_unit.jsonl: small templates rendered by real jinja2 with the
environment transformers uses (see tools/jinja_reference.py). Each line is
    {"name", "template", "context", "expected"}            when jinja2 renders, or
    {"name", "template", "context", "error", "raised"}     when it raises (raised: the error
                                                           came from raise_exception, so its
                                                           message must match verbatim).
tests/chat/test_jinja_unit.cpp renders every line with Kestrel's interpreter and compares.

    python3 tools/gen_jinja_unit.py [--out tests/data/chat/jinja_unit.jsonl]
"""

import argparse
import json
import os
import sys

import jinja2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jinja_reference import make_env  # noqa: E402

MSGS = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "What is 2+2?"},
]
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Get weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                       "days": {"type": "integer", "minimum": 1}}, "required": ["city"]}}}
DATA = {"s": "Hello World", "n": 5, "f": 2.5, "z": 0, "t": True, "no": None, "e": "",
        "l": [3, 1, 2], "words": ["b", "A", "c", "a"], "d": {"b": 2, "a": 1, "c": 3},
        "u": "héllo wörld ✓ 😀", "users": [{"name": "bob", "age": 30}, {"name": "Al", "age": 25},
        {"name": "cy", "age": 30, "tags": ["x"]}], "nested": {"a": {"b": {"c": 42}}},
        "msgs": MSGS, "tool": TOOL, "fl": [1.0, 2.5, -0.5], "big": 12345678901234,
        "ws": "  \t padded \n ", "lines": "one\ntwo\n\nthree", "mixed": [1, "a", None, True, 2.0]}

CASES = [
    # ---- text, comments, whitespace control, trim_blocks / lstrip_blocks
    ("text_plain", "plain text", {}),
    ("text_trailing_newline_dropped", "line\n", {}),
    ("text_two_trailing_newlines", "line\n\n", {}),
    ("text_crlf", "a\r\nb\rc\n", {}),
    ("comment", "a{# comment #}b", {}),
    ("comment_trim", "a\n{# c #}\nb", {}),
    ("comment_lstrip", "a\n    {# c #}\nb", {}),
    ("comment_minus", "a   {#- c -#}   b", {}),
    ("var_basic", "{{ s }}", DATA),
    ("var_minus_both", "a  \n {{- s -}}  \n b", DATA),
    ("var_plus_noop", "a  {{+ s }} b", DATA),
    ("var_not_lstripped", "x\n    {{ s }}\n", DATA),
    ("block_trim_newline", "{% if t %}\nyes\n{% endif %}\nafter", DATA),
    ("block_lstrip", "start\n    {% if t %}\n    inside\n    {% endif %}\nend", DATA),
    ("block_lstrip_tabs", "start\n\t \t{% if t %}x{% endif %}\nend", DATA),
    ("block_lstrip_not_after_text", "start  {% if t %}x{% endif %}  end", DATA),
    ("block_plus_disables_lstrip", "a\n    {%+ if t %}x{% endif %}\nb", DATA),
    ("block_plus_end_keeps_newline", "{% if t +%}\nx{% endif %}", DATA),
    ("block_minus", "a   \n  {%- if t -%}  \n  x  {%- endif -%}  \n b", DATA),
    ("block_minus_start_only", "a \n {%- if t %}\nx\n{% endif %}", DATA),
    ("block_lstrip_first_line", "   {% if t %}x{% endif %}", DATA),
    ("block_lstrip_unicode_space", "a\n\u3000{% if t %}x{% endif %}", DATA),
    ("block_trim_only_one_newline", "{% if t %}\n\nx{% endif %}", DATA),
    ("raw_block", "{% raw %}{{ not rendered }}{% endraw %}", {}),
    ("raw_block_ws", "a\n  {% raw %}\n{{ x }}\n  {% endraw %}\nb", {}),
    ("nested_blocks_indent",
     "{% for m in msgs %}\n    {% if m.role == 'user' %}\n        U:{{ m.content }}\n    {% else %}\n"
     "        O:{{ m.role }}\n    {% endif %}\n{% endfor %}", DATA),
    ("qwen_style_minus",
     "{%- for m in msgs %}\n    {{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}\n"
     "{%- endfor %}\n{%- if true %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n", DATA),

    ("ws_tag_after_trimmed_newline", "{% if t %}\n  {% if t %}x{% endif %}\n{% endif %}", DATA),
    ("ws_var_then_block_same_line", "{{ s }}  {% if t %}x{% endif %}  {{ n }}", DATA),
    ("ws_comment_then_block", "{# c #}\n   {% if t %}x{% endif %}", DATA),
    ("ws_minus_var_then_indented_block", "{{ s -}}\n   {% if t %}x{% endif %}", DATA),
    ("ws_minus_var_spaces_then_block", "{{ s -}}   \n  text\n  {% if t %}y{% endif %}", DATA),
    ("ws_block_end_minus_then_text", "{% if t -%}   \n\n  text{%- endif %}", DATA),
    ("ws_lstrip_only_whitespace_line", "a\n \t {% set x = 1 %} \nb", {}),
    ("ws_lstrip_not_when_text_before", "a\n x {% set x = 1 %}\nb", {}),
    ("ws_trim_crlf_template", "{% if t %}\r\nyes\r\n{% endif %}\r\nend\r\n", DATA),
    ("ws_plus_both_sides", "a\n  {%+ if t +%}\n  x\n  {%+ endif +%}\nb", DATA),
    ("ws_minus_comment_only", "a  {#- c #}  b  {# d -#}  c", {}),
    ("ws_raw_minus", "a  {%- raw -%}  {{ x }}  {%- endraw -%}  b", {}),
    ("ws_raw_lstrip_trim", "a\n    {% raw %}\n  body\n    {% endraw %}\nb", {}),
    ("ws_for_lines", "<ul>\n{% for x in l %}\n  <li>{{ x }}</li>\n{% endfor %}\n</ul>", DATA),
    ("ws_empty_template", "", {}),
    ("ws_only_newline", "\n", {}),
    ("ws_trailing_spaces_kept", "x   ", {}),
    ("ws_unicode_nbsp_strip_minus", "a\u00a0\u2003 {{- s }}", DATA),
    ("ws_macro_call_indent", "{% macro m() %}\n  inner\n{% endmacro %}\n  {{ m() }}\n  {% if t %}\n  z\n  {% endif %}", DATA),
    ("ws_set_block_lstrip", "{% set x %}\n    {% if t %}\n    a\n    {% endif %}\n{% endset %}[{{ x }}]", DATA),
    ("ws_dict_literal_in_var", "{{ {'a': {'b': 1}} }}", {}),
    ("ws_dict_literal_in_block", "{% set d2 = {'a': {'b': 1}} %}{{ d2.a.b }}", {}),
    ("case_unicode", "{{ 'straße ﬁ ŉ' | upper }} {{ 'İSTANBUL ΟΔΟΣ ΣΑΣ Σ' | lower }} {{ 'ßa' | title }} {{ 'ßa' | capitalize }} {{ 'ǆa'.title() }} {{ 'ΣΑΣ ΟΔΟΣ'.lower() }}", {}),
    ("case_title_method_vs_filter", "{{ \"they're bill's\".title() }} | {{ \"they're bill's\" | title }} | {{ 'a1b2 c3'.title() }}", {}),
    ("repr_floats_in_list", "{{ [1e-05, 1e16, 1.5e300, 0.0001, -0.0, 123456789.123, 1/3] }}", {}),
    ("float_special", "{{ 1e308 * 10 }} {{ -1e308 * 10 }} {{ (1e308 * 10) | tojson }}", {}),
    ("int_float_str_conversions", "{{ '1_000' | int }} {{ '1e3' | int }} {{ '-12' | int }} {{ '+5' | float }} {{ 'inf' | float }} {{ 'nan' | float | string }} {{ '  3.5  ' | float }}", {}),
    ("round_negative_precision", "{{ 1234.5 | round(-2) }} {{ 1250 | round(-2) }} {{ 0.125 | round(2) }} {{ 2.5 | round(0, 'floor') }}", {}),
    ("str_format_specs", "{{ '{:+d} {:x} {:#x} {:o} {:b} {:e} {:.3g} {:%} {:>8.3f}|'.format(5, 255, 255, 8, 5, 1234.5, 0.000123456, 0.25, 3.14159) }}", {}),
    ("str_format_fill_align", "{{ '{:*^9}|{:-<6}|{:0>4}|{:=+6}'.format('mid', 'l', 7, 12) }}", {}),
    ("str_format_conversions", "{{ '{!r} {!s} {}'.format('q', 'w', none) }} {{ '{{literal}}'.format() }}", {}),
    ("percent_format_more", "{{ '%+d|% d|%5.1f|%-6s|%06.2f|%c|%%|%i' % (5, 3, 2.25, 'ab', -1.5, 65, 7) }}", {}),
    ("percent_format_dict", "{{ '%(a)s-%(b)05d' % {'a': 'x', 'b': 42} }}", {}),
    ("loop_in_macro_caller_interplay", "{% macro m(items) %}{% for i in items %}{{ caller(i, loop.index) }}{% endfor %}{% endmacro %}{% call(x, n) m(['a', 'b']) %}{{ n }}{{ x }};{% endcall %}", {}),
    ("namespace_in_macro", "{% set ns = namespace(total=0) %}{% macro add(x) %}{% set ns.total = ns.total + x %}{% endmacro %}{{ add(2) }}{{ add(3) }}{{ ns.total }}", {}),
    ("nested_namespace_loops", "{% set ns = namespace(s='') %}{% for a in 'ab' %}{% for b in 'xy' %}{% set ns.s = ns.s ~ a ~ b ~ loop.index ~ ',' %}{% endfor %}{% endfor %}{{ ns.s }}", {}),
    ("set_shadow_in_loop_then_outer", "{% set content = 'outer' %}{% for m in msgs %}{% set content = m.content %}{% endfor %}{{ content }}", DATA),
    ("loop_var_shadow_outer", "{% set m = 'outer' %}{% for m in [1, 2] %}{% endfor %}{{ m }}", {}),
    ("loop_last_with_filter_if", "{% for x in range(6) if x % 2 %}{{ x }}{{ ',' if not loop.last }}{% endfor %}", {}),
    ("dict_iteration_order_and_tojson_sort", "{% set dd = {'b': 1, 'a': {'d': 1, 'c': 2}} %}{% for k in dd %}{{ k }}{% endfor %} {{ dd | tojson(sort_keys=true) }}", {}),
    ("selectattr_on_dicts_missing", "{{ msgs | selectattr('tool_calls') | list | length }} {{ msgs | selectattr('tool_calls', 'undefined') | list | length }}", DATA),
    ("map_then_join_numbers", "{{ users | map(attribute='age') | join('+') }}={{ users | sum(attribute='age') }}", DATA),
    ("list_of_tuples_repr", "{{ d | dictsort | list }} {{ [(1, 'a'), ('b',)] }}", DATA),
    ("string_multiplication_in_indent", "{% for i in range(3) %}{{ '  ' * i }}{{ i }}\n{% endfor %}", {}),
    ("is_test_on_attribute_chain", "{{ msgs[0].content is string and msgs[0].content | length > 3 }}", DATA),
    ("comparison_of_loop_index", "{% for m in msgs %}{% if loop.index0 > 1 %}{{ m.role }}{% endif %}{% endfor %}", DATA),
    ("in_on_dict_keys_values", "{{ 'a' in d.keys() }} {{ 2 in d.values() }} {{ ('a', 1) in d.items() }}", DATA),
    ("concat_lists_and_len", "{{ (l + [9]) | length }} {{ (msgs[:1] + msgs[-1:]) | map(attribute='role') | join }}", DATA),

    ("misc_macro_repr", "{% macro m() %}{% endmacro %}{{ m }}|{{ m is callable }}", {}),
    ("misc_tools_map_chain", "{{ tools | map(attribute='function') | map(attribute='name') | join(', ') }}", {"tools": [TOOL, {"type": "function", "function": {"name": "x"}}]}),
    ("misc_number_tests_on_len", "{{ msgs | length is even }} {{ (msgs | length) is divisibleby(2) }}", DATA),
    ("misc_float_ops", "{{ 0.1 * 3 }} {{ 2 ** 0.5 }} {{ 10 // 3.0 }} {{ 10 % 3.5 }} {{ 1e3 | int }} {{ 'a' * 0 }}|{{ 7.0 / 2 }} {{ -7 / 2 }}", {}),
    ("misc_bool_ops", "{{ true and none }} {{ false or 0 }} {{ none or '' }}|{{ [] or {} }} {{ 0 and 1 }}", {}),
    ("misc_emoji_slicing", "{{ '👍🏽ok'[0] }}|{{ '👍🏽ok'[:2] }}|{{ '👍🏽ok' | length }}|{{ 'e\u0301' | length }}", {}),
    ("misc_content_type_switch", "{% for m in parts %}{% set c = m.content if m.content is string else m.content | map(attribute='text') | select('defined') | join('') %}[{{ c }}]{% endfor %}", {"parts": [{"content": "s"}, {"content": [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]}]}),
    ("misc_strip_len", "{{ ws.strip() | length > 0 }} {{ e.strip() | length > 0 }}", DATA),
    ("misc_range_join", "{{ range(3) | join(',') }} {{ range(3) | map('string') | join }} {{ (1, 2) | list }}", {}),
    ("misc_dict_items_list", "{{ dict(a=1, b=2).items() | list }} {{ {'x': 1}.get('y', {}).get('z', 'deep') }}", {}),
    ("misc_sum_slices", "{% set x = [1, 2, 3] %}{{ x[1:] | sum }} {{ 'abc'[1:] ~ 'd' }} {{ x[-1:] }} {{ x[:-1] }}", {}),
    ("misc_nested_quotes_json", "{{ {'q': 'say \"hi\"', 'b': 'back\\slash'} | tojson }} {{ 'a\\nb' }}", {}),
    ("misc_int_keys_sort", "{{ {3: 'c', 1: 'a', 2: 'b'} | dictsort }} {{ [3, 1.5, true, 0] | sort }}", {}),
    ("misc_sort_mixed_error", "{{ [1, 'a'] | sort }}", {}),
    ("misc_undefined_in_list_repr", "{{ [missing, 1] }}", {}),
    ("misc_loop_index_math", "{% for m in msgs %}{{ (loop.index0 - 1) // 2 }}{{ loop.revindex % 2 }},{% endfor %}", DATA),
    ("misc_set_list_literal_concat", "{% set out = [] %}{% for m in msgs %}{% set out = out + [m.role] %}{% endfor %}{{ out }}", DATA),
    ("misc_is_none_chain", "{{ (d.get('zz') is none) and (d.get('a') is not none) }}", DATA),
    ("misc_string_comparisons_in", "{% for m in msgs %}{{ m.role in ['user', 'system'] }}{{ m.role not in ('assistant',) }} {% endfor %}", DATA),
    ("misc_trim_filter_chars_unicode", "[{{ '«quoted»' | trim('«»') }}] [{{ '\u3000wide\u3000' | trim }}]", {}),

    # ---- literals
    ("lit_strings", "{{ 'a' }}{{ \"b\" }}{{ 'it\\'s' }}{{ \"q\\\"q\" }}", {}),
    ("lit_escapes", "{{ 'tab\\tnl\\nbs\\\\ \\x41 \\u00e9 \\U0001F600 \\101' }}", {}),
    ("lit_unknown_escape", "{{ 'a\\d\\[' }}", {}),
    ("lit_adjacent_strings", "{{ 'a' 'b' \"c\" }}", {}),
    ("lit_ints", "{{ 42 }} {{ 0 }} {{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }}", {}),
    ("lit_floats", "{{ 1.5 }} {{ 1.0 }} {{ 2e3 }} {{ 1.5e-7 }} {{ 0.1 }} {{ 1e16 }} {{ 1e15 }}", {}),
    ("lit_bools_none", "{{ true }} {{ True }} {{ false }} {{ False }} {{ none }} {{ None }}", {}),
    ("lit_list", "{{ [1, 'a', none, true, 1.5, [2]] }}", {}),
    ("lit_list_trailing_comma", "{{ [1, 2,] }}", {}),
    ("lit_dict", "{{ {'a': 1, 'b': [1, 2], 'c': {'d': none}} }}", {}),
    ("lit_dict_int_keys", "{{ {1: 'a', 2: 'b'}[1] }}{{ {1: 'x'}[1.0] }}{{ {1: 'y'}[true] }}", {}),
    ("lit_tuple", "{{ (1, 2) }} {{ (1,) }} {{ () }} {{ 1, 2 }}", {}),
    ("lit_string_repr_quotes", "{{ ['it\\'s', 'say \"hi\"', 'both \\' \"', 'nl\\n', 'é'] }}", {}),
    ("lit_repr_control", "{{ ['\\x01', '\\x7f', '\\u200b', '\\u00a0'] }}", {}),

    # ---- arithmetic and operators
    ("arith_int", "{{ 7 + 3 }} {{ 7 - 10 }} {{ 6 * 7 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }}", {}),
    ("arith_negative_floor", "{{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ -7.5 // 2 }} {{ -7.5 % 2 }}", {}),
    ("arith_float", "{{ 1.5 + 1 }} {{ 0.1 + 0.2 }} {{ 3 / 1 }} {{ 2.0 * 3 }} {{ 10 / 4 }}", {}),
    ("arith_pow_left_assoc", "{{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 2 ** -1 }}", {}),
    ("arith_precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 10 - 2 - 3 }} {{ 2 * 3 % 4 }}", {}),
    ("arith_bool_int", "{{ true + 1 }} {{ true * 3 }} {{ false - 1 }}", {}),
    ("arith_unary", "{{ -n }} {{ +n }} {{ -f }} {{ - -3 }}", DATA),
    ("arith_str_concat", "{{ 'a' + 'b' }} {{ 'ab' * 3 }} {{ 2 * 'x' }} {{ [1] + [2] }} {{ [0] * 2 }}", {}),
    ("arith_tilde", "{{ 'a' ~ 1 ~ none ~ true ~ 1.0 ~ undefined_thing }}", {}),
    ("arith_tilde_precedence", "{{ 1 + 2 ~ 3 }} {{ 'x' ~ 2 * 3 }}", {}),
    ("arith_tilde_precedence_error", "{{ 'a' ~ 1 + 2 }}", {}),
    ("arith_big", "{{ big * 2 }} {{ big // 7 }}", DATA),
    ("arith_div_zero", "{{ 1 / 0 }}", {}),
    ("arith_type_error", "{{ 'a' + 1 }}", {}),
    ("arith_undefined_error", "{{ missing + 1 }}", {}),
    ("percent_format", "{{ '%s-%d' % ('a', 3) }} {{ '%05.2f' % 3.14159 }} {{ '%x|%5s|%-5s|' % (255, 'ab', 'cd') }}", {}),
    ("percent_format_single", "{{ 'v=%s' % n }} {{ '%r' % 'q' }} {{ '100%%' % () }}", DATA),

    # ---- comparisons and logic
    ("cmp_basic", "{{ 1 < 2 }} {{ 2 <= 2 }} {{ 3 > 4 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'b' }}", {}),
    ("cmp_chain", "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 1 == 1 == 1.0 }}", {}),
    ("cmp_strings", "{{ 'abc' < 'abd' }} {{ 'B' < 'a' }} {{ 'é' > 'z' }}", {}),
    ("cmp_lists", "{{ [1, 2] < [1, 3] }} {{ [1, 2] == [1, 2] }} {{ [1] < [1, 0] }} {{ [1,2] == (1,2) }}", {}),
    ("cmp_none", "{{ none == none }} {{ none == 0 }} {{ no is none }} {{ none != false }}", DATA),
    ("cmp_dicts", "{{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }} {{ {'a': 1} == {'a': 1.0} }}", {}),
    ("cmp_type_error", "{{ 1 < 'a' }}", {}),
    ("cmp_undefined_eq", "{{ missing == none }} {{ missing == missing2 }} {{ missing != 1 }}", {}),
    ("logic_and_or_values", "{{ 0 or 'x' }} {{ 1 and 'y' }} {{ '' or [] }} {{ none and 1 }} {{ 'a' or b }}", {}),
    ("logic_not", "{{ not true }} {{ not 0 }} {{ not '' }} {{ not [] }} {{ not missing }} {{ not not 1 }}", {}),
    ("logic_precedence", "{{ true or false and false }} {{ not true == false }} {{ not 1 in [1] }}", {}),
    ("in_operator", "{{ 'ell' in s }} {{ 2 in l }} {{ 'a' in d }} {{ 'z' not in d }} {{ 4 not in l }} {{ 'x' in missing }}", DATA),
    ("in_string_type_error", "{{ 1 in 'abc' }}", {}),
    ("condexpr", "{{ 'y' if t else 'n' }} {{ 'y' if no else 'n' }} [{{ 'y' if false }}] {{ 1 if 0 else 2 if 0 else 3 }}", DATA),

    # ---- variables, attributes, items, undefined
    ("undefined_print", "[{{ missing }}][{{ missing is defined }}]", {}),
    ("undefined_attr_test_error", "{{ missing.attr is defined }}", {}),
    ("undefined_attr_error", "{{ missing.attr }}", {}),
    ("undefined_item_of_dict", "[{{ d.zzz }}][{{ d['zzz'] }}][{{ d.zzz is defined }}]", DATA),
    ("undefined_chain_error", "{{ d.zzz.yyy }}", DATA),
    ("attr_and_item", "{{ msgs[0].role }} {{ msgs[0]['content'] }} {{ nested.a.b.c }} {{ nested['a']['b'].c }}", DATA),
    ("item_negative_index", "{{ msgs[-1].content }} {{ l[-1] }} {{ s[0] }} {{ s[-1] }}", DATA),
    ("item_out_of_range", "[{{ l[10] }}][{{ s[99] }}][{{ l[10] is defined }}]", DATA),
    ("item_dot_integer", "{{ l.0 }} {{ msgs.1.role }}", DATA),
    ("item_dict_method_via_attr", "{{ d.items() | list }} {{ d.keys() | list }} {{ d.values() | list }}", DATA),
    ("dict_get", "{{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 'def') }} {{ d.get('b', 0) }}", DATA),
    ("attr_on_none", "[{{ no.x }}][{{ no.x is defined }}]", DATA),
    ("attr_on_string", "[{{ s.nope }}]", DATA),
    ("unicode_index", "{{ u[1] }} {{ u[-1] }} {{ u | length }} {{ u[::-1] }}", DATA),

    # ---- slicing
    ("slice_list", "{{ l[1:] }} {{ l[:2] }} {{ l[::-1] }} {{ l[-2:] }} {{ l[::2] }} {{ l[5:] }}", DATA),
    ("slice_string", "{{ s[:5] }}|{{ s[6:] }}|{{ s[::-1] }}|{{ s[-5:-1] }}|{{ s[1:8:3] }}", DATA),
    ("slice_negative_step", "{{ l[2:0:-1] }} {{ s[::-2] }} {{ msgs[::-1][0].role }}", DATA),
    ("slice_tuple", "{{ (1, 2, 3)[1:] }}", {}),

    # ---- if / elif / else
    ("if_elif_else", "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %} {% endfor %}", {}),
    ("if_truthiness", "{% for v in [0, 1, '', 'a', [], [0], {}, none, 0.0] %}{% if v %}T{% else %}F{% endif %}{% endfor %}", {}),
    ("if_undefined_false", "{% if missing %}yes{% else %}no{% endif %}", {}),
    ("if_nested", "{% if t %}{% if n > 3 %}big{% else %}small{% endif %}{% endif %}", DATA),

    # ---- for loops
    ("for_basic", "{% for x in l %}{{ x }},{% endfor %}", DATA),
    ("for_loop_vars", "{% for x in l %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }};{% endfor %}", DATA),
    ("for_prev_next", "{% for x in l %}[{{ loop.previtem }}|{{ x }}|{{ loop.nextitem }}]{% endfor %}", DATA),
    ("for_prev_defined", "{% for x in l %}{{ loop.previtem is defined }}{{ loop.nextitem is defined }} {% endfor %}", DATA),
    ("for_else", "{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in l %}{{ x }}{% else %}empty{% endfor %}", DATA),
    ("for_dict_keys", "{% for k in d %}{{ k }}{% endfor %}", DATA),
    ("for_items_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", DATA),
    ("for_items_filter_unpack", "{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}", DATA),
    ("for_tuple_unpack_lists", "{% for a, b in [[1, 2], [3, 4]] %}{{ a }}{{ b }} {% endfor %}", {}),
    ("for_nested_unpack", "{% for (a, b), c in [((1, 2), 3)] %}{{ a }}{{ b }}{{ c }}{% endfor %}", {}),
    ("for_unpack_error", "{% for a, b in [[1, 2, 3]] %}{{ a }}{% endfor %}", {}),
    ("for_string", "{% for ch in 'héy' %}[{{ ch }}]{% endfor %}", {}),
    ("for_inline_if", "{% for x in [1, 2, 3, 4] if x is even %}{{ x }}:{{ loop.index }}/{{ loop.length }} {% endfor %}", {}),
    ("for_inline_if_else", "{% for x in [1, 3] if x is even %}{{ x }}{% else %}none-even{% endfor %}", {}),
    ("for_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("for_nested_loop_var", "{% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{{ b }}{% endfor %}{{ loop.index }} {% endfor %}", {}),
    ("for_outer_loop_alias", "{% for a in [1, 2] %}{% set outer = loop %}{% for b in [1] %}{{ outer.index }}.{{ loop.index }} {% endfor %}{% endfor %}", {}),
    ("for_scope_no_leak", "{% set x = 1 %}{% for i in range(3) %}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}", {}),
    ("for_scope_fresh_per_iteration", "{% for i in range(3) %}{% if i == 0 %}{% set y = 5 %}{% endif %}[{{ y }}]{% endfor %}", {}),
    ("for_loop_cycle", "{% for x in range(5) %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %}", {}),
    ("for_loop_changed", "{% for x in [1, 1, 2, 2, 1] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}", {}),
    ("for_none_error", "{% for x in no %}{% endfor %}", DATA),
    ("for_undefined_empty", "{% for x in missing %}x{% else %}E{% endfor %}", {}),
    ("for_over_messages_reversed", "{% for m in msgs[::-1] %}{{ loop.index0 }}{{ m.role[0] }}{% endfor %}", DATA),
    ("for_over_tuple_expr", "{% for x in 1, 2, 3 %}{{ x }}{% endfor %}", {}),
    ("for_loop_depth", "{% for x in [1] %}{{ loop.depth }}{{ loop.depth0 }}{% endfor %}", {}),
    ("for_range_variants", "{{ range(3) | list }} {{ range(1, 4) | list }} {{ range(10, 0, -3) | list }} {{ range(0) | list }}", {}),

    # ---- set, block set, namespace, with
    ("set_basic", "{% set x = 5 %}{% set y = x * 2 %}{{ x }} {{ y }}", {}),
    ("set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c, d = [3, 4] %}{{ c }}{{ d }}", {}),
    ("set_tuple_value", "{% set x = 1, 2 %}{{ x }}", {}),
    ("set_in_if_leaks", "{% if true %}{% set x = 1 %}{% endif %}{{ x }}", {}),
    ("set_block", "{% set x %}Hello {{ s }}!{% endset %}[{{ x }}] {{ x | length }}", DATA),
    ("set_block_filter", "{% set x | upper %}abc{{ 1 }}{% endset %}{{ x }}", {}),
    ("set_block_trim", "{% set x %}\n  inner\n{% endset %}[{{ x }}]", {}),
    ("namespace_basic", "{% set ns = namespace(count=0, found=false) %}{% for i in range(4) %}{% set ns.count = ns.count + i %}{% if i == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }}", {}),
    ("namespace_repr", "{% set ns = namespace(a=1, b='x') %}{{ ns }}", {}),
    ("namespace_from_dict", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns.c is defined }}", {}),
    ("namespace_new_attr", "{% set ns = namespace() %}{% set ns.x = 'new' %}{{ ns.x }}", {}),
    ("namespace_item_access", "{% set ns = namespace(a=1) %}{{ ns['a'] }}", {}),
    ("namespace_assign_non_ns_error", "{% set d = {} %}{% set d.a = 1 %}", {}),
    ("namespace_list_accumulate", "{% set ns = namespace(items=[]) %}{% for x in l %}{% set ns.items = ns.items + [x * 2] %}{% endfor %}{{ ns.items }}", DATA),
    ("with_block", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]", {}),
    ("with_uses_outer", "{% set a = 5 %}{% with b = a + 1 %}{{ b }}{% endwith %}", {}),

    # ---- macros and call blocks
    ("macro_basic", "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Bob') }} {{ greet('Al', 'Hi') }} {{ greet(greeting='Yo', name='Cy') }}", {}),
    ("macro_missing_arg", "{% macro m(a, b) %}[{{ a }}|{{ b }}|{{ b is defined }}]{% endmacro %}{{ m(1) }}", {}),
    ("macro_varargs_kwargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}", {}),
    ("macro_too_many_args", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", {}),
    ("macro_unknown_kwarg", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(b=2) }}", {}),
    ("macro_recursion", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1) | int }}{% endif %}{% endmacro %}{{ fact(5) }}", {}),
    ("macro_reads_outer_at_call", "{% set y = 2 %}{% macro m() %}{{ y }}{% endmacro %}{% set y = 3 %}{{ m() }}", {}),
    ("macro_default_uses_param", "{% macro m(a, b=a * 2) %}{{ a }},{{ b }}{% endmacro %}{{ m(3) }}", {}),
    ("macro_in_expression", "{% macro m(x) %}<{{ x }}>{% endmacro %}{{ m(1) ~ m(2) }} {{ (m(3) | length) }}", {}),
    ("macro_whitespace", "{% macro render(m) %}\n    {{ m.role }}: {{ m.content }}\n{% endmacro %}\n{% for m in msgs %}\n{{ render(m) }}\n{% endfor %}", DATA),
    ("call_block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ s }}{% endcall %}", DATA),
    ("call_block_args", "{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) each([1, 2]) %}[{{ x }}]{% endcall %}", {}),
    ("macro_caller_undefined", "{% macro m() %}{{ caller is defined }}{% endmacro %}{{ m() }}", {}),
    ("filter_block", "{% filter upper %}hello {{ s }}{% endfilter %}", DATA),
    ("filter_block_chain", "{% filter trim | replace('a', 'b') %}  banana  {% endfilter %}|", {}),
    ("generation_block", "{% for m in msgs %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% endif %}{% endfor %}", DATA),
    ("print_tag", "{% print s ~ '!' %}", DATA),

    # ---- tests
    ("test_defined", "{{ s is defined }} {{ missing is defined }} {{ missing is undefined }} {{ no is defined }}", DATA),
    ("test_none", "{{ no is none }} {{ 0 is none }} {{ missing is none }} {{ no is not none }}", DATA),
    ("test_types", "{{ s is string }} {{ n is string }} {{ n is number }} {{ f is number }} {{ t is number }} {{ s is number }}", DATA),
    ("test_integer_float", "{{ n is integer }} {{ f is integer }} {{ t is integer }} {{ f is float }} {{ n is float }}", DATA),
    ("test_boolean", "{{ t is boolean }} {{ 1 is boolean }} {{ t is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }}", DATA),
    ("test_mapping_iterable_sequence", "{{ d is mapping }} {{ l is mapping }} {{ l is iterable }} {{ s is iterable }} {{ n is iterable }} {{ d is sequence }} {{ s is sequence }} {{ n is sequence }} {{ missing is iterable }}", DATA),
    ("test_even_odd", "{{ 4 is even }} {{ 3 is even }} {{ 3 is odd }} {{ -1 is odd }} {{ 0 is even }}", {}),
    ("test_divisibleby", "{{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 10 is not divisibleby 3 }}", {}),
    ("test_equalto_eq_sameas", "{{ 2 is equalto 2 }} {{ 2 is eq 3 }} {{ 'a' is eq('a') }} {{ none is sameas none }} {{ true is sameas 1 }} {{ 2 is ne 3 }}", {}),
    ("test_comparison_names", "{{ 3 is gt 2 }} {{ 3 is ge 3 }} {{ 2 is lt 1 }} {{ 2 is le 2 }} {{ 3 is greaterthan 5 }} {{ 1 is lessthan 5 }}", {}),
    ("test_callable", "{{ range is callable }} {{ s is callable }} {{ s.upper is callable }}", DATA),
    ("test_lower_upper", "{{ 'abc' is lower }} {{ 'Abc' is lower }} {{ 'ABC' is upper }} {{ '123' is upper }}", {}),
    ("test_in", "{{ 2 is in l }} {{ 'z' is in 'xyz' }} {{ 9 is in l }}", DATA),
    ("test_filter_test", "{{ 'upper' is filter }} {{ 'nope' is filter }} {{ 'even' is test }}", {}),
    ("test_not_and_precedence", "{{ not missing is defined }} {{ n is not string and n is number }}", DATA),
    ("test_string_on_message", "{% for m in msgs %}{{ m.content is string }}{% endfor %}", DATA),

    # ---- filters
    ("f_length", "{{ s | length }} {{ l | length }} {{ d | length }} {{ u | count }} {{ missing | length }} {{ '' | length }}", DATA),
    ("f_trim", "[{{ ws | trim }}] [{{ 'xxhixx' | trim('x') }}] [{{ no | trim }}]", DATA),
    ("f_default", "{{ missing | default('dflt') }} {{ s | default('x') }} {{ e | default('empty') }} {{ e | default('empty', true) }} {{ no | d('n') }} {{ no | d('n', boolean=true) }}", DATA),
    ("f_default_chain_attr", "{{ d.zzz | default('none') }} {{ (msgs[0].missing | default(false)) }}", DATA),
    ("f_upper_lower", "{{ s | upper }} {{ s | lower }} {{ u | upper }} {{ no | upper }}", DATA),
    ("f_title_capitalize", "{{ 'hello wORLD-foo(bar)' | title }} {{ 'hELLO world' | capitalize }} {{ \"it's o'neil\" | title }}", {}),
    ("f_replace", "{{ s | replace('o', '0') }} {{ s | replace('l', 'L', 2) }} {{ 'aaa' | replace('', '-') }}", DATA),
    ("f_join", "{{ l | join(', ') }} {{ l | join }} {{ users | join('/', attribute='name') }} {{ mixed | join('|') }}", DATA),
    ("f_first_last", "{{ l | first }} {{ l | last }} {{ s | first }} {{ s | last }} {{ d | first }} [{{ [] | first }}]", DATA),
    ("f_list_string", "{{ s | list }} {{ d | list }} {{ 5 | string }} {{ l | string }} {{ no | string }}", DATA),
    ("f_int", "{{ '42' | int }} {{ '42.7' | int }} {{ 3.9 | int }} {{ 'x' | int }} {{ 'x' | int(-1) }} {{ '0x1A' | int(0, 16) }} {{ true | int }} {{ no | int }} {{ ' 7 ' | int }}", DATA),
    ("f_float", "{{ '2.5' | float }} {{ 3 | float }} {{ 'x' | float }} {{ 'x' | float(1.5) }} {{ '1e3' | float }} {{ no | float }}", DATA),
    ("f_abs", "{{ -3 | abs }} {{ -2.5 | abs }} {{ 4 | abs }}", {}),
    ("f_round", "{{ 2.5 | round }} {{ 3.5 | round }} {{ 2.675 | round(2) }} {{ 1.234 | round(1, 'floor') }} {{ 1.21 | round(1, 'ceil') }} {{ 42 | round }} {{ -0.5 | round }}", {}),
    ("f_select_reject", "{{ [1, 2, 3, 4] | select('even') | list }} {{ [1, 2, 3, 4] | reject('even') | list }} {{ [0, 1, '', 'a'] | select | list }} {{ [1, 5, 9] | select('gt', 3) | list }}", {}),
    ("f_selectattr", "{{ users | selectattr('age', 'equalto', 30) | map(attribute='name') | list }} {{ users | rejectattr('tags') | map(attribute='name') | join(',') }} {{ users | selectattr('tags', 'defined') | list | length }}", DATA),
    ("f_selectattr_messages", "{{ msgs | selectattr('role', 'eq', 'user') | list | length }} {{ (msgs | selectattr('role', '==', 'system') | first).content }}", DATA),
    ("f_map", "{{ users | map(attribute='name') | join(',') }} {{ ['a', 'b'] | map('upper') | list }} {{ users | map(attribute='missing', default='?') | list }} {{ [1.6, 2.4] | map('round') | list }} {{ ['1', '2'] | map('int') | sum }}", DATA),
    ("f_map_dotted_attribute", "{{ [nested] | map(attribute='a.b.c') | list }} {{ [l, l] | map(attribute='0') | list }}", DATA),
    ("f_unique", "{{ [1, 2, 1, 3, 2] | unique | list }} {{ words | unique | list }} {{ words | unique(case_sensitive=true) | list }} {{ users | unique(attribute='age') | map(attribute='name') | list }}", DATA),
    ("f_sort", "{{ l | sort }} {{ l | sort(reverse=true) }} {{ words | sort }} {{ words | sort(case_sensitive=true) }} {{ users | sort(attribute='age') | map(attribute='name') | join(',') }} {{ users | sort(attribute='age,name') | map(attribute='name') | join(',') }}", DATA),
    ("f_sort_stable_reverse", "{{ users | sort(attribute='age', reverse=true) | map(attribute='name') | join(',') }}", DATA),
    ("f_reverse", "{{ l | reverse | list }} {{ s | reverse }} {{ d | reverse | list }}", DATA),
    ("f_dictsort", "{{ d | dictsort }} {{ d | dictsort(reverse=true) }} {{ {'b': 1, 'A': 2, 'a': 3} | dictsort }} {{ {'b': 1, 'A': 2} | dictsort(true) }} {{ d | dictsort(false, 'value') }}", DATA),
    ("f_items", "{{ d | items | list }} {{ missing | items | list }}", DATA),
    ("f_sum_min_max", "{{ l | sum }} {{ fl | sum }} {{ users | sum(attribute='age') }} {{ l | sum(start=10) }} {{ l | min }} {{ l | max }} {{ words | min }} {{ words | max }} {{ words | max(case_sensitive=true) }} {{ users | max(attribute='age') }} [{{ [] | max }}]", DATA),
    ("f_batch_slice", "{{ range(7) | batch(3) | list }} {{ range(7) | batch(3, 'x') | list }} {{ range(7) | slice(3) | list }}", {}),
    ("f_center_indent", "[{{ 'ab' | center(7) }}] [{{ lines | indent(2) }}] [{{ lines | indent(2, true) }}] [{{ lines | indent('> ', blank=true) }}]", DATA),
    ("f_wordcount_truncate", "{{ 'hello big world, ok?' | wordcount }} {{ 'foo bar baz qux quux corge' | truncate(12) }} {{ 'foo bar baz qux quux corge' | truncate(12, true) }} {{ 'short' | truncate(20) }} {{ 'foo bar baz qux' | truncate(11, false, '...', 0) }}", {}),
    ("f_escape_safe", "{{ '<a href=\"x\">&\\'</a>' | e }} {{ '<b>' | escape }} {{ '<i>' | safe }}", {}),
    ("f_format", "{{ '%s + %s' | format(1, 'b') }} {{ '%(a)s!' | format(a='kw') }}", {}),
    ("f_attr", "{{ d | attr('a') }}|{{ d | attr('items') is defined }}|{{ users[0] | attr('name') }}", DATA),
    ("f_unknown_filter_is_compile_error", "{% if true %}ok{% endif %}{{ x | no_such_filter }}", {}),
    ("f_unknown_filter_in_untaken_if", "{% if false %}{{ x | no_such_filter }}{% endif %}ok", {}),
    ("f_unknown_filter_in_taken_if", "{% if true %}{{ x | no_such_filter }}{% endif %}ok", {}),
    ("f_unknown_filter_in_loop_in_if", "{% if false %}{% for a in [] %}{{ x | nof }}{% endfor %}{% endif %}ok", {}),
    ("f_unknown_filter_in_condexpr", "{{ 1 if true else x | nof }}", {}),
    ("f_unknown_test_in_untaken_if", "{% if false %}{{ x is no_such_test }}{% endif %}ok", {}),
    ("f_unknown_test_in_macro", "{% macro m() %}{{ x is no_such_test }}{% endmacro %}ok", {}),
    ("f_chain_precedence", "{{ -3 | abs }} {{ 'a' ~ 'b' | upper }} {{ not 'x' | length }} {{ 1 ~ 2 | string }}", {}),
    ("f_chain_precedence_error", "{{ 1 + 2 | string }}", {}),
    ("f_filter_on_literal_list_index", "{{ ['x', 'y'] | join('-') | upper }}", {}),

    # ---- tojson
    ("tojson_basic", "{{ tool | tojson }}", DATA),
    ("tojson_indent", "{{ tool | tojson(indent=2) }}", DATA),
    ("tojson_indent_str_sort", "{{ d | tojson(indent='\\t', sort_keys=true) }}", DATA),
    ("tojson_separators", "{{ d | tojson(separators=(',', ':')) }} {{ [1, [2]] | tojson(separators=[';', '=']) }}", DATA),
    ("tojson_scalars", "{{ 1 | tojson }} {{ 1.0 | tojson }} {{ 2.5e-8 | tojson }} {{ true | tojson }} {{ none | tojson }} {{ 'x' | tojson }} {{ (1, 2) | tojson }} {{ [] | tojson(indent=2) }} {{ {} | tojson(indent=2) }}", {}),
    ("tojson_escaping", "{{ 'q\"b\\\\s/t\\tn\\nr\\rc\\x01e\\x7fé😀\\u2028' | tojson }}", {}),
    ("tojson_ensure_ascii", "{{ u | tojson(ensure_ascii=true) }} {{ u | tojson }}", DATA),
    ("tojson_key_order_kept", "{{ {'z': 1, 'a': 2, 'm': {'y': 1, 'b': 2}} | tojson }}", {}),
    ("tojson_int_keys", "{{ {1: 'a', true: 'b', none: 'c', 1.5: 'd'} | tojson }}", {}),
    ("tojson_undefined_error", "{{ missing | tojson }}", {}),
    ("tojson_messages", "{{ msgs | tojson }}", DATA),
    ("tojson_nested_indent4", "{{ {'a': [1, {'b': []}], 'c': {}} | tojson(indent=4) }}", {}),

    # ---- string methods
    ("m_startswith_endswith", "{{ s.startswith('Hell') }} {{ s.endswith('World') }} {{ s.startswith(('x', 'H')) }} {{ s.startswith('World', 6) }} {{ s.endswith('Hello', 0, 5) }}", DATA),
    ("m_split", "{{ 'a,b,,c'.split(',') }} {{ '  a  b c '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a-b-c'.rsplit('-', 1) }} {{ '  x y  '.split(none, 1) }} {{ ''.split() }} {{ ''.split(',') }}", {}),
    ("m_split_think", "{% set c = '<think>\\nreason\\n</think>\\n\\nanswer' %}{{ c.split('</think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}", {}),
    ("m_strip_family", "[{{ ws.strip() }}][{{ ws.lstrip() }}][{{ ws.rstrip() }}][{{ 'xyhixy'.strip('xy') }}][{{ '\\n\\nx\\n'.strip('\\n') }}]", DATA),
    ("m_replace_upper_lower", "{{ s.replace('l', 'L') }} {{ s.replace('l', '', 1) }} {{ s.upper() }} {{ s.lower() }} {{ s.title() }} {{ 'hELLO'.capitalize() }} {{ s.swapcase() }}", DATA),
    ("m_find_count_index", "{{ s.find('o') }} {{ s.rfind('o') }} {{ s.find('z') }} {{ s.count('l') }} {{ s.index('W') }} {{ u.find('w') }} {{ s.find('o', 5) }}", DATA),
    ("m_index_error", "{{ s.index('zzz') }}", DATA),
    ("m_join_format", "{{ ', '.join(['a', 'b']) }} {{ '-'.join('abc') }} {{ '{} and {}'.format('x', 1) }} {{ '{0}{1}{0}'.format('a', 'b') }} {{ '{name}!'.format(name='N') }} {{ '{:>5}|{:<4}|{:^6}|{:.2f}|{:05d}'.format('r', 'l', 'c', 3.14159, 42) }}", {}),
    ("m_is_checks", "{{ '123'.isdigit() }} {{ '12a'.isdigit() }} {{ 'abc'.isalpha() }} {{ 'a1'.isalnum() }} {{ '  '.isspace() }} {{ 'AB'.isupper() }} {{ 'ab'.islower() }} {{ ''.isdigit() }}", {}),
    ("m_misc", "{{ 'ab'.center(6, '*') }} {{ 'ab'.ljust(4, '.') }}| {{ 'ab'.rjust(4) }} {{ '42'.zfill(5) }} {{ 'a=b=c'.partition('=') }} {{ 'a=b=c'.rpartition('=') }} {{ 'prefix_x'.removeprefix('prefix_') }} {{ 'x.py'.removesuffix('.py') }}", {}),
    ("m_splitlines", "{{ lines.splitlines() }} {{ 'a\\r\\nb'.splitlines(true) }}", DATA),
    ("m_list_methods", "{{ l.index(2) }} {{ [1, 1, 2].count(1) }} {{ (1, 2).index(2) }}", DATA),
    ("m_list_append_unsafe", "{% set x = [] %}{{ x.append(1) }}", {}),
    ("m_dict_update_unsafe", "{% set x = {} %}{{ x.update({'a': 1}) }}", {}),
    ("m_unsafe_attr_prints_empty", "[{{ [].append }}]", {}),
    ("m_dict_items_key_shadow", "{% set x = {'items': 'value'} %}{{ x['items'] }} {{ x.items() | list }}", {}),

    # ---- globals and errors
    ("raise_exception", "{% if n > 3 %}{{ raise_exception('n is too big: ' ~ n) }}{% endif %}never", DATA),
    ("raise_exception_in_loop", "{% for m in msgs %}{% if m.role == 'assistant' %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{{ m.role }}{% endfor %}", DATA),
    ("dict_global", "{{ dict(a=1, b='x') }} {{ dict({'z': 1}, y=2) }}", {}),
    ("range_too_big", "{{ range(200000) | length }}", {}),
    ("joiner_cycler", "{% set pipe = joiner(' | ') %}{% for x in l %}{{ pipe() }}{{ x }}{% endfor %} {% set c = cycler('odd', 'even') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}", DATA),
    ("syntax_error_unclosed", "{% if true %}never closed", {}),
    ("syntax_error_bad_expr", "{{ 1 + }}", {}),
    ("syntax_error_unknown_tag", "{% frobnicate %}", {}),
    ("syntax_error_break_outside", "{% break %}", {}),
    ("syntax_error_unclosed_comment", "{# never", {}),
    ("syntax_error_unclosed_string", "{{ 'abc }}", {}),
    ("syntax_error_mismatched_paren", "{{ (1 + 2] }}", {}),
    ("call_undefined_error", "{{ nofunc() }}", {}),
    ("call_non_callable_error", "{{ s() }}", DATA),
    ("filter_arg_error", "{{ s | replace('a') }}", DATA),
    ("unhashable_key_error", "{{ {[1]: 2} }}", {}),

    # ---- chat-template style snippets
    ("chat_loop_roles", "{% for message in msgs %}{% if loop.first and message['role'] != 'system' %}<s>{% endif %}<|{{ message['role'] }}|>\n{{ message['content'] | trim }}{% if not loop.last %}\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}", dict(DATA, add_generation_prompt=True)),
    ("chat_system_split", "{% if msgs[0]['role'] == 'system' %}{% set system_message = msgs[0]['content'] %}{% set loop_messages = msgs[1:] %}{% else %}{% set loop_messages = msgs %}{% endif %}[{{ system_message }}]{% for m in loop_messages %}{{ m['role'] }};{% endfor %}", DATA),
    ("chat_alternation_check", "{% for message in msgs[1:] %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}ok{% endfor %}", DATA),
    ("chat_last_user_index", "{% set ns = namespace(last=-1) %}{% for m in msgs %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor %}{{ ns.last }}", DATA),
    ("chat_tools_block", "{%- if tools %}\n{{- '<tools>' }}\n{%- for tool in tools %}\n{{- '\\n' }}{{- tool | tojson }}\n{%- endfor %}\n{{- '\\n</tools>' }}\n{%- endif %}", {"tools": [TOOL, {"type": "function", "function": {"name": "noop", "parameters": {}}}]}),
    ("chat_tool_call_args", "{%- for tc in calls %}{%- if tc.function is defined %}{%- set tc = tc.function %}{%- endif %}{{ tc.name }}:{% if tc.arguments is string %}{{ tc.arguments }}{% else %}{{ tc.arguments | tojson }}{% endif %};{%- endfor %}", {"calls": [{"function": {"name": "a", "arguments": {"x": 1, "y": "é"}}}, {"name": "b", "arguments": "{\"q\": 2}"}]}),
    ("chat_content_parts", "{% for m in parts %}{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% elif p.type == 'image' %}<img>{% endif %}{% endfor %}{% endif %}|{% endfor %}", {"parts": [{"role": "user", "content": [{"type": "text", "text": "look "}, {"type": "image"}, {"type": "text", "text": " here"}]}, {"role": "assistant", "content": "ok"}]}),
    ("chat_strftime_default", "{% if not date_string is defined %}{% set date_string = '26 Jul 2024' %}{% endif %}Today: {{ date_string }}", {}),
    ("chat_bos_eos", "{{ bos_token }}{% for m in msgs %}{{ m.content }}{{ eos_token }}{% endfor %}", dict(DATA, bos_token="<s>", eos_token="</s>")),
    ("chat_enable_thinking", "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}x", {"enable_thinking": False}),
    ("chat_message_keys", "{% for m in msgs %}{% for k, v in m.items() %}{{ k }}={{ v | length }} {% endfor %}{% endfor %}", DATA),
    ("chat_reasoning_content", "{% set m = {'role': 'assistant', 'content': 'ans', 'reasoning_content': none} %}{% if m.reasoning_content is defined and m.reasoning_content is not none %}R{% else %}N{% endif %}", {}),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--out", default=os.path.join(here, "..", "tests", "data", "chat",
                                                      "jinja_unit.jsonl"))
    args = parser.parse_args()
    env = make_env()
    names = set()
    n_err = 0
    with open(args.out, "w", encoding="utf-8") as out:
        for name, template, context in CASES:
            assert name not in names, name
            names.add(name)
            row = {"name": name, "template": template, "context": context}
            try:
                row["expected"] = env.from_string(template).render(**context)
            except Exception as e:  # errors are expected results too
                row["error"] = str(e)
                row["raised"] = type(e) is jinja2.exceptions.TemplateError
                n_err += 1
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{len(CASES)} cases ({n_err} errors) -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
