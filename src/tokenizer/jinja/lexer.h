// Tokenizer for jinja2 templates with the environment transformers uses: default
// delimiters, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False.
// Whitespace control (-, + and the two options) is applied here, exactly where jinja2's lexer
// applies it, so the parser only sees final text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kestrel::jinja {

enum class TokenType {
  kText,
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,
  kInteger,
  kFloat,
  kOperator,
  kEof,
};

struct Token {
  TokenType type = TokenType::kEof;
  std::string value;  // text, name, decoded string literal or operator spelling
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

// Throws Error (with the line number) on malformed input.
std::vector<Token> Tokenize(std::string_view source);

}  // namespace kestrel::jinja
