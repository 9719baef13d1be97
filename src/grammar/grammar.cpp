// Code point sets, expression constructors, rule bookkeeping and the GBNF printer.
#include "grammar/grammar.h"

#include <algorithm>
#include <cstdio>

#include "core/check.h"
#include "tokenizer/unicode.h"

namespace kestrel::grammar {
namespace {

constexpr uint32_t kSurrogateLo = 0xD800;
constexpr uint32_t kSurrogateHi = 0xDFFF;

bool IsRuleNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

// Escape for a code point inside "..." or [...] in GBNF text.
void AppendEscaped(uint32_t cp, bool in_class, std::string* out) {
  switch (cp) {
    case '\n':
      *out += "\\n";
      return;
    case '\r':
      *out += "\\r";
      return;
    case '\t':
      *out += "\\t";
      return;
    case '\\':
      *out += "\\\\";
      return;
    case '"':
      *out += in_class ? "\"" : "\\\"";
      return;
    default:
      break;
  }
  if (in_class && (cp == ']' || cp == '-' || cp == '^' || cp == '[')) {
    *out += '\\';
    *out += static_cast<char>(cp);
    return;
  }
  char buf[16];
  if (cp < 0x20 || cp == 0x7F) {
    std::snprintf(buf, sizeof(buf), "\\x%02X", cp);
    *out += buf;
  } else if (cp >= 0x80 && cp < 0xA0) {
    std::snprintf(buf, sizeof(buf), "\\u%04X", cp);
    *out += buf;
  } else {
    AppendUtf8(cp, out);
  }
}

void PrintClass(const CodepointSet& set, std::string* out) {
  if (set == CodepointSet::All()) {
    *out += '.';
    return;
  }
  const CodepointSet complement = set.Complement();
  const bool negate = complement.ranges().size() < set.ranges().size();
  *out += negate ? "[^" : "[";
  for (const CodepointRange& r : (negate ? complement : set).ranges()) {
    AppendEscaped(r.lo, true, out);
    if (r.hi != r.lo) {
      if (r.hi != r.lo + 1) *out += '-';
      AppendEscaped(r.hi, true, out);
    }
  }
  *out += ']';
}

void PrintExpr(const Grammar& g, const Expr& e, int parent_precedence, std::string* out) {
  // Precedence: choice 0 < sequence 1 < repeat/atom 2.
  switch (e.kind) {
    case Expr::Kind::kEmpty:
      *out += "\"\"";
      return;
    case Expr::Kind::kLiteral: {
      *out += '"';
      size_t pos = 0;
      while (pos < e.literal.size()) {
        uint32_t cp = 0;
        const size_t start = pos;
        if (DecodeUtf8(e.literal, &pos, &cp)) {
          AppendEscaped(cp, false, out);
        } else {
          pos = start + 1;
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\x%02X", static_cast<uint8_t>(e.literal[start]));
          *out += buf;
        }
      }
      *out += '"';
      return;
    }
    case Expr::Kind::kClass:
      PrintClass(e.chars, out);
      return;
    case Expr::Kind::kRuleRef:
      *out += g.rule(e.rule).name;
      return;
    case Expr::Kind::kSequence:
    case Expr::Kind::kChoice: {
      const bool choice = e.kind == Expr::Kind::kChoice;
      const int precedence = choice ? 0 : 1;
      if (parent_precedence > precedence) *out += '(';
      for (size_t i = 0; i < e.children.size(); ++i) {
        if (i) *out += choice ? " | " : " ";
        PrintExpr(g, e.children[i], precedence + 1, out);
      }
      if (parent_precedence > precedence) *out += ')';
      return;
    }
    case Expr::Kind::kRepeat: {
      PrintExpr(g, e.children[0], 3, out);
      if (e.min == 0 && e.max == 1) {
        *out += '?';
      } else if (e.min == 0 && e.max == kUnbounded) {
        *out += '*';
      } else if (e.min == 1 && e.max == kUnbounded) {
        *out += '+';
      } else {
        // Appended piece by piece: GCC 12 reports a false -Wrestrict on "{" + std::to_string().
        out->push_back('{');
        out->append(std::to_string(e.min));
        if (e.max != e.min) {
          out->push_back(',');
          if (e.max != kUnbounded) out->append(std::to_string(e.max));
        }
        out->push_back('}');
      }
      return;
    }
  }
}

}  // namespace

CodepointSet CodepointSet::Of(std::vector<CodepointRange> ranges) {
  // Drop surrogates: split ranges that cover them.
  std::vector<CodepointRange> clean;
  for (CodepointRange r : ranges) {
    if (r.lo > r.hi) continue;
    r.hi = std::min(r.hi, kMaxCodepoint);
    if (r.lo > kMaxCodepoint) continue;
    if (r.hi < kSurrogateLo || r.lo > kSurrogateHi) {
      clean.push_back(r);
      continue;
    }
    if (r.lo < kSurrogateLo) clean.push_back({r.lo, kSurrogateLo - 1});
    if (r.hi > kSurrogateHi) clean.push_back({kSurrogateHi + 1, r.hi});
  }
  std::sort(clean.begin(), clean.end(),
            [](const CodepointRange& a, const CodepointRange& b) { return a.lo < b.lo; });
  CodepointSet set;
  for (const CodepointRange& r : clean) {
    // Merge overlapping and adjacent ranges (adjacency across the surrogate gap too, so that
    // equal sets have one representation).
    if (!set.ranges_.empty()) {
      CodepointRange& last = set.ranges_.back();
      const bool adjacent =
          r.lo <= last.hi + 1 || (last.hi == kSurrogateLo - 1 && r.lo == kSurrogateHi + 1);
      if (adjacent) {
        last.hi = std::max(last.hi, r.hi);
        continue;
      }
    }
    set.ranges_.push_back(r);
  }
  return set;
}

CodepointSet CodepointSet::Complement() const {
  std::vector<CodepointRange> out;
  uint32_t next = 0;
  for (const CodepointRange& r : ranges_) {
    if (r.lo > next) out.push_back({next, r.lo - 1});
    next = r.hi + 1;
  }
  if (next <= kMaxCodepoint) out.push_back({next, kMaxCodepoint});
  return Of(std::move(out));
}

CodepointSet CodepointSet::Union(const CodepointSet& other) const {
  std::vector<CodepointRange> all = ranges_;
  all.insert(all.end(), other.ranges_.begin(), other.ranges_.end());
  return Of(std::move(all));
}

CodepointSet CodepointSet::Minus(const CodepointSet& other) const {
  return other.Union(Complement()).Complement();
}

bool CodepointSet::Contains(uint32_t cp) const {
  if (cp >= kSurrogateLo && cp <= kSurrogateHi) return false;
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), cp,
                             [](uint32_t v, const CodepointRange& r) { return v < r.lo; });
  if (it == ranges_.begin()) return false;
  --it;
  return cp <= it->hi;
}

Expr Expr::Literal(std::string_view bytes) {
  if (bytes.empty()) return Empty();
  Expr e;
  e.kind = Kind::kLiteral;
  e.literal = std::string(bytes);
  return e;
}

Expr Expr::Class(CodepointSet chars) {
  Expr e;
  e.kind = Kind::kClass;
  e.chars = std::move(chars);
  return e;
}

Expr Expr::Ref(int32_t rule) {
  Expr e;
  e.kind = Kind::kRuleRef;
  e.rule = rule;
  return e;
}

Expr Expr::Sequence(std::vector<Expr> parts) {
  Expr e;
  e.kind = Kind::kSequence;
  for (Expr& p : parts) {
    if (p.kind == Kind::kEmpty) continue;
    if (p.kind == Kind::kSequence) {
      for (Expr& c : p.children) e.children.push_back(std::move(c));
    } else if (p.kind == Kind::kLiteral && !e.children.empty() &&
               e.children.back().kind == Kind::kLiteral) {
      e.children.back().literal += p.literal;  // adjacent literals read better as one
    } else {
      e.children.push_back(std::move(p));
    }
  }
  if (e.children.empty()) return Empty();
  if (e.children.size() == 1) return std::move(e.children[0]);
  return e;
}

Expr Expr::Choice(std::vector<Expr> alternatives) {
  KCHECK(!alternatives.empty());
  Expr e;
  e.kind = Kind::kChoice;
  for (Expr& a : alternatives) {
    if (a.kind == Kind::kChoice) {
      for (Expr& c : a.children) e.children.push_back(std::move(c));
    } else {
      e.children.push_back(std::move(a));
    }
  }
  if (e.children.size() == 1) return std::move(e.children[0]);
  return e;
}

Expr Expr::Repeat(Expr item, uint32_t min, uint32_t max) {
  KCHECK(min <= max);
  if (max == 0 || item.kind == Kind::kEmpty) return Empty();
  if (min == 1 && max == 1) return item;
  Expr e;
  e.kind = Kind::kRepeat;
  e.min = min;
  e.max = max;
  e.children.push_back(std::move(item));
  return e;
}

int32_t Grammar::AddRule(std::string_view name) {
  std::string base;
  for (char c : name) base += IsRuleNameChar(c) ? c : '-';
  if (base.empty()) base = "rule";
  std::string unique = base;
  for (int n = 2; FindRule(unique) >= 0; ++n) unique = base + "-" + std::to_string(n);
  rules_.push_back(Rule{std::move(unique), Expr::Empty()});
  return static_cast<int32_t>(rules_.size() - 1);
}

int32_t Grammar::AddRule(std::string_view name, Expr body) {
  const int32_t id = AddRule(name);
  SetBody(id, std::move(body));
  return id;
}

void Grammar::SetBody(int32_t rule, Expr body) {
  KCHECK(rule >= 0 && rule < static_cast<int32_t>(rules_.size()));
  rules_[rule].body = std::move(body);
}

namespace {
void RemapRules(Expr* e, int32_t offset) {
  if (e->kind == Expr::Kind::kRuleRef) e->rule += offset;
  for (Expr& child : e->children) RemapRules(&child, offset);
}
}  // namespace

int32_t Grammar::Import(const Grammar& other) {
  const int32_t offset = static_cast<int32_t>(rules_.size());
  for (const Rule& r : other.rules()) AddRule(r.name);
  for (size_t i = 0; i < other.rules().size(); ++i) {
    Expr body = other.rules()[i].body;
    RemapRules(&body, offset);
    SetBody(offset + static_cast<int32_t>(i), std::move(body));
  }
  return offset + other.root();
}

int32_t Grammar::FindRule(std::string_view name) const {
  for (size_t i = 0; i < rules_.size(); ++i) {
    if (rules_[i].name == name) return static_cast<int32_t>(i);
  }
  return -1;
}

std::string Grammar::ToGbnf() const {
  std::string out;
  auto print_rule = [&](int32_t i) {
    out += rules_[i].name + " ::= ";
    PrintExpr(*this, rules_[i].body, 0, &out);
    out += '\n';
  };
  if (root_ >= 0) print_rule(root_);
  for (int32_t i = 0; i < static_cast<int32_t>(rules_.size()); ++i) {
    if (i != root_) print_rule(i);
  }
  return out;
}

std::string Grammar::ExprToGbnf(const Expr& e) const {
  std::string out;
  PrintExpr(*this, e, 0, &out);
  return out;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  KCHECK(cp <= kMaxCodepoint);
  tok::AppendUtf8(cp, out);
}

bool DecodeUtf8(std::string_view text, size_t* pos, uint32_t* cp) {
  if (*pos >= text.size()) return false;
  bool truncated = false;
  const size_t len = tok::Utf8SequenceLength(text, *pos, &truncated);
  if (len == 0) return false;
  int decoded_len = 0;
  *cp = tok::DecodeUtf8(text.data() + *pos, &decoded_len);
  *pos += len;
  return true;
}

}  // namespace kestrel::grammar
