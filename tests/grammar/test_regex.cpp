// Regex and choice front-ends: constructs, full-match semantics, errors with offsets, limits.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "grammar_test_util.h"

namespace kestrel::grammar {
namespace {

using testing::CompileOrDie;
using testing::FullMatch;

std::shared_ptr<const CompiledGrammar> Regex(std::string_view pattern) {
  auto g = RegexToGrammar(pattern);
  EXPECT_TRUE(g.ok()) << pattern << ": " << g.status().message();
  return g.ok() ? CompileOrDie(*g) : nullptr;
}

void Check(std::string_view pattern, const std::vector<std::string>& accept,
           const std::vector<std::string>& reject) {
  auto g = Regex(pattern);
  ASSERT_NE(g, nullptr);
  for (const std::string& s : accept)
    EXPECT_TRUE(FullMatch(g, s)) << pattern << " should accept '" << s << "'";
  for (const std::string& s : reject)
    EXPECT_FALSE(FullMatch(g, s)) << pattern << " should reject '" << s << "'";
}

TEST(Regex, Constructs) {
  Check(R"([a-z]+@\d{2,3})", {"ab@12", "x@999"}, {"@12", "ab@1", "ab@1234", "AB@12"});
  Check(R"(colou?r|gr[ae]y)", {"color", "colour", "gray", "grey"}, {"colouur", "graey", ""});
  Check(R"((?:ab)*c(?<name>d|e)+)",
        {"c"
         "d",
         "ababcde", "cee"},
        {"abc", "abacd"});
  Check(R"((?P<x>a){3})", {"aaa"}, {"aa", "aaaa"});
  Check(R"(a{2,}b{,2})", {"aab{,2}", "aaab{,2}"}, {"ab{,2}", "aabb"});  // {,n} is literal here
  Check(R"(x{y})", {"x{y}"}, {"xy"});
  Check(R"(a+?b*?c??)", {"a", "aabbc"}, {"b"});
  Check(R"(^abc$)", {"abc"}, {"xabc", "abcx"});
  Check(R"(^a|b$)", {"a", "b"}, {"ab"});
}

TEST(Regex, EscapesAndClasses) {
  Check(R"(\n\t\.\\\/\x41\u00e9\u{1F600})", {"\n\t.\\/A\xC3\xA9\xF0\x9F\x98\x80"},
        {"\n\tx\\/A\xC3\xA9\xF0\x9F\x98\x80"});
  Check(R"([\d\s_-]+)", {"1 2_3-\t", "\xE3\x80\x80"}, {"a", ""});
  Check(R"([^\w]+)", {"!?", "\xC3\xA9"}, {"a", "_", "9"});
  Check(R"(\D\W\S)", {"a!x"}, {"1!x", "aax", "a! "});
  Check(R"(.+)", {"a", "\xE4\xB8\xAD\xE6\x96\x87", "\r"}, {"\n", "a\nb"});
  Check(R"([]a]+)", {"]a]"}, {"b"});
  Check(R"([a\-z])", {"a", "-", "z"}, {"b"});
  Check(R"([\]\[]+)", {"[]]"}, {"a"});
  Check("caf\xC3\xA9|\xE4\xB8\xAD+", {"caf\xC3\xA9", "\xE4\xB8\xAD\xE4\xB8\xAD"},
        {"cafe", "\xE4\xB8"});
  Check(R"(\$\^\(\)\*\+\?\{\}\|)", {"$^()*+?{}|"}, {"$^"});
  Check(R"([\b])", {"\b"}, {"b"});
}

TEST(Regex, ErrorsCarryOffsets) {
  struct Case {
    const char* pattern;
    const char* message;
    StatusCode code;
  };
  const Case cases[] = {
      {"(a", "regex: at offset 3: missing ')'", StatusCode::kInvalidArgument},
      {"a)", "regex: at offset 2: unbalanced ')'", StatusCode::kInvalidArgument},
      {"*a", "regex: at offset 1: quantifier without anything to repeat",
       StatusCode::kInvalidArgument},
      {"[ab", "regex: at offset 4: missing ']'", StatusCode::kInvalidArgument},
      {"a{3,1}", "regex: at offset 7: repeat {m,n} with n < m", StatusCode::kInvalidArgument},
      {"(a)\\1", "regex: at offset 5: backreference is not supported", StatusCode::kUnsupported},
      {"(?=x)", "regex: at offset 3: lookaround or inline flag group '(?' is not supported",
       StatusCode::kUnsupported},
      {"a\\bc", "regex: at offset 3: word boundary \\b is not supported", StatusCode::kUnsupported},
      {"a^b", "regex: at offset 2: '^' other than at the start of the pattern is not supported",
       StatusCode::kUnsupported},
      {"a$b", "regex: at offset 2: '$' other than at the end of the pattern is not supported",
       StatusCode::kUnsupported},
      {"[z-a]", "regex: at offset 5: class range out of order", StatusCode::kInvalidArgument},
      {"ab\\", "regex: at offset 4: pattern ends with a backslash", StatusCode::kInvalidArgument},
      {"\\xZZ", "regex: at offset 3: expected a hex digit", StatusCode::kInvalidArgument},
      {"a++", "regex: at offset 3: possessive quantifier is not supported",
       StatusCode::kUnsupported},
      {"\\p{L}", "regex: at offset 2: escape \\p is not supported", StatusCode::kUnsupported},
      {"a{100001}", "regex: at offset 3: repeat count above 100000", StatusCode::kUnsupported},
      {"[^\\s\\S]", "regex: at offset 1: character class matches nothing",
       StatusCode::kInvalidArgument},
  };
  for (const Case& c : cases) {
    auto g = RegexToGrammar(c.pattern);
    ASSERT_FALSE(g.ok()) << c.pattern;
    EXPECT_EQ(g.status().message(), c.message) << c.pattern;
    EXPECT_EQ(g.status().code(), c.code) << c.pattern;
  }
}

TEST(Regex, LimitsAreErrorsNotCrashes) {
  const std::string deep = std::string(300, '(') + "a" + std::string(300, ')');
  auto g = RegexToGrammar(deep);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().message(),
            "regex: at offset 201: group nesting deeper than 200 is not supported");
  auto huge = RegexToGrammar("(a{1000}){1000}");
  ASSERT_TRUE(huge.ok());
  auto compiled = CompiledGrammar::Compile(*huge, nullptr);
  ASSERT_FALSE(compiled.ok());
  EXPECT_NE(compiled.status().message().find("grammar too large"), std::string::npos)
      << compiled.status().message();
  std::string nested_schema;
  for (int i = 0; i < 200; ++i) nested_schema += R"({"type": "array", "items": )";
  nested_schema += "{}" + std::string(200, '}');
  auto schema = JsonSchemaToGrammar(nested_schema);
  ASSERT_FALSE(schema.ok());
  EXPECT_NE(schema.status().message().find("schema nesting deeper than 128"), std::string::npos);
}

TEST(Choice, ExactlyOneString) {
  std::vector<std::string> choices = {"yes", "no", "yes please", "", "\xE6\x98\xAF"};
  auto g = ChoiceGrammar(choices);
  ASSERT_TRUE(g.ok());
  auto c = CompileOrDie(*g);
  for (const std::string& s : choices) EXPECT_TRUE(FullMatch(c, s)) << s;
  for (const char* s : {"ye", "yes ", "No", "nono", "\xE6\x98"}) EXPECT_FALSE(FullMatch(c, s)) << s;
  EXPECT_FALSE(ChoiceGrammar({}).ok());
  std::vector<std::string> invalid = {"ok", "\xFF"};
  EXPECT_EQ(ChoiceGrammar(invalid).status().message(), "choice: a choice is not valid UTF-8");
}

}  // namespace
}  // namespace kestrel::grammar
