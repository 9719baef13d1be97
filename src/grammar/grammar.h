// The one grammar representation every structured-output front-end compiles to: a context-free
// grammar whose terminals are UTF-8 literals and Unicode code point classes.
//
//   Grammar  = named rules, one of them the root
//   Expr     = empty | literal bytes | code point class | rule reference
//            | sequence | choice | repeat{min,max}
//
// Front-ends (front_ends.h): JSON Schema, json_object, regex, choice, GBNF text. The compiler
// (compiled_grammar.h) lowers code point classes to UTF-8 byte ranges, turns each rule into a DFA
// over bytes and rule references, and the matcher (matcher.h) runs an Earley parser over bytes.
// A Grammar is a plain value: build it, print it (ToGbnf), compile it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kestrel::grammar {

inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;
// Repeat upper bound meaning "no bound" (`*`, `+`, `{m,}`).
inline constexpr uint32_t kUnbounded = UINT32_MAX;
// Limits of the front-ends: larger repeat counts (regex/GBNF {m,n}, JSON Schema lengths and item
// counts) and deeper group nesting (the parsers recurse per group) are refused.
inline constexpr uint32_t kMaxRepeatCount = 100000;
inline constexpr int kMaxGroupNesting = 200;

// Inclusive range of Unicode code points.
struct CodepointRange {
  uint32_t lo = 0;
  uint32_t hi = 0;
  bool operator==(const CodepointRange&) const = default;
};

// A set of code points as sorted, disjoint, non-adjacent ranges. Surrogates (U+D800..U+DFFF) are
// never members (they have no UTF-8 encoding); a range may span the surrogate block, which keeps
// one representation per set ([0, 0x10FFFF] is "any character").
class CodepointSet {
 public:
  CodepointSet() = default;
  static CodepointSet Of(std::vector<CodepointRange> ranges);  // any order, overlaps allowed
  static CodepointSet Single(uint32_t cp) { return Of({{cp, cp}}); }
  static CodepointSet All() { return Of({{0, kMaxCodepoint}}); }

  CodepointSet Complement() const;
  CodepointSet Union(const CodepointSet& other) const;
  CodepointSet Minus(const CodepointSet& other) const;
  bool Contains(uint32_t cp) const;
  bool empty() const { return ranges_.empty(); }
  const std::vector<CodepointRange>& ranges() const { return ranges_; }
  bool operator==(const CodepointSet&) const = default;

 private:
  std::vector<CodepointRange> ranges_;
};

struct Expr {
  enum class Kind : uint8_t { kEmpty, kLiteral, kClass, kRuleRef, kSequence, kChoice, kRepeat };

  Kind kind = Kind::kEmpty;
  std::string literal;         // kLiteral: the bytes (UTF-8 text, never empty)
  CodepointSet chars;          // kClass: one code point from the set
  int32_t rule = -1;           // kRuleRef: index into Grammar::rules()
  std::vector<Expr> children;  // kSequence, kChoice: the parts; kRepeat: exactly one
  uint32_t min = 0;            // kRepeat bounds; max may be kUnbounded
  uint32_t max = 0;

  static Expr Empty() { return Expr{}; }
  static Expr Literal(std::string_view bytes);  // empty bytes give Empty()
  static Expr Class(CodepointSet chars);
  static Expr Char(uint32_t cp) { return Class(CodepointSet::Single(cp)); }
  static Expr Ref(int32_t rule);
  // Sequence/Choice flatten nested parts of the same kind; one part is returned as itself.
  static Expr Sequence(std::vector<Expr> parts);
  static Expr Choice(std::vector<Expr> alternatives);
  static Expr Repeat(Expr item, uint32_t min, uint32_t max);
  static Expr Optional(Expr item) { return Repeat(std::move(item), 0, 1); }
  static Expr Star(Expr item) { return Repeat(std::move(item), 0, kUnbounded); }
  static Expr Plus(Expr item) { return Repeat(std::move(item), 1, kUnbounded); }

  bool operator==(const Expr&) const = default;
};

struct Rule {
  std::string name;
  Expr body;
};

class Grammar {
 public:
  // Adds a rule (body empty until SetBody) and returns its index. A name already taken gets a
  // numeric suffix, so generated grammars never collide.
  int32_t AddRule(std::string_view name);
  void SetBody(int32_t rule, Expr body);
  // Adds a rule with its body; returns its index.
  int32_t AddRule(std::string_view name, Expr body);
  int32_t FindRule(std::string_view name) const;  // -1 when absent
  // Appends every rule of `other` (renamed where a name is taken, references remapped) and
  // returns the index its root has here.
  int32_t Import(const Grammar& other);

  const std::vector<Rule>& rules() const { return rules_; }
  const Rule& rule(int32_t i) const { return rules_[i]; }
  int32_t root() const { return root_; }
  void set_root(int32_t rule) { root_ = rule; }

  // GBNF text of the grammar (root first); ParseGbnf(ToGbnf()) gives an equivalent grammar.
  std::string ToGbnf() const;
  // GBNF text of one expression of this grammar (rule references by name).
  std::string ExprToGbnf(const Expr& e) const;

 private:
  std::vector<Rule> rules_;
  int32_t root_ = -1;
};

// Value of a hex digit, -1 for any other character.
inline int HexDigitValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Appends the UTF-8 encoding of cp (cp <= kMaxCodepoint, not a surrogate).
void AppendUtf8(uint32_t cp, std::string* out);
// Decodes one code point at text[*pos] and advances *pos; false on invalid or truncated UTF-8
// (overlong forms and surrogates are invalid). Both wrap the tokenizer's UTF-8 helpers.
bool DecodeUtf8(std::string_view text, size_t* pos, uint32_t* cp);

}  // namespace kestrel::grammar
