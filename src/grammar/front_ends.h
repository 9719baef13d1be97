// Front-ends: each turns one way of describing structured output into a Grammar (grammar.h).
//
//   ParseGbnf            llama.cpp GBNF text (`root ::= ...`); errors carry line:col
//   RegexToGrammar       a regular expression, matched in full (anchors implicit)
//   ChoiceGrammar        exactly one of a list of strings
//   JsonSchemaToGrammar  OpenAI `response_format: {type: json_schema}` (see
//   docs/structured-output.md
//                        for what each keyword enforces); errors name the keyword and JSON pointer
//   JsonObjectGrammar    `response_format: {type: json_object}`: any JSON value that is an object
//
// Every error is a Status with code kInvalidArgument (malformed input) or kUnsupported (a valid
// construct outside the supported subset); the server answers both with a 400.
#pragma once

#include <nlohmann/json.hpp>

#include <span>
#include <string>
#include <string_view>

#include "core/status.h"
#include "grammar/grammar.h"

namespace kestrel::grammar {

// ---- GBNF ----
// Syntax: `name ::= alternatives`; "literal" (escapes \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH),
// [char class] / [^negated] with ranges and the same escapes, `.` (any character), rule names
// ([A-Za-z0-9_-]+), ( groups ), postfix * + ? {m} {m,} {m,n} {,n}, `|`, # comments. A rule ends
// where the next `name ::=` starts, so bodies may span lines. The start rule is `root`.
Result<Grammar> ParseGbnf(std::string_view text);

// ---- Regex ----
// Subset (ECMAScript flavour, on code points): literals, escapes (\n \r \t \f \v \0 \xHH \uHHHH
// \u{H..} and escaped punctuation), classes [...] [^...] with ranges, \d \w \s \D \W \S (ASCII
// \d \w, Unicode \s), `.` (any character but \n), groups ( ) (?: ) (?<name> ), `|`, quantifiers
// ? * + {m} {m,} {m,n} (a lazy `?` suffix is accepted: same language). `^` may only open and `$`
// only close a top-level alternative. Backreferences, lookaround and \b are refused.
enum class RegexAnchoring {
  kFullMatch,  // the whole text matches (anchors optional): response_format regex, GBNF
  kSearch,     // JSON Schema `pattern`: an alternative without ^ / $ may have any prefix / suffix
};
Result<Expr> ParseRegex(std::string_view pattern,
                        RegexAnchoring anchoring = RegexAnchoring::kFullMatch);
Result<Grammar> RegexToGrammar(std::string_view pattern);

// ---- Choice ----
// Exactly one of the strings (UTF-8; at least one; "" is a valid choice).
Result<Grammar> ChoiceGrammar(std::span<const std::string> choices);

// ---- JSON ----
struct JsonSchemaOptions {
  // OpenAI strict semantics: an object without `additionalProperties` admits no other keys and an
  // array with `prefixItems` but no `items` no further items. false: JSON Schema defaults (true).
  bool strict = true;
  enum class Layout {
    // Between JSON tokens, a run of at most max_whitespace_bytes bytes of [ \t\n\r] (0: none).
    // Bounded so a weak model cannot loop on whitespace forever.
    kBoundedWhitespace,
    // Exactly Python json.dumps' default layout: ", " between members and items, ": " after keys,
    // nothing else. Every separator is then forced (jump-forward can skip it).
    kPythonSeparators,
  };
  Layout layout = Layout::kBoundedWhitespace;
  uint32_t max_whitespace_bytes = 16;
};

Result<Grammar> JsonSchemaToGrammar(std::string_view schema_json,
                                    const JsonSchemaOptions& options = {});
// The same from a parsed schema. Property order is the order of `properties` in `schema`: parse it
// as ordered_json (nlohmann::json sorts keys).
Result<Grammar> JsonSchemaValueToGrammar(const nlohmann::ordered_json& schema,
                                         const JsonSchemaOptions& options = {});
// Any JSON object (nested values unrestricted), for `response_format: {type: json_object}`.
Grammar JsonObjectGrammar(const JsonSchemaOptions& options = {});

}  // namespace kestrel::grammar
