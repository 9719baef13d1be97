#include "tokenizer/jinja/lexer.h"

#include <cstdio>
#include <cstdlib>

#include "tokenizer/jinja/pystr.h"
#include "tokenizer/jinja/value.h"

namespace kestrel::jinja {

namespace {

bool IsDigitChar(char c) {
  return c >= '0' && c <= '9';
}
bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         static_cast<unsigned char>(c) >= 0x80;
}
bool IsNameChar(char c) {
  return IsNameStart(c) || IsDigitChar(c);
}
int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// jinja2 splits the source on \r\n, \r and \n, joins with \n, and drops one trailing newline.
std::string NormalizeNewlines(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < in.size() && in[i + 1] == '\n') ++i;
    } else {
      out.push_back(in[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {}

  std::vector<Token> Run() {
    while (pos_ < src_.size()) {
      const size_t tag = FindTagStart(pos_);
      if (tag == std::string::npos) {
        EmitText(src_.substr(pos_));
        pos_ = src_.size();
        break;
      }
      LexTag(tag);
    }
    Token eof;
    eof.type = TokenType::kEof;
    eof.line = line_;
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void Fail(const std::string& msg) const {
    throw Error("template syntax error (line " + std::to_string(line_) + "): " + msg);
  }

  size_t FindTagStart(size_t from) const {
    size_t p = from;
    while ((p = src_.find('{', p)) != std::string::npos) {
      if (p + 1 < src_.size()) {
        const char c = src_[p + 1];
        if (c == '{' || c == '%' || c == '#') return p;
      }
      ++p;
    }
    return std::string::npos;
  }

  size_t SkipSpace(size_t p) const {
    while (p < src_.size()) {
      const size_t n = py::SpaceBytes(src_, p);
      if (n == 0) break;
      p += n;
    }
    return p;
  }

  bool StartsWith(size_t p, std::string_view s) const { return src_.compare(p, s.size(), s) == 0; }

  // Matches `%}` (with trim_blocks' optional newline), `-%}\s*` or `+%}` at p.
  // Returns the end of the match or npos.
  size_t MatchBlockEnd(size_t p) const {
    if (StartsWith(p, "+%}")) return p + 3;
    if (StartsWith(p, "-%}")) return SkipSpace(p + 3);
    if (StartsWith(p, "%}")) return (p + 2 < src_.size() && src_[p + 2] == '\n') ? p + 3 : p + 2;
    return std::string::npos;
  }

  // Whitespace control applied to the text before a tag. `sign` is '-', '+' or 0.
  std::string StripBefore(std::string text, char sign, bool is_variable) const {
    if (sign == '-') return py::Strip(text, std::nullopt, false, true);
    if (sign == '+' || is_variable) return text;
    // lstrip_blocks: drop spaces between the start of the line and the tag.
    const size_t nl = text.rfind('\n');
    const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos == 0 && !line_starting_) return text;
    if (l_pos >= text.size()) return text;
    if (SkipSpaceIn(text, l_pos) != text.size()) return text;
    text.resize(l_pos);
    return text;
  }

  static size_t SkipSpaceIn(const std::string& s, size_t p) {
    while (p < s.size()) {
      const size_t n = py::SpaceBytes(s, p);
      if (n == 0) break;
      p += n;
    }
    return p;
  }

  void EmitText(std::string text) {
    if (text.empty()) return;
    Token t;
    t.type = TokenType::kText;
    t.line = line_;
    t.value = std::move(text);
    tokens_.push_back(std::move(t));
  }

  void Emit(TokenType type, std::string value) {
    Token t;
    t.type = type;
    t.value = std::move(value);
    t.line = line_;
    tokens_.push_back(std::move(t));
  }

  void Advance(size_t to) {
    for (size_t i = pos_; i < to && i < src_.size(); ++i) line_ += src_[i] == '\n';
    line_starting_ = to > pos_ && src_[to - 1] == '\n';
    pos_ = to;
  }

  // `{%(-|+|)\s*raw\s*(-%}\s*|%})` at tag; returns the end of the match or npos.
  size_t MatchRawBegin(size_t tag) const {
    size_t p = tag + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    p = SkipSpace(p);
    if (!StartsWith(p, "raw")) return std::string::npos;
    p = SkipSpace(p + 3);
    if (StartsWith(p, "-%}")) return SkipSpace(p + 3);
    if (StartsWith(p, "%}")) return p + 2;
    return std::string::npos;
  }

  void LexTag(size_t tag) {
    const char kind = src_[tag + 1];
    const char sign_char = tag + 2 < src_.size() ? src_[tag + 2] : 0;
    const char sign = (sign_char == '-' || sign_char == '+') ? sign_char : 0;
    std::string text = src_.substr(pos_, tag - pos_);
    if (kind == '%') {
      const size_t raw_end = MatchRawBegin(tag);
      if (raw_end != std::string::npos) {
        EmitText(StripBefore(std::move(text), sign, false));
        Advance(raw_end);
        LexRawBody();
        return;
      }
    }
    EmitText(StripBefore(std::move(text), sign, kind == '{'));
    Advance(tag + 2 + (sign ? 1 : 0));
    if (kind == '#') {
      LexComment();
    } else {
      LexInside(kind == '%');
    }
  }

  void LexRawBody() {
    size_t p = pos_;
    while ((p = src_.find("{%", p)) != std::string::npos) {
      size_t q = p + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      q = SkipSpace(q);
      if (StartsWith(q, "endraw")) {
        const size_t end = MatchBlockEnd(SkipSpace(q + 6));
        if (end != std::string::npos) {
          EmitText(StripBefore(src_.substr(pos_, p - pos_), sign, false));
          Advance(end);
          return;
        }
      }
      p += 2;
    }
    Fail("Missing end of raw directive");
  }

  void LexComment() {
    const size_t j = src_.find("#}", pos_);
    if (j == std::string::npos) Fail("Missing end of comment tag");
    size_t end = j + 2;
    if (j > pos_ && src_[j - 1] == '-') {
      end = SkipSpace(end);
    } else if (j > pos_ && src_[j - 1] == '+') {
      // keep the newline
    } else if (end < src_.size() && src_[end] == '\n') {
      ++end;  // trim_blocks
    }
    Advance(end);
  }

  void LexInside(bool is_block) {
    Emit(is_block ? TokenType::kBlockBegin : TokenType::kVariableBegin, "");
    std::vector<char> balance;
    while (true) {
      if (pos_ >= src_.size()) Fail("unexpected end of template inside a tag");
      if (balance.empty()) {
        size_t end = std::string::npos;
        if (is_block) {
          end = MatchBlockEnd(pos_);
        } else if (StartsWith(pos_, "-}}")) {
          end = SkipSpace(pos_ + 3);
        } else if (StartsWith(pos_, "}}")) {
          end = pos_ + 2;
        }
        if (end != std::string::npos) {
          Emit(is_block ? TokenType::kBlockEnd : TokenType::kVariableEnd, "");
          Advance(end);
          return;
        }
      }
      const size_t ws = SkipSpace(pos_);
      if (ws != pos_) {
        Advance(ws);
        continue;
      }
      if (LexNumber() || LexName() || LexString()) continue;
      LexOperator(&balance);
    }
  }

  // End of `(\d+_)*\d+` starting at p (p itself when there is no digit).
  size_t Digits(size_t p) const {
    size_t q = p;
    while (q < src_.size() && IsDigitChar(src_[q])) {
      ++q;
      // An underscore continues the number only between two digits.
      if (q + 1 < src_.size() && src_[q] == '_' && IsDigitChar(src_[q + 1])) ++q;
    }
    return q;
  }

  bool LexNumber() {
    const size_t p = pos_;
    if (!IsDigitChar(src_[p])) return false;
    // float: digits ((.digits)? e[+-]?digits | .digits), not preceded by '.'
    const bool after_dot = p > 0 && src_[p - 1] == '.';
    size_t q = Digits(p);
    size_t float_end = std::string::npos;
    if (!after_dot) {
      size_t frac = q;
      if (frac < src_.size() && src_[frac] == '.' && frac + 1 < src_.size() &&
          IsDigitChar(src_[frac + 1])) {
        frac = Digits(frac + 1);
        float_end = frac;
      }
      if (frac < src_.size() && (src_[frac] == 'e' || src_[frac] == 'E')) {
        size_t e = frac + 1;
        if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
        if (e < src_.size() && IsDigitChar(src_[e])) float_end = Digits(e);
      }
    }
    if (float_end != std::string::npos) {
      std::string text;
      for (size_t i = p; i < float_end; ++i) {
        if (src_[i] != '_') text.push_back(src_[i]);
      }
      Token t;
      t.type = TokenType::kFloat;
      t.float_value = std::strtod(text.c_str(), nullptr);
      t.value = src_.substr(p, float_end - p);
      t.line = line_;
      tokens_.push_back(std::move(t));
      Advance(float_end);
      return true;
    }
    // integer: 0b / 0o / 0x prefixes, [1-9](_?\d)*, or 0(_?0)*
    int base = 10;
    size_t start = p;
    size_t end = q;
    if (src_[p] == '0' && p + 1 < src_.size()) {
      const char x = static_cast<char>(src_[p + 1] | 0x20);
      base = x == 'b' ? 2 : x == 'o' ? 8 : x == 'x' ? 16 : 10;
      if (base != 10) {
        start = p + 2;
        end = start;
        while (end < src_.size() &&
               (src_[end] == '_' || (HexValue(src_[end]) >= 0 && HexValue(src_[end]) < base))) {
          ++end;
        }
        if (end == start) {
          base = 10;
          start = p;
          end = p + 1;
        }
      } else {
        end = p + 1;  // a leading zero only continues with zeros
        while (end < src_.size() && (src_[end] == '0' || src_[end] == '_')) ++end;
      }
    }
    int64_t value = 0;
    for (size_t i = start; i < end; ++i) {
      if (src_[i] == '_') continue;
      if (__builtin_mul_overflow(value, base, &value) ||
          __builtin_add_overflow(value, HexValue(src_[i]), &value)) {
        Fail("integer literal too large");
      }
    }
    Token t;
    t.type = TokenType::kInteger;
    t.int_value = value;
    t.value = src_.substr(p, end - p);
    t.line = line_;
    tokens_.push_back(std::move(t));
    Advance(end);
    return true;
  }

  bool LexName() {
    if (!IsNameStart(src_[pos_])) return false;
    size_t q = pos_;
    while (q < src_.size() && IsNameChar(src_[q])) ++q;
    Emit(TokenType::kName, src_.substr(pos_, q - pos_));
    Advance(q);
    return true;
  }

  bool LexString() {
    const char quote = src_[pos_];
    if (quote != '\'' && quote != '"') return false;
    size_t q = pos_ + 1;
    while (q < src_.size() && src_[q] != quote) q += src_[q] == '\\' ? 2 : 1;
    if (q >= src_.size())
      Fail("unexpected char " + std::string(1, quote) + " (unterminated string)");
    Emit(TokenType::kString, Unescape(std::string_view(src_).substr(pos_ + 1, q - pos_ - 1)));
    Advance(q + 1);
    return true;
  }

  // Python's unicode-escape decoding, as jinja2 applies it to string literals.
  std::string Unescape(std::string_view s) const {
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    char buf[16];
    while (i < s.size()) {
      if (s[i] != '\\' || i + 1 >= s.size()) {
        out.push_back(s[i++]);
        continue;
      }
      const char c = s[i + 1];
      i += 2;
      switch (c) {
        case '\n':
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = c == 'x' ? 2 : c == 'u' ? 4 : 8;
          char32_t v = 0;
          for (size_t k = 0; k < n; ++k) {
            if (i + k >= s.size() || HexValue(s[i + k]) < 0) {
              Fail(std::string("truncated \\") + c + " escape");
            }
            v = v * 16 + static_cast<char32_t>(HexValue(s[i + k]));
          }
          if (v > 0x10FFFF) Fail("illegal Unicode character");
          py::AppendUtf8(out, v);
          i += n;
          break;
        }
        case 'N':
          Fail("\\N{...} escapes are not supported");
        default:
          if (c >= '0' && c <= '7') {
            char32_t v = static_cast<char32_t>(c - '0');
            for (int k = 0; k < 2 && i < s.size() && s[i] >= '0' && s[i] <= '7'; ++k) {
              v = v * 8 + static_cast<char32_t>(s[i++] - '0');
            }
            py::AppendUtf8(out, v);
          } else if (static_cast<unsigned char>(c) >= 0x80) {
            // jinja2 backslash-escapes non-ASCII first, so "\é" becomes "\\xe9".
            size_t n = 0;
            const char32_t cp = py::CharAt(s, i - 1, &n);
            i = i - 1 + n;
            if (cp <= 0xFF) {
              std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(cp));
            } else if (cp <= 0xFFFF) {
              std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
            } else {
              std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(cp));
            }
            out += buf;
          } else {
            out.push_back('\\');
            out.push_back(c);
          }
      }
    }
    return out;
  }

  void LexOperator(std::vector<char>* balance) {
    static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (std::string_view op : kTwo) {
      if (StartsWith(pos_, op)) {
        Emit(TokenType::kOperator, std::string(op));
        Advance(pos_ + 2);
        return;
      }
    }
    const char c = src_[pos_];
    if (std::string_view("+-/*%~[](){}><=.:|,;").find(c) == std::string_view::npos) {
      Fail(std::string("unexpected char '") + c + "'");
    }
    if (c == '{' || c == '(' || c == '[') {
      balance->push_back(c == '{' ? '}' : c == '(' ? ')' : ']');
    } else if (c == '}' || c == ')' || c == ']') {
      if (balance->empty()) Fail(std::string("unexpected '") + c + "'");
      if (balance->back() != c) {
        Fail(std::string("unexpected '") + c + "', expected '" + balance->back() + "'");
      }
      balance->pop_back();
    }
    Emit(TokenType::kOperator, std::string(1, c));
    Advance(pos_ + 1);
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> Tokenize(std::string_view source) {
  return Lexer(NormalizeNewlines(source)).Run();
}

}  // namespace kestrel::jinja
