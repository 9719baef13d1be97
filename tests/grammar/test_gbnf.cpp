// GBNF front-end: accepted and rejected strings, printing round trip, line:col errors.
#include <gtest/gtest.h>

#include "grammar_test_util.h"

namespace kestrel::grammar {
namespace {

using testing::CompileOrDie;
using testing::FullMatch;
using testing::PrefixMatch;

std::shared_ptr<const CompiledGrammar> Gbnf(std::string_view text) {
  auto g = ParseGbnf(text);
  EXPECT_TRUE(g.ok()) << g.status().message();
  return g.ok() ? CompileOrDie(*g) : nullptr;
}

TEST(Gbnf, LiteralsAlternativesRepeats) {
  auto g = Gbnf(R"g(root ::= "a" ("b" | "cd")* "e"? [0-9]{2,3})g");
  ASSERT_NE(g, nullptr);
  for (const char* ok : {"a12", "ab12", "acdb123", "ae99", "abcdbe000"}) {
    EXPECT_TRUE(FullMatch(g, ok)) << ok;
  }
  for (const char* bad : {"", "a", "a1", "a1234", "abc12", "ee12", "ab1x"}) {
    EXPECT_FALSE(FullMatch(g, bad)) << bad;
  }
  EXPECT_TRUE(PrefixMatch(g, "abcd"));
  EXPECT_FALSE(PrefixMatch(g, "abx"));
  auto counts = Gbnf(R"g(root ::= "x"{,2} "-" . {3} [ab]{1,} # trailing comment
)g");
  ASSERT_NE(counts, nullptr);
  for (const char* ok : {"-\xC3\xA9\xC3\xA9\xC3\xA9" "a", "xx-123b", "x-...aba"}) {
    EXPECT_TRUE(FullMatch(counts, ok)) << ok;
  }
  for (const char* bad : {"xxx-123a", "-12a", "-123", "-1234"})
    EXPECT_FALSE(FullMatch(counts, bad)) << bad;
}

TEST(Gbnf, RecursionAndMultiLineRules) {
  auto g = Gbnf(R"g(
# balanced parentheses, left-recursive list
root ::= list
list ::= list "," item
       | item
item ::= "(" item* ")"
)g");
  ASSERT_NE(g, nullptr);
  for (const char* ok : {"()", "(())", "(()())", "(),()", "(()),(),((()))"}) {
    EXPECT_TRUE(FullMatch(g, ok)) << ok;
  }
  for (const char* bad : {"(", ")", "(()", "(),", ",()", "()()"}) {
    EXPECT_FALSE(FullMatch(g, bad)) << bad;
  }
}

TEST(Gbnf, CharClassesAndUtf8) {
  auto g = Gbnf(R"g(root ::= [^"\\]* "\"" [a-zé] . [\u4e00-\u9fff]+)g");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(FullMatch(g, "héllo\"éx中文"));
  EXPECT_TRUE(FullMatch(g, "\"a😀中"));
  EXPECT_FALSE(FullMatch(g, "\"a😀x"));
  EXPECT_FALSE(FullMatch(g, "a\\\"ab中"));
  // A multi-byte character split over two steps.
  GrammarMatcher m(g);
  EXPECT_TRUE(m.AcceptBytes("\"a\xF0\x9F"));
  EXPECT_FALSE(m.CanTerminate());
  EXPECT_FALSE(m.AcceptBytes("x"));
  EXPECT_TRUE(m.AcceptBytes("\x98\x80\xE4"));
  EXPECT_TRUE(m.AcceptBytes("\xB8\xAD"));
  EXPECT_TRUE(m.CanTerminate());
  // Invalid UTF-8 is never accepted.
  EXPECT_FALSE(PrefixMatch(g, "\xC3("));
  EXPECT_FALSE(PrefixMatch(g, "\xED\xA0\x80"));  // a surrogate
}

TEST(Gbnf, PrintParseRoundTrip) {
  auto g = ParseGbnf(R"g(root ::= ("x" [a-c]{2,}) | obj{1,2}
obj ::= "{" [^}]* "}")g");
  ASSERT_TRUE(g.ok()) << g.status().message();
  auto again = ParseGbnf(g->ToGbnf());
  ASSERT_TRUE(again.ok()) << again.status().message() << "\n" << g->ToGbnf();
  EXPECT_EQ(again->ToGbnf(), g->ToGbnf());
  auto c = CompileOrDie(*again);
  EXPECT_TRUE(FullMatch(c, "xabc"));
  EXPECT_TRUE(FullMatch(c, "{a}{}"));
  EXPECT_FALSE(FullMatch(c, "{a}{}{}"));
  EXPECT_FALSE(FullMatch(c, ""));
}

TEST(Gbnf, ErrorsCarryLineAndColumn) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"root ::= \"a", "gbnf:1:10: unterminated string"},
      {"root ::= [a-", "gbnf:1:10: unterminated character class"},
      {"root ::= x\n", "gbnf:1:10: undefined rule 'x'"},
      {"root ::= \"a\"\n  foo", "gbnf:2:3: undefined rule 'foo'"},
      {"start ::= \"a\"", "gbnf: the grammar has no 'root' rule"},
      {"root ::= (\"a\"\n", "gbnf:2:1: expected ')' to close the group opened at 1:10"},
      {"root ::= \"a\"{3,1}", "gbnf:1:13: repeat {m,n} with n < m"},
      {"root ::= \"a\"\nroot ::= \"b\"", "gbnf:2:1: rule 'root' is defined twice"},
      {"root ::= \"\\q\"", "gbnf:1:11: unknown escape '\\q'"},
      {"root = \"a\"", "gbnf:1:6: expected '::=' after rule name"},
      {"root ::= [z-a]", "gbnf:1:13: class range out of order"},
      {"root ::= \"a\" ) ", "gbnf:1:14: unbalanced ')'"},
  };
  for (const Case& c : cases) {
    auto g = ParseGbnf(c.text);
    ASSERT_FALSE(g.ok()) << c.text;
    EXPECT_EQ(g.status().message(), c.message) << c.text;
  }
}

TEST(Gbnf, EmptyLanguageIsAnError) {
  auto g = ParseGbnf("root ::= a\na ::= \"x\" a");
  ASSERT_TRUE(g.ok());
  auto compiled = CompiledGrammar::Compile(*g, nullptr);
  ASSERT_FALSE(compiled.ok());
  EXPECT_EQ(compiled.status().message(), "the grammar matches no string");
}

}  // namespace
}  // namespace kestrel::grammar
