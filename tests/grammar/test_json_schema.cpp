// JSON Schema front-end: accepted and rejected instances per keyword, exact numeric bounds, and
// the error messages (keyword and JSON pointer).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "grammar_test_util.h"

namespace kestrel::grammar {
namespace {

using testing::CompileOrDie;
using testing::FullMatch;

std::shared_ptr<const CompiledGrammar> Schema(std::string_view schema,
                                              const JsonSchemaOptions& options = {}) {
  auto g = JsonSchemaToGrammar(schema, options);
  EXPECT_TRUE(g.ok()) << g.status().message() << "\n" << schema;
  return g.ok() ? CompileOrDie(*g) : nullptr;
}

JsonSchemaOptions NonStrict() {
  JsonSchemaOptions o;
  o.strict = false;
  return o;
}
JsonSchemaOptions Compact() {
  JsonSchemaOptions o;
  o.max_whitespace_bytes = 0;
  return o;
}

struct Instances {
  std::vector<std::string> accept;
  std::vector<std::string> reject;
};

void Check(std::string_view schema, const Instances& cases, const JsonSchemaOptions& options = {}) {
  auto g = Schema(schema, options);
  ASSERT_NE(g, nullptr);
  for (const std::string& s : cases.accept)
    EXPECT_TRUE(FullMatch(g, s)) << schema << "\n  should accept: " << s;
  for (const std::string& s : cases.reject)
    EXPECT_FALSE(FullMatch(g, s)) << schema << "\n  should reject: " << s;
}

std::string ErrorOf(std::string_view schema) {
  auto g = JsonSchemaToGrammar(schema);
  EXPECT_FALSE(g.ok()) << schema;
  return g.ok() ? "" : g.status().message();
}

TEST(JsonSchema, ObjectRequiredInDeclaredOrder) {
  Check(
      R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"], "additionalProperties": false})",
      {{R"({"name":"a","age":3})", R"({ "name" : "a" , "age" : 3 })", R"({"name":"","age":-10})",
        "{\n  \"name\": \"x\",\n  \"age\": 0\n}"},
       {R"({"age":3,"name":"a"})", R"({"name":"a"})", R"({"name":"a","age":3,"x":1})",
        R"({"name":1,"age":3})", R"({"name":"a","age":3.5})", "", "{}", R"({"name":"a",,"age":3})",
        R"({"name":"a","age":3,})", R"( {"name":"a","age":3})", R"({"name":"a","age":3} )"}});
}

TEST(JsonSchema, OptionalProperties) {
  const char* schema = R"({"type": "object", "properties": {"a": {"type": "integer"},
      "b": {"type": "integer"}, "c": {"type": "integer"}}, "required": ["b"]})";
  Check(schema, {{R"({"b":1})", R"({"a":1,"b":2})", R"({"b":1,"c":2})", R"({"a":1,"b":1,"c":1})"},
                 {"{}", R"({"a":1})", R"({"c":1,"b":1})", R"({"a":1,"c":1})", R"({"b":1,"d":1})",
                  R"({"b":1,"b":1})"}});
  Check(R"({"type": "object", "properties": {"a": {"type": "integer"}, "c": {"type": "integer"}}})",
        {{"{}", R"({"a":1})", R"({"c":1})", R"({"a":1,"c":1})", "{ }"},
         {R"({"c":1,"a":1})", "{,}", R"({,"a":1})", R"({"a":1,})"}});
}

TEST(JsonSchema, AdditionalProperties) {
  Check(R"({"properties": {"a": {"type": "integer"}}, "additionalProperties": true})",
        {{R"({"a":1,"x":[1,{"y":null}]})", R"({"x":1})", "{}", R"({"a":1})", R"({"ab":"s"})",
          R"({"":1})", R"({"\u0062":1})"},
         {R"({"a":"s"})", R"({"x"})", R"({x:1})", R"({"a":1,"a":2})", R"({"x":1,"a":1})"}});
  Check(R"({"type": "object", "additionalProperties": {"type": "integer"}})",
        {{R"({"x":1,"y":2})", "{}"}, {R"({"x":"a"})", R"({"x":1,"y":true})"}});
  // Strict (the default): absent additionalProperties admits no other key; non-strict: any.
  const char* open = R"({"type": "object", "properties": {"a": {"type": "integer"}}})";
  Check(open, {{R"({"a":1})"}, {R"({"a":1,"b":"x"})"}});
  Check(open, {{R"({"a":1,"b":"x"})", R"({"b":{}})"}, {R"({"a":"x"})"}}, NonStrict());
}

TEST(JsonSchema, RequiredWithoutSchemaTakesAnyValue) {
  Check(R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]})",
        {{R"({"a":1,"b":[true]})", R"({"a":1,"b":"x"})"}, {R"({"a":1})", R"({"b":1,"a":1})"}});
}

TEST(JsonSchema, Arrays) {
  Check(R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})",
        {{"[1]", "[1,2,3]", "[ 1 , 2 ]", "[\n  1\n]"},
         {"[]", "[1,2,3,4]", R"(["a"])", "[1,]", "[,1]"}});
  Check(R"({"type": "array", "items": {"type": "string"}})",
        {{"[]", R"(["a"])", R"(["a","b","c","d","e"])"}, {"[1]", R"(["a",])"}});
  Check(R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]})",
        {{R"(["a",1])", R"(["a"])", "[]"}, {R"(["a",1,2])", R"([1,"a"])"}});
  Check(R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}],
            "items": {"type": "boolean"}, "minItems": 2})",
        {{R"(["a",1])", R"(["a",1,true,false])"}, {R"(["a"])", R"(["a",1,2])"}});
  Check(R"({"type": "array", "items": [{"const": 1}], "additionalItems": {"const": 2}})",
        {{"[1]", "[1,2,2]", "[]"}, {"[2]", "[1,1]"}});
  Check(R"({"type": "array", "maxItems": 0})", {{"[]", "[ ]"}, {"[1]"}});
}

TEST(JsonSchema, StringLengthCountsCharacters) {
  Check(R"({"type": "string", "minLength": 2, "maxLength": 3})",
        {{R"("ab")", R"("abc")", "\"\xC3\xA9\xE4\xB8\xAD\"", R"("a\n")", R"("\u00e9\"x")"},
         {R"("a")", R"("abcd")", R"("")", "\"\xE4\xB8\xAD\xE6\x96\x87\xE5\xAD\x97\xE7\xAC\xA6\"",
          R"("\u00e9")", "ab"}});
}

TEST(JsonSchema, StringEscapes) {
  Check(R"({"type": "string"})", {{R"("say \"hi\"")", R"("\u00e9\u00E9")", R"("tab\t\\ \/ \b\f\r")",
                                   "\"\xF0\x9F\x98\x80\"", R"("")"},
                                  {"\"line\nbreak\"", R"("\x")", R"("\u12")", R"("unterminated)",
                                   R"("a"b")", "\"\x01\"", "\"\xC3\"", "\"\xED\xA0\x80\""}});
}

TEST(JsonSchema, Pattern) {
  Check(R"({"type": "string", "pattern": "^[a-z]+-[0-9]{2}$"})",
        {{R"("abc-12")", R"("x-00")"}, {R"("abc-1")", R"("Abc-12")", R"("abc-123")", R"("-12")"}});
  // Unanchored: a match anywhere.
  Check(R"({"type": "string", "pattern": "ab"})",
        {{R"("ab")", R"("xxabyy")", R"("ab\"")"}, {R"("xy")", R"("a")"}});
  Check(R"({"type": "string", "pattern": "^a.*\\d$"})",
        {{R"("a1")", R"("a  \"quoted\" 7")"}, {R"("a")", R"("ab")"}});
  // Characters JSON must escape appear escaped in the instance.
  Check(R"({"type": "string", "pattern": "^a\"b\\\\c\n$"})",
        {{R"("a\"b\\c\n")", R"("a\"b\\c\u000a")"}, {"\"a\"b\\c\n\"", R"("a\"b\\c")"}});
  Check(R"({"type": "string", "pattern": "^[^a-z]{2}$"})",
        {{R"("AB")", R"("\"\\")", R"("\t\u0000")", "\"\xC3\xA9!\""}, {R"("aB")", R"("ABC")"}});
}

TEST(JsonSchema, Formats) {
  Check(R"({"type": "string", "format": "date"})",
        {{R"("2024-02-29")", R"("1999-12-31")"},
         {R"("2024-13-01")", R"("2024-1-01")", R"("24-01-01")"}});
  Check(R"({"type": "string", "format": "date-time"})",
        {{R"("2024-01-01T10:00:00Z")", R"("2024-01-01T23:59:60.123+05:30")"},
         {R"("2024-01-01 10:00")", R"("2024-01-01T24:00:00Z")", R"("2024-01-01T10:00:00")"}});
  Check(R"({"type": "string", "format": "time"})", {{R"("10:20:30Z")"}, {R"("10:20")"}});
  Check(R"({"type": "string", "format": "uuid"})",
        {{R"("123e4567-e89b-12d3-a456-426614174000")"},
         {R"("123e4567e89b12d3a456426614174000")", R"("xyz")"}});
  Check(R"({"type": "string", "format": "email"})",
        {{R"("a.b+c@example.co.uk")"}, {R"("a@b")", R"("@example.com")", R"("a b@example.com")"}});
  Check(R"({"type": "string", "format": "ipv4"})",
        {{R"("192.168.0.1")", R"("0.0.0.0")"}, {R"("256.1.1.1")", R"("1.2.3")", R"("01.2.3.4")"}});
  Check(R"({"type": "string", "format": "duration"})",
        {{R"("P3DT4H")", R"("PT0.5S")", R"("P2W")"}, {R"("3D")"}});
  // Unknown formats are annotations.
  Check(R"({"type": "string", "format": "x-custom"})", {{R"("anything")"}, {"1"}});
}

TEST(JsonSchema, EnumConstBooleanNull) {
  Check(R"({"enum": ["red", "green", 1, null, {"a": 1}, "caf\u00e9"]})",
        {{R"("red")", "1", "null", R"({"a":1})", "\"caf\xC3\xA9\""},
         {R"("blue")", "2", R"({"a": 1})", R"("Red")"}});
  Check(R"({"type": "string", "enum": ["a", "b"]})", {{R"("a")"}, {R"("c")"}});
  Check(R"({"const": "x"})", {{R"("x")"}, {R"("y")", "x"}});
  Check(R"({"const": {"k": [1, 2]}})", {{R"({"k":[1,2]})"}, {R"({"k":[1]})"}});
  Check(R"({"type": "boolean"})", {{"true", "false"}, {"True", "1", "null"}});
  Check(R"({"type": "null"})", {{"null"}, {"false", "nul"}});
}

TEST(JsonSchema, UnionsAndNullable) {
  for (const char* key : {"anyOf", "oneOf"}) {
    Check(std::string(R"({")") + key +
              R"(": [{"type": "string"}, {"type": "integer", "minimum": 0}]})",
          {{R"("x")", "5"}, {"-1", "true", "1.5"}});
  }
  Check(R"({"allOf": [{"type": "integer"}]})", {{"3"}, {"\"3\""}});
  Check(R"({"type": ["string", "null"]})", {{R"("x")", "null"}, {"1"}});
  Check(R"({"type": "integer", "nullable": true})", {{"1", "null"}, {"\"1\""}});
  Check(R"({"type": ["integer", "string"], "minimum": 5, "maxLength": 1})",
        {{"5", "99", R"("a")"}, {"4", R"("ab")"}});
  Check(R"({})", {{"1", R"({"a":[null]})", R"("s")", "[]", "-2.5e10"}, {"", "nope", "[1,]"}});
  Check(R"(true)", {{"1", "{}"}, {"{"}});
}

TEST(JsonSchema, RefsAndRecursion) {
  Check(R"({"$defs": {"node": {"type": "object", "properties": {"value": {"type": "integer"},
              "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
              "required": ["value", "children"]}},
            "$ref": "#/$defs/node"})",
        {{R"({"value":1,"children":[]})",
          R"({"value":1,"children":[{"value":2,"children":[{"value":3,"children":[]}]}]})"},
         {R"({"value":1})", R"({"value":1,"children":[{"value":2}]})"}});
  Check(R"({"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
            "required": ["next"]})",
        {{R"({"next":null})", R"({"next":{"next":{"next":null}}})"}, {R"({"next":{}})"}});
  Check(
      R"({"definitions": {"a/b": {"type": "integer"}}, "properties": {"x": {"$ref": "#/definitions/a~1b"}},
            "required": ["x"]})",
      {{R"({"x":1})"}, {R"({"x":"1"})"}});
}

TEST(JsonSchema, WhitespaceIsBounded) {
  const char* schema =
      R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})";
  Check(schema, {{"{" + std::string(16, ' ') + "\"a\":1}", "{\"a\"\t:\r\n1}"},
                 {"{" + std::string(17, ' ') + "\"a\":1}"}});
  Check(schema, {{R"({"a":1})"}, {R"({ "a":1})", R"({"a": 1})"}}, Compact());
  JsonSchemaOptions python;
  python.layout = JsonSchemaOptions::Layout::kPythonSeparators;
  Check(R"({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}},
            "b": {"type": "boolean"}}, "required": ["a", "b"]})",
        {{R"({"a": [1, 2], "b": true})", R"({"a": [], "b": false})"},
         {R"({"a":[1,2],"b":true})", R"({"a": [1,2], "b": true})", R"({ "a": [1, 2], "b": true})"}},
        python);
}

TEST(JsonSchema, Utf8KeysAndValues) {
  Check(
      R"({"type": "object", "properties": {"名前": {"type": "string", "maxLength": 2}}, "required": ["名前"]})",
      {{R"({"名前":"値"})", R"({"名前":"😀😀"})"}, {R"({"名前":"値値値"})", R"({"名":"値"})"}});
}

TEST(JsonSchema, JsonObjectMode) {
  auto g = CompileOrDie(JsonObjectGrammar());
  ASSERT_NE(g, nullptr);
  for (const char* ok : {R"({"a":[1,2,{"b":null}]})", "{}", R"({"x": "y", "z": -1.5e3})"}) {
    EXPECT_TRUE(FullMatch(g, ok)) << ok;
  }
  for (const char* bad : {"[1]", R"("str")", "1", R"({"a":})", R"({"a":1)"})
    EXPECT_FALSE(FullMatch(g, bad)) << bad;
}

// ---- numbers: exact bounds, checked against exact arithmetic over a grid ----

TEST(JsonSchema, IntegerBoundsExhaustive) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> pick(-1200, 1200);
  for (int trial = 0; trial < 24; ++trial) {
    int lo = pick(rng);
    int hi = pick(rng);
    if (lo > hi) std::swap(lo, hi);
    const bool lo_excl = trial % 3 == 1;
    const bool hi_excl = trial % 4 == 2;
    std::string schema = R"({"type": "integer")";
    if (trial % 5 != 4)
      schema += std::string(lo_excl ? R"(, "exclusiveMinimum": )" : R"(, "minimum": )") +
                std::to_string(lo);
    if (trial % 7 != 6)
      schema += std::string(hi_excl ? R"(, "exclusiveMaximum": )" : R"(, "maximum": )") +
                std::to_string(hi);
    schema += "}";
    const bool has_lo = trial % 5 != 4;
    const bool has_hi = trial % 7 != 6;
    auto g = Schema(schema);
    ASSERT_NE(g, nullptr);
    for (int v = -2500; v <= 2500; ++v) {
      const bool in =
          (!has_lo || (lo_excl ? v > lo : v >= lo)) && (!has_hi || (hi_excl ? v < hi : v <= hi));
      EXPECT_EQ(FullMatch(g, std::to_string(v)), in) << schema << " value " << v;
    }
    for (const char* bad : {"-0", "01", "1.0", "1e2", "+1", "", "-"})
      EXPECT_FALSE(FullMatch(g, bad)) << schema << " " << bad;
  }
  Check(R"({"type": "integer", "minimum": 1.5, "maximum": 3.7})", {{"2", "3"}, {"1", "4"}});
  Check(R"({"type": "integer", "minimum": 18})",
        {{"18", "19", "100", "123456789012345678901234"}, {"17", "9", "-1"}});
  Check(R"({"type": "integer", "maximum": -3})", {{"-3", "-4", "-100000"}, {"-2", "0", "5"}});
}

// Decimal texts with up to two fraction digits, valued in hundredths.
TEST(JsonSchema, NumberBoundsExhaustive) {
  struct Range {
    const char* schema;
    int lo;  // hundredths; INT32_MIN / INT32_MAX: unbounded
    bool lo_excl;
    int hi;
    bool hi_excl;
  };
  const Range ranges[] = {
      {R"({"type": "number", "minimum": 0.5, "maximum": 2.25})", 50, false, 225, false},
      {R"({"type": "number", "exclusiveMinimum": 0})", 0, true, INT32_MAX, false},
      {R"({"type": "number", "minimum": -1.05, "exclusiveMaximum": 1.1})", -105, false, 110, true},
      {R"({"type": "number", "exclusiveMinimum": -3, "exclusiveMaximum": -0.5})", -300, true, -50,
       true},
      {R"({"type": "number", "maximum": 0})", INT32_MIN, false, 0, false},
      {R"({"type": "number", "minimum": 1.25, "maximum": 1.75})", 125, false, 175, false},
      {R"({"type": "number", "minimum": 10, "maximum": 10})", 1000, false, 1000, false},
      {R"({"type": "number", "minimum": 0, "maximum": 1, "exclusiveMaximum": 0.99})", 0, false, 99,
       true},
  };
  for (const Range& r : ranges) {
    auto g = Schema(r.schema);
    ASSERT_NE(g, nullptr);
    for (int v = -1200; v <= 1200; ++v) {
      const bool in = (r.lo == INT32_MIN || (r.lo_excl ? v > r.lo : v >= r.lo)) &&
                      (r.hi == INT32_MAX || (r.hi_excl ? v < r.hi : v <= r.hi));
      const int a = std::abs(v);
      const std::string sign = v < 0 ? "-" : "";
      // Every spelling of the value: 1, 1.0, 1.00, 1.5, 1.50, 1.05.
      std::vector<std::string> texts;
      const std::string whole = sign + std::to_string(a / 100);
      const int cents = a % 100;
      if (cents == 0) {
        if (v != 0 || sign.empty()) texts = {whole, whole + ".0", whole + ".00"};
      } else if (cents % 10 == 0) {
        texts = {whole + "." + std::to_string(cents / 10),
                 whole + "." + std::to_string(cents / 10) + "0"};
      } else {
        texts = {whole + "." + (cents < 10 ? "0" : "") + std::to_string(cents)};
      }
      for (const std::string& t : texts)
        EXPECT_EQ(FullMatch(g, t), in) << r.schema << " value " << t;
    }
    for (const char* bad : {"1e1", "1.", ".5", "01", "-", "+1", "1.5.0"})
      EXPECT_FALSE(FullMatch(g, bad)) << r.schema << " " << bad;
  }
  // Fractions longer than the bound's.
  Check(R"({"type": "number", "minimum": 0.1, "maximum": 0.2})",
        {{"0.1", "0.15", "0.1999999", "0.2", "0.2000"}, {"0.0999", "0.2001", "0.21", "0"}});
  Check(R"({"type": "number", "exclusiveMinimum": 0.1})",
        {{"0.1000001", "7"}, {"0.1", "0.10", "0.05"}});
  Check(R"({"type": "number"})",
        {{"0", "-1.5", "2e10", "3.25E-7", "-0"}, {"1.", ".5", "01", "1e", "--1"}});
}

// ---- errors ----

TEST(JsonSchema, ErrorsNameKeywordAndPath) {
  EXPECT_EQ(ErrorOf(R"({"type": "object", "properties": {"a": {"type": "string", "not": {}}}})"),
            "json_schema: unsupported keyword 'not' at #/properties/a");
  EXPECT_EQ(ErrorOf(R"({"type": "array", "items": {"uniqueItems": true}})"),
            "json_schema: unsupported keyword 'uniqueItems' (only false is supported) at #/items");
  EXPECT_EQ(ErrorOf(R"({"allOf": [{"type": "integer"}, {"minimum": 1}]})"),
            "json_schema: 'allOf' with more than one schema at #/allOf");
  EXPECT_EQ(ErrorOf(R"({"$ref": "https://example.com/s.json"})"),
            "json_schema: '$ref' to 'https://example.com/s.json' (only local references '#...' are "
            "supported) at #/$ref");
  EXPECT_EQ(ErrorOf(R"({"$ref": "#/$defs/missing"})"),
            "json_schema: '$ref' '#/$defs/missing' does not resolve at #/$ref");
  EXPECT_EQ(ErrorOf(R"({"type": "strin"})"), "json_schema: unknown type 'strin' at #/type");
  EXPECT_EQ(ErrorOf(R"({"type": "string", "minLength": 5, "maxLength": 2})"),
            "json_schema: 'minLength' is above 'maxLength' at #");
  EXPECT_EQ(ErrorOf(R"({"type": "integer", "minimum": 5, "maximum": 4})"),
            "json_schema: no integer lies within the bounds at #");
  EXPECT_EQ(
      ErrorOf(R"({"type": "object", "properties": {"p/q": {"type": "string", "pattern": "(a"}}})"),
      "json_schema: 'pattern' at #/properties/p~1q/pattern: regex: at offset 3: missing ')'");
  EXPECT_EQ(ErrorOf(R"j({"type": "string", "pattern": "(?=a)"})j"),
            "json_schema: 'pattern' at #/pattern: regex: at offset 3: lookaround or inline flag "
            "group '(?' is not supported");
  EXPECT_EQ(ErrorOf(R"({"type": "object", "minProperties": 1})"),
            "json_schema: unsupported keyword 'minProperties' at #");
  EXPECT_EQ(ErrorOf(R"({"anyOf": [{"type": "integer"}], "minimum": 3})"),
            "json_schema: 'minimum' beside 'anyOf' at #");
  EXPECT_EQ(ErrorOf(R"({"type": "array", "items": {"type": "integer", "multipleOf": 2}})"),
            "json_schema: unsupported keyword 'multipleOf' at #/items");
  EXPECT_EQ(ErrorOf(R"({"enum": []})"), "json_schema: 'enum' must be a non-empty array at #/enum");
  EXPECT_EQ(ErrorOf(R"({"type": "string", "maxLength": -1})"),
            "json_schema: 'maxLength' must be a non-negative integer at #/maxLength");
  EXPECT_EQ(ErrorOf("{\"type\": "), "json_schema: the schema is not valid JSON");
  EXPECT_EQ(ErrorOf("false"), "json_schema: schema 'false' (matches nothing) at #");
  auto unsupported = JsonSchemaToGrammar(R"({"not": {}})");
  EXPECT_EQ(unsupported.status().code(), StatusCode::kUnsupported);
  auto invalid = JsonSchemaToGrammar(R"({"type": 3})");
  EXPECT_EQ(invalid.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kestrel::grammar
