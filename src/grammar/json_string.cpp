// JSON string contents: characters, escapes, patterns and formats in escaped form.
#include "grammar/json_string.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "grammar/front_ends.h"

namespace kestrel::grammar::json_string {
namespace {

Expr HexDigit() {
  return Expr::Class(CodepointSet::Of({{'0', '9'}, {'a', 'f'}, {'A', 'F'}}));
}

// Characters that a JSON string must escape.
CodepointSet MustEscape() {
  return CodepointSet::Of({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}});
}

// \u followed by the 4 hex digits of cp (< 0x10000) in either case.
Expr UnicodeEscape(uint32_t cp) {
  std::vector<Expr> parts = {Expr::Literal("\\u")};
  for (int shift = 12; shift >= 0; shift -= 4) {
    const uint32_t nibble = (cp >> shift) & 0xF;
    const char* digits = "0123456789abcdef";
    if (nibble < 10) {
      parts.push_back(Expr::Char(static_cast<uint32_t>(digits[nibble])));
    } else {
      parts.push_back(Expr::Class(
          CodepointSet::Of({{uint32_t(digits[nibble]), uint32_t(digits[nibble])},
                            {uint32_t(digits[nibble] - 32), uint32_t(digits[nibble] - 32)}})));
    }
  }
  return Expr::Sequence(std::move(parts));
}

// The ways one decoded character may be written inside a JSON string.
Expr EscapedChar(uint32_t cp) {
  switch (cp) {
    case '"':
      return Expr::Literal("\\\"");
    case '\\':
      return Expr::Literal("\\\\");
    case '/':
      return Expr::Choice({Expr::Literal("/"), Expr::Literal("\\/")});
    case '\b':
      return Expr::Choice({Expr::Literal("\\b"), UnicodeEscape(cp)});
    case '\f':
      return Expr::Choice({Expr::Literal("\\f"), UnicodeEscape(cp)});
    case '\n':
      return Expr::Choice({Expr::Literal("\\n"), UnicodeEscape(cp)});
    case '\r':
      return Expr::Choice({Expr::Literal("\\r"), UnicodeEscape(cp)});
    case '\t':
      return Expr::Choice({Expr::Literal("\\t"), UnicodeEscape(cp)});
    default:
      break;
  }
  if (cp < 0x20) return UnicodeEscape(cp);
  return Expr::Char(cp);
}

// Regular expressions of the supported formats (full match, over decoded text).
constexpr std::pair<std::string_view, std::string_view> kFormats[] = {
    {"date", R"([0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01]))"},
    {"time",
     R"(([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9]))"},
    {"date-time",
     R"([0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9]))"},
    {"duration",
     R"(P([0-9]+W|([0-9]+Y)?([0-9]+M)?([0-9]+D)?(T([0-9]+H)?([0-9]+M)?([0-9]+(\.[0-9]+)?S)?)?))"},
    {"uuid", R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"},
    {"email",
     R"([A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)+)"},
    {"hostname",
     R"([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*)"},
    {"ipv4",
     R"(((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9]))"},
    {"uri", R"([A-Za-z][A-Za-z0-9+.-]*:[^\x00-\x20"<>\\^`{|}\x7F]+)"},
};

Expr EscapeSequence() {
  return Expr::Sequence(
      {Expr::Literal("\\"),
       Expr::Choice({Expr::Class(CodepointSet::Of({{'"', '"'},
                                                   {'\\', '\\'},
                                                   {'/', '/'},
                                                   {'b', 'b'},
                                                   {'f', 'f'},
                                                   {'n', 'n'},
                                                   {'r', 'r'},
                                                   {'t', 't'}})),
                     Expr::Sequence({Expr::Literal("u"), Expr::Repeat(HexDigit(), 4, 4)})})});
}

// Contents that are not one of `texts` (code points), all of which share their first `depth`
// code points.
Expr ContentsExcept(const std::vector<std::u32string>& texts, size_t depth) {
  bool ends_here = false;
  std::map<uint32_t, std::vector<std::u32string>> by_next;
  for (const std::u32string& t : texts) {
    if (t.size() == depth) {
      ends_here = true;
    } else {
      by_next[t[depth]].push_back(t);
    }
  }
  std::vector<Expr> alternatives;
  if (!ends_here) alternatives.push_back(Expr::Empty());
  CodepointSet others = MustEscape().Complement();
  for (const auto& [cp, group] : by_next) others = others.Minus(CodepointSet::Single(cp));
  if (!others.empty()) alternatives.push_back(Expr::Sequence({Expr::Class(others), AnyChars()}));
  alternatives.push_back(Expr::Sequence({EscapeSequence(), AnyChars()}));
  for (const auto& [cp, group] : by_next) {
    alternatives.push_back(Expr::Sequence({Expr::Char(cp), ContentsExcept(group, depth + 1)}));
  }
  return Expr::Choice(std::move(alternatives));
}

}  // namespace

Expr AnyChar() {
  return Expr::Choice({Expr::Class(MustEscape().Complement()), EscapeSequence()});
}

Expr AnyCharsExcept(const std::vector<std::string>& texts) {
  std::vector<std::u32string> excluded;
  for (const std::string& text : texts) {
    std::u32string cps;
    size_t pos = 0;
    uint32_t cp = 0;
    bool plain = true;
    while (plain && DecodeUtf8(text, &pos, &cp)) {
      plain = !MustEscape().Contains(cp);
      cps.push_back(cp);
    }
    if (plain && pos == text.size()) excluded.push_back(std::move(cps));
  }
  if (excluded.empty()) return AnyChars();
  return ContentsExcept(excluded, 0);
}

Expr AnyChars() {
  return Expr::Star(AnyChar());
}

Expr Quoted(Expr content) {
  return Expr::Sequence({Expr::Literal("\""), std::move(content), Expr::Literal("\"")});
}

Expr Escaped(const Expr& text) {
  switch (text.kind) {
    case Expr::Kind::kEmpty:
    case Expr::Kind::kRuleRef:
      return text;
    case Expr::Kind::kLiteral: {
      std::vector<Expr> parts;
      size_t pos = 0;
      uint32_t cp = 0;
      while (DecodeUtf8(text.literal, &pos, &cp)) parts.push_back(EscapedChar(cp));
      KCHECK(pos == text.literal.size());
      return Expr::Sequence(std::move(parts));
    }
    case Expr::Kind::kClass: {
      std::vector<Expr> alternatives;
      const CodepointSet special = MustEscape().Union(CodepointSet::Single('/'));
      const CodepointSet plain = text.chars.Minus(special);
      if (!plain.empty()) alternatives.push_back(Expr::Class(plain));
      for (const CodepointRange& r : text.chars.ranges()) {
        for (uint32_t cp = r.lo; cp <= r.hi && cp < 0x80; ++cp) {
          if (special.Contains(cp)) alternatives.push_back(EscapedChar(cp));
        }
      }
      return Expr::Choice(std::move(alternatives));
    }
    case Expr::Kind::kSequence:
    case Expr::Kind::kChoice:
    case Expr::Kind::kRepeat: {
      Expr out = text;
      for (Expr& child : out.children) child = Escaped(child);
      return out;
    }
  }
  return text;
}

std::optional<Expr> Format(std::string_view name) {
  for (const auto& [format, regex] : kFormats) {
    if (format != name) continue;
    auto e = ParseRegex(regex);
    KCHECK_MSG(e.ok(), "built-in format regex");
    return Escaped(*e);
  }
  return std::nullopt;
}

}  // namespace kestrel::grammar::json_string
