// Regular expressions → Expr: a recursive-descent parser over the pattern's code points.
// Errors read "regex: at offset N: ..." (N counts bytes of the pattern from 1).
#include <string>
#include <utility>
#include <vector>

#include "grammar/front_ends.h"

namespace kestrel::grammar {
namespace {

CodepointSet DigitSet() {
  return CodepointSet::Of({{'0', '9'}});
}
CodepointSet WordSet() {
  return CodepointSet::Of({{'0', '9'}, {'A', 'Z'}, {'a', 'z'}, {'_', '_'}});
}
// ECMAScript \s: WhiteSpace and LineTerminator.
CodepointSet SpaceSet() {
  return CodepointSet::Of({{'\t', '\r'},
                           {' ', ' '},
                           {0xA0, 0xA0},
                           {0x1680, 0x1680},
                           {0x2000, 0x200A},
                           {0x2028, 0x2029},
                           {0x202F, 0x202F},
                           {0x205F, 0x205F},
                           {0x3000, 0x3000},
                           {0xFEFF, 0xFEFF}});
}

class RegexParser {
 public:
  RegexParser(std::string_view pattern, RegexAnchoring anchoring)
      : text_(pattern), anchoring_(anchoring) {}

  Result<Expr> Parse() {
    std::vector<Expr> alternatives;
    while (true) {
      bool anchored_start = false;
      bool anchored_end = false;
      if (Peek() == '^') {
        anchored_start = true;
        ++pos_;
      }
      KASSIGN(Expr seq, ParseSequence(/*top_level=*/true, &anchored_end));
      if (anchoring_ == RegexAnchoring::kSearch) {
        std::vector<Expr> parts;
        if (!anchored_start) parts.push_back(Expr::Star(Expr::Class(CodepointSet::All())));
        parts.push_back(std::move(seq));
        if (!anchored_end) parts.push_back(Expr::Star(Expr::Class(CodepointSet::All())));
        seq = Expr::Sequence(std::move(parts));
      }
      alternatives.push_back(std::move(seq));
      if (AtEnd()) break;
      if (Peek() == '|') {
        ++pos_;
        continue;
      }
      if (Peek() == ')') return Error("unbalanced ')'");
      return Error("unexpected character");
    }
    return Expr::Choice(std::move(alternatives));
  }

 private:
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }

  Status Error(const std::string& message) const {
    return InvalidArgument("regex: at offset " + std::to_string(pos_ + 1) + ": " + message);
  }
  Status Refuse(const std::string& what) const {
    return Unsupported("regex: at offset " + std::to_string(pos_ + 1) + ": " + what +
                       " is not supported");
  }

  Result<uint32_t> NextCodepoint() {
    uint32_t cp = 0;
    if (!DecodeUtf8(text_, &pos_, &cp)) return Error("invalid UTF-8 in pattern");
    return cp;
  }

  Result<Expr> ParseAlternation() {
    std::vector<Expr> alternatives;
    while (true) {
      bool unused = false;
      KASSIGN(Expr seq, ParseSequence(/*top_level=*/false, &unused));
      alternatives.push_back(std::move(seq));
      if (Peek() != '|') break;
      ++pos_;
    }
    return Expr::Choice(std::move(alternatives));
  }

  // Stops before '|', ')' or the end. At top level a final '$' sets *anchored_end.
  Result<Expr> ParseSequence(bool top_level, bool* anchored_end) {
    std::vector<Expr> parts;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      if (Peek() == '$') {
        ++pos_;
        if (!top_level || !(AtEnd() || Peek() == '|')) {
          --pos_;
          return Refuse("'$' other than at the end of the pattern");
        }
        *anchored_end = true;
        break;
      }
      if (Peek() == '^') return Refuse("'^' other than at the start of the pattern");
      KASSIGN(Expr atom, ParseAtom());
      KASSIGN(Expr quantified, ParseQuantifiers(std::move(atom)));
      parts.push_back(std::move(quantified));
    }
    return Expr::Sequence(std::move(parts));
  }

  Result<Expr> ParseQuantifiers(Expr atom) {
    while (!AtEnd()) {
      const char c = Peek();
      uint32_t min = 0;
      uint32_t max = 0;
      if (c == '*') {
        min = 0, max = kUnbounded;
        ++pos_;
      } else if (c == '+') {
        min = 1, max = kUnbounded;
        ++pos_;
      } else if (c == '?') {
        min = 0, max = 1;
        ++pos_;
      } else if (c == '{') {
        const size_t start = pos_;
        auto bounds = ParseBraces(&min, &max);
        if (!bounds.ok()) return bounds.status();
        if (!*bounds) {  // not a quantifier: '{' is a literal (as ECMAScript's Annex B)
          pos_ = start;
          break;
        }
      } else {
        break;
      }
      if (Peek() == '?') {
        ++pos_;  // lazy: same language
      } else if (Peek() == '+') {
        return Refuse("possessive quantifier");
      }
      atom = Expr::Repeat(std::move(atom), min, max);
    }
    return atom;
  }

  // At '{': parses {m}, {m,}, {m,n}. Returns false (position unspecified) if it is not one.
  Result<bool> ParseBraces(uint32_t* min, uint32_t* max) {
    ++pos_;
    auto number = [&](uint32_t* out) -> Result<bool> {
      const size_t start = pos_;
      uint64_t value = 0;
      while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
        value = value * 10 + static_cast<uint64_t>(Peek() - '0');
        if (value > kMaxRepeatCount) {
          return Unsupported("regex: at offset " + std::to_string(start + 1) +
                             ": repeat count above " + std::to_string(kMaxRepeatCount));
        }
        ++pos_;
      }
      *out = static_cast<uint32_t>(value);
      return pos_ > start;
    };
    KASSIGN(bool has_min, number(min));
    if (!has_min) return false;
    if (Peek() == '}') {
      ++pos_;
      *max = *min;
      return true;
    }
    if (Peek() != ',') return false;
    ++pos_;
    KASSIGN(bool has_max, number(max));
    if (!has_max) *max = kUnbounded;
    if (Peek() != '}') return false;
    ++pos_;
    if (*max < *min) return Error("repeat {m,n} with n < m");
    return true;
  }

  Result<Expr> ParseAtom() {
    const char c = Peek();
    if (c == '(') {
      if (++depth_ > kMaxGroupNesting) {
        return Refuse("group nesting deeper than " + std::to_string(kMaxGroupNesting));
      }
      ++pos_;
      if (Peek() == '?') {
        ++pos_;
        if (Peek() == ':') {
          ++pos_;
        } else if (Peek() == '<' && pos_ + 1 < text_.size() && text_[pos_ + 1] != '=' &&
                   text_[pos_ + 1] != '!') {
          if (!SkipGroupName('>')) return Error("unterminated group name");
        } else if (Peek() == 'P' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '<') {
          ++pos_;
          if (!SkipGroupName('>')) return Error("unterminated group name");
        } else {
          return Refuse("lookaround or inline flag group '(?'");
        }
      }
      KASSIGN(Expr inner, ParseAlternation());
      if (Peek() != ')') return Error("missing ')'");
      ++pos_;
      --depth_;
      return inner;
    }
    if (c == '[') return ParseClass();
    if (c == '.') {
      ++pos_;
      return Expr::Class(CodepointSet::Single('\n').Complement());
    }
    if (c == '*' || c == '+' || c == '?') return Error("quantifier without anything to repeat");
    if (c == '\\') {
      ++pos_;
      KASSIGN(CodepointSet set, ParseEscape(/*in_class=*/false));
      return Expr::Class(std::move(set));
    }
    KASSIGN(uint32_t cp, NextCodepoint());
    return Expr::Char(cp);
  }

  // At '<' of a named group: skips to just after `close`.
  bool SkipGroupName(char close) {
    ++pos_;
    while (!AtEnd() && Peek() != close) ++pos_;
    if (AtEnd()) return false;
    ++pos_;
    return true;
  }

  Result<uint32_t> ParseHex(int digits) {
    uint32_t value = 0;
    for (int i = 0; i < digits; ++i) {
      const char h = Peek();
      const int v = HexDigitValue(h);
      if (v < 0) return Error("expected a hex digit");
      value = value * 16 + static_cast<uint32_t>(v);
      ++pos_;
    }
    return value;
  }

  // After a backslash. Returns the set it denotes (one code point for a plain escape).
  Result<CodepointSet> ParseEscape(bool in_class) {
    if (AtEnd()) return Error("pattern ends with a backslash");
    const char c = Peek();
    ++pos_;
    switch (c) {
      case 'd':
        return DigitSet();
      case 'D':
        return DigitSet().Complement();
      case 'w':
        return WordSet();
      case 'W':
        return WordSet().Complement();
      case 's':
        return SpaceSet();
      case 'S':
        return SpaceSet().Complement();
      case 'n':
        return CodepointSet::Single('\n');
      case 'r':
        return CodepointSet::Single('\r');
      case 't':
        return CodepointSet::Single('\t');
      case 'f':
        return CodepointSet::Single('\f');
      case 'v':
        return CodepointSet::Single('\v');
      case '0':
        return CodepointSet::Single(0);
      case 'x': {
        KASSIGN(uint32_t v, ParseHex(2));
        return CodepointSet::Single(v);
      }
      case 'u': {
        uint32_t v = 0;
        if (Peek() == '{') {
          ++pos_;
          const size_t close = text_.find('}', pos_);
          if (close == std::string_view::npos || close == pos_ || close - pos_ > 6) {
            return Error("bad \\u{...} escape");
          }
          KASSIGN(v, ParseHex(static_cast<int>(close - pos_)));
          ++pos_;  // '}'
        } else {
          KASSIGN(v, ParseHex(4));
        }
        if (v > kMaxCodepoint || (v >= 0xD800 && v <= 0xDFFF)) {
          return Error("escape is not a Unicode scalar value");
        }
        return CodepointSet::Single(v);
      }
      case 'b':
        if (in_class) return CodepointSet::Single('\b');
        --pos_;
        return Refuse("word boundary \\b");
      case 'B':
        --pos_;
        return Refuse("\\B");
      default:
        break;
    }
    if (c >= '1' && c <= '9') {
      pos_ -= 1;
      return Refuse("backreference");
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      pos_ -= 1;
      return Refuse(std::string("escape \\") + c);
    }
    pos_ -= 1;
    KASSIGN(uint32_t cp, NextCodepoint());  // escaped punctuation or any other character
    return CodepointSet::Single(cp);
  }

  Result<Expr> ParseClass() {
    const size_t start = pos_;
    ++pos_;  // '['
    bool negated = false;
    if (Peek() == '^') {
      negated = true;
      ++pos_;
    }
    CodepointSet set;
    bool first = true;
    while (true) {
      if (AtEnd()) return Error("missing ']'");
      if (Peek() == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      // One member: a character, an escape (possibly a class like \d), or a range lo-hi.
      KASSIGN(CodepointSet lo, ParseClassMember());
      if (Peek() == '-' && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
        ++pos_;
        KASSIGN(CodepointSet hi, ParseClassMember());
        if (lo.ranges().size() != 1 || lo.ranges()[0].lo != lo.ranges()[0].hi ||
            hi.ranges().size() != 1 || hi.ranges()[0].lo != hi.ranges()[0].hi) {
          return Error("a class range needs single characters at both ends");
        }
        const uint32_t a = lo.ranges()[0].lo;
        const uint32_t b = hi.ranges()[0].lo;
        if (b < a) return Error("class range out of order");
        set = set.Union(CodepointSet::Of({{a, b}}));
      } else {
        set = set.Union(lo);
      }
    }
    if (negated) set = set.Complement();
    if (set.empty()) {
      pos_ = start;
      return Error("character class matches nothing");
    }
    return Expr::Class(std::move(set));
  }

  Result<CodepointSet> ParseClassMember() {
    if (Peek() == '\\') {
      ++pos_;
      return ParseEscape(/*in_class=*/true);
    }
    KASSIGN(uint32_t cp, NextCodepoint());
    return CodepointSet::Single(cp);
  }

  std::string_view text_;
  RegexAnchoring anchoring_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

Result<Expr> ParseRegex(std::string_view pattern, RegexAnchoring anchoring) {
  return RegexParser(pattern, anchoring).Parse();
}

Result<Grammar> RegexToGrammar(std::string_view pattern) {
  KASSIGN(Expr body, ParseRegex(pattern, RegexAnchoring::kFullMatch));
  Grammar g;
  g.set_root(g.AddRule("root", std::move(body)));
  return g;
}

}  // namespace kestrel::grammar
