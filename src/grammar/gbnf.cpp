// GBNF text → Grammar: a recursive-descent parser that tracks line and column for its errors
// ("gbnf:LINE:COL: message", both counted from 1, columns in bytes).
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "grammar/front_ends.h"

namespace kestrel::grammar {
namespace {

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view text) : text_(text) {}

  Result<Grammar> Parse() {
    SkipSpace();
    if (AtEnd()) return Error(pos_, "empty grammar (expected `root ::= ...`)");
    while (!AtEnd()) {
      const size_t name_pos = pos_;
      std::string name = ReadName();
      if (name.empty()) return Error(pos_, "expected a rule name");
      SkipSpace();
      if (text_.substr(pos_, 3) != "::=") return Error(pos_, "expected '::=' after rule name");
      pos_ += 3;
      SkipSpace();
      const int32_t id = RuleId(name);
      if (defined_[id]) return Error(name_pos, "rule '" + name + "' is defined twice");
      defined_[id] = true;
      KASSIGN(Expr body, ParseAlternatives(/*nested=*/false));
      grammar_.SetBody(id, std::move(body));
      if (!AtEnd() && Peek() == ')') return Error(pos_, "unbalanced ')'");
    }
    for (const auto& [id, ref_pos] : first_reference_) {
      if (!defined_[id]) {
        return Error(ref_pos, "undefined rule '" + grammar_.rule(id).name + "'");
      }
    }
    const int32_t root = grammar_.FindRule("root");
    if (root < 0 || !defined_[root]) return InvalidArgument("gbnf: the grammar has no 'root' rule");
    grammar_.set_root(root);
    return std::move(grammar_);
  }

 private:
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }

  // "LINE:COL" of a byte offset.
  std::string LineCol(size_t at) const {
    int line = 1;
    int col = 1;
    for (size_t i = 0; i < at && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return std::to_string(line) + ":" + std::to_string(col);
  }

  Status Error(size_t at, const std::string& message) const {
    return InvalidArgument("gbnf:" + LineCol(at) + ": " + message);
  }

  void SkipSpace() {
    while (!AtEnd()) {
      const char c = Peek();
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else if (c == '#') {
        while (!AtEnd() && Peek() != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string ReadName() {
    const size_t start = pos_;
    while (!AtEnd() && IsNameChar(Peek())) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  // True when a rule definition (`name ::=`) starts at the current position.
  bool AtRuleStart() const {
    size_t p = pos_;
    while (p < text_.size() && IsNameChar(text_[p])) ++p;
    if (p == pos_) return false;
    while (p < text_.size() &&
           (text_[p] == ' ' || text_[p] == '\t' || text_[p] == '\n' || text_[p] == '\r')) {
      ++p;
    }
    return text_.substr(p, 3) == "::=";
  }

  int32_t RuleId(const std::string& name) {
    const int32_t existing = grammar_.FindRule(name);
    if (existing >= 0) return existing;
    const int32_t id = grammar_.AddRule(name);
    defined_.push_back(false);
    return id;
  }

  Result<Expr> ParseAlternatives(bool nested) {
    std::vector<Expr> alternatives;
    while (true) {
      KASSIGN(Expr seq, ParseSequence(nested));
      alternatives.push_back(std::move(seq));
      if (Peek() != '|') break;
      ++pos_;
      SkipSpace();
    }
    return Expr::Choice(std::move(alternatives));
  }

  Result<Expr> ParseSequence(bool nested) {
    std::vector<Expr> parts;
    while (!AtEnd()) {
      const char c = Peek();
      if (c == '|' || c == ')') break;
      if (!nested && AtRuleStart()) break;
      KASSIGN(Expr item, ParseItem());
      SkipSpace();  // as llama.cpp: `x *` is `x*`
      KASSIGN(item, ParsePostfix(std::move(item)));
      parts.push_back(std::move(item));
      SkipSpace();
    }
    return Expr::Sequence(std::move(parts));
  }

  Result<Expr> ParseItem() {
    const size_t start = pos_;
    const char c = Peek();
    if (c == '"') {
      ++pos_;
      std::string bytes;
      while (true) {
        if (AtEnd()) return Error(start, "unterminated string");
        if (Peek() == '"') break;
        KASSIGN(uint32_t cp, ParseChar());
        AppendUtf8(cp, &bytes);
      }
      ++pos_;
      return Expr::Literal(bytes);
    }
    if (c == '[') return ParseClass();
    if (c == '.') {
      ++pos_;
      return Expr::Class(CodepointSet::All());
    }
    if (c == '(') {
      if (++depth_ > kMaxGroupNesting) {
        return Unsupported(
            Error(pos_, "group nesting deeper than " + std::to_string(kMaxGroupNesting)).message());
      }
      ++pos_;
      SkipSpace();
      KASSIGN(Expr inner, ParseAlternatives(/*nested=*/true));
      --depth_;
      if (Peek() != ')')
        return Error(pos_, "expected ')' to close the group opened at " + LineCol(start));
      ++pos_;
      return inner;
    }
    if (IsNameChar(c)) {
      const std::string name = ReadName();
      const int32_t id = RuleId(name);
      first_reference_.emplace(id, start);
      return Expr::Ref(id);
    }
    return Error(pos_, std::string("unexpected character '") + c + "'");
  }

  Result<Expr> ParsePostfix(Expr item) {
    while (!AtEnd()) {
      const char c = Peek();
      if (c == '*') {
        item = Expr::Star(std::move(item));
      } else if (c == '+') {
        item = Expr::Plus(std::move(item));
      } else if (c == '?') {
        item = Expr::Optional(std::move(item));
      } else if (c == '{') {
        const size_t start = pos_;
        ++pos_;
        SkipSpace();
        uint32_t min = 0;
        uint32_t max = 0;
        KASSIGN(bool has_min, ParseCount(&min));
        SkipSpace();
        if (Peek() == '}') {
          if (!has_min) return Error(start, "empty repeat '{}'");
          max = min;
        } else if (Peek() == ',') {
          ++pos_;
          SkipSpace();
          KASSIGN(bool has_max, ParseCount(&max));
          if (!has_max) max = kUnbounded;
          SkipSpace();
          if (Peek() != '}') return Error(pos_, "expected '}'");
        } else {
          return Error(pos_, "expected ',' or '}' in repeat");
        }
        if (max < min) return Error(start, "repeat {m,n} with n < m");
        item = Expr::Repeat(std::move(item), min, max);
      } else {
        break;
      }
      ++pos_;
      SkipSpace();
    }
    return item;
  }

  Result<bool> ParseCount(uint32_t* out) {
    const size_t start = pos_;
    uint64_t value = 0;
    while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
      value = value * 10 + static_cast<uint64_t>(Peek() - '0');
      if (value > kMaxRepeatCount) {
        return Unsupported(
            Error(start, "repeat count above " + std::to_string(kMaxRepeatCount)).message());
      }
      ++pos_;
    }
    *out = static_cast<uint32_t>(value);
    return pos_ > start;
  }

  Result<uint32_t> ParseHex(int digits) {
    uint32_t value = 0;
    for (int i = 0; i < digits; ++i) {
      const char h = Peek();
      const int v = HexDigitValue(h);
      if (v < 0) return Error(pos_, "expected a hex digit");
      value = value * 16 + static_cast<uint32_t>(v);
      ++pos_;
    }
    return value;
  }

  // One character of a string or class, escapes resolved.
  Result<uint32_t> ParseChar() {
    const size_t start = pos_;
    if (Peek() != '\\') {
      uint32_t cp = 0;
      if (!DecodeUtf8(text_, &pos_, &cp)) return Error(start, "invalid UTF-8");
      return cp;
    }
    ++pos_;
    if (AtEnd()) return Error(start, "unterminated escape");
    const char c = Peek();
    ++pos_;
    uint32_t cp = 0;
    switch (c) {
      case 'n':
        return uint32_t{'\n'};
      case 'r':
        return uint32_t{'\r'};
      case 't':
        return uint32_t{'\t'};
      case 'x':
      case 'u':
      case 'U': {
        KASSIGN(cp, ParseHex(c == 'x' ? 2 : c == 'u' ? 4 : 8));
        break;
      }
      default:
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
          return Error(start, std::string("unknown escape '\\") + c + "'");
        }
        return static_cast<uint32_t>(static_cast<uint8_t>(c));
    }
    if (cp > kMaxCodepoint || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return Error(start, "escape is not a Unicode scalar value");
    }
    return cp;
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
    while (true) {
      if (AtEnd()) return Error(start, "unterminated character class");
      if (Peek() == ']') break;
      KASSIGN(uint32_t lo, ParseChar());
      uint32_t hi = lo;
      if (Peek() == '-' && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
        ++pos_;
        const size_t hi_pos = pos_;
        KASSIGN(hi, ParseChar());
        if (hi < lo) return Error(hi_pos, "class range out of order");
      }
      set = set.Union(CodepointSet::Of({{lo, hi}}));
    }
    ++pos_;
    if (negated) set = set.Complement();
    if (set.empty()) return Error(start, "character class matches nothing");
    return Expr::Class(std::move(set));
  }

  std::string_view text_;
  size_t pos_ = 0;
  int depth_ = 0;
  Grammar grammar_;
  std::vector<bool> defined_;
  std::map<int32_t, size_t> first_reference_;  // rule → where it was first used
};

}  // namespace

Result<Grammar> ParseGbnf(std::string_view text) {
  return GbnfParser(text).Parse();
}

}  // namespace kestrel::grammar
