// The inside of JSON strings as expressions. Internal to the JSON Schema front-end.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace kestrel::grammar::json_string {

// One character of a JSON string as written: any character but ", \ and U+0000..U+001F, or an
// escape (\" \\ \/ \b \f \n \r \t \uXXXX).
Expr AnyChar();
Expr AnyChars();  // AnyChar()*
// String contents other than the given texts (written unescaped). Texts holding a character that
// JSON must escape are not excluded, nor are spellings of a text with \u escapes.
Expr AnyCharsExcept(const std::vector<std::string>& texts);
// "\"" content "\"".
Expr Quoted(Expr content);
// Rewrites an expression over decoded text (a regex, a format) into one over the escaped text
// that a JSON string holds: " and \ become \" and \\, control characters their short escape or
// \u00XX, and / may be written \/. Other characters must appear unescaped.
Expr Escaped(const Expr& text);
// Content of a string of a known `format` (date, time, date-time, duration, uuid, email, hostname,
// ipv4, uri); nullopt for other formats.
std::optional<Expr> Format(std::string_view name);

}  // namespace kestrel::grammar::json_string
