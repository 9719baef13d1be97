// Tool-call and reasoning parsers (src/server/parsers): every format on fixed model outputs,
// fed whole, split at every byte position, and byte by byte; the streamed pieces must always add
// up to the message of one Feed, and content must never show a partial tag.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/parsers/output_parser.h"
#include "server/parsers/text_scan.h"
#include "server/parsers/tool_call_parser.h"
#include "tokenizer/chat_template.h"

namespace kestrel::server {
namespace {

using Json = nlohmann::ordered_json;
using Kind = OutputPiece::Kind;

OutputParserOptions Options(ToolCallFormat format, bool reasoning = false,
                            bool starts_in_reasoning = false) {
  OutputParserOptions o;
  o.tool_calls = format;
  o.reasoning = reasoning;
  o.starts_in_reasoning = starts_in_reasoning;
  return o;
}

// Feeds `parts` in order, then finishes; checks the invariants of the piece stream.
ParsedMessage Run(const OutputParserOptions& options, const std::vector<std::string>& parts) {
  OutputParser parser(options);
  OutputPieces all;
  for (const std::string& part : parts) parser.Feed(part, &all);
  parser.Finish(&all);
  ParsedMessage m;
  int32_t next_call = 0;
  for (const OutputPiece& p : all) {
    if (p.kind == Kind::kToolCall) {
      // Calls start in order, and fragments only follow their start.
      if (p.starts_call()) {
        EXPECT_EQ(p.tool_index, next_call);
        ++next_call;
      } else {
        EXPECT_LT(p.tool_index, next_call);
      }
    }
    m.Add(p);
  }
  EXPECT_EQ(parser.n_tool_calls(), static_cast<int32_t>(m.tool_calls.size()));
  return m;
}

ParsedMessage Whole(const OutputParserOptions& options, const std::string& text) {
  return Run(options, {text});
}

// The message of one Feed; and the same for every split into two parts, and byte by byte.
ParsedMessage ExpectSplitInvariant(const OutputParserOptions& options, const std::string& text) {
  const ParsedMessage whole = Whole(options, text);
  for (size_t split = 0; split <= text.size(); ++split) {
    const ParsedMessage m = Run(options, {text.substr(0, split), text.substr(split)});
    EXPECT_EQ(m, whole) << "split at " << split << " of: " << text;
    if (m != whole) break;
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  EXPECT_EQ(Run(options, bytes), whole) << "byte by byte: " << text;
  // Three-way splits of short texts, so state changes straddling two boundaries are covered.
  if (text.size() <= 160) {
    for (size_t a = 0; a <= text.size(); a += 3) {
      for (size_t b = a; b <= text.size(); b += 5) {
        const ParsedMessage m =
            Run(options, {text.substr(0, a), text.substr(a, b - a), text.substr(b)});
        EXPECT_EQ(m, whole) << "splits at " << a << ", " << b << " of: " << text;
        if (m != whole) return whole;
      }
    }
  }
  return whole;
}

// Streaming content never contains a tag or its beginning that is not in the final content.
void ExpectNoPartialTagsInContent(const OutputParserOptions& options, const std::string& text,
                                  const std::vector<std::string>& tags) {
  OutputParser parser(options);
  std::string content;
  for (char c : text) {
    OutputPieces pieces;
    parser.Feed(std::string(1, c), &pieces);
    for (const OutputPiece& p : pieces) {
      if (p.kind != Kind::kContent) continue;
      content += p.text;
      for (const std::string& tag : tags) {
        for (size_t len = 2; len <= tag.size(); ++len) {
          EXPECT_FALSE(content.ends_with(tag.substr(0, len)))
              << "content shows '" << tag.substr(0, len) << "' after: " << content;
        }
      }
    }
  }
}

ParsedToolCall Call(std::string name, std::string arguments) {
  return {std::move(name), std::move(arguments)};
}

// ---- Hermes / Qwen3 ----

TEST(HermesParser, TextThenOneCall) {
  const std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"unit\": \"c\"}}\n</tool_call>";
  const ParsedMessage m = ExpectSplitInvariant(Options(ToolCallFormat::kHermes), text);
  EXPECT_EQ(m.content, "Let me check.");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0], Call("get_weather", R"({"city": "Paris", "unit": "c"})"));
  ExpectNoPartialTagsInContent(Options(ToolCallFormat::kHermes), text, {"<tool_call>"});
}

TEST(HermesParser, SeveralCallsAndNoContent) {
  const std::string text =
      "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": "
      "\"b\", \"arguments\": {\"x\": [1, {\"y\": \"}\"}]}}\n</tool_call>\n";
  const ParsedMessage m = ExpectSplitInvariant(Options(ToolCallFormat::kHermes), text);
  EXPECT_EQ(m.content, "");
  ASSERT_EQ(m.tool_calls.size(), 2u);
  EXPECT_EQ(m.tool_calls[0], Call("a", "{}"));
  EXPECT_EQ(m.tool_calls[1], Call("b", R"({"x": [1, {"y": "}"}]})"));
}

TEST(HermesParser, ParallelToolCallsFalseKeepsTheFirst) {
  OutputParserOptions o = Options(ToolCallFormat::kHermes);
  o.parallel_tool_calls = false;
  const std::string text =
      "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"i\": 1}}\n</tool_call>\n<tool_call>\n"
      "{\"name\": \"b\", \"arguments\": {}}\n</tool_call>";
  const ParsedMessage m = ExpectSplitInvariant(o, text);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0], Call("a", R"({"i": 1})"));
  EXPECT_EQ(m.content, "");
}

TEST(HermesParser, ClosingTagInsideTheName) {
  // The first </tool_call> ends the call whatever the split: here inside the head.
  const std::string text =
      "<tool_call>{\"name\": \"a</tool_call>\", \"arguments\": {}}</tool_call>";
  const ParsedMessage m = ExpectSplitInvariant(Options(ToolCallFormat::kHermes), text);
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, text);
}

TEST(HermesParser, StringsHoldingBracketsAndTags) {
  const std::string text =
      "<tool_call>\n{\"name\": \"run\", \"arguments\": {\"code\": \"x = {'a': '}'}  # "
      "</tool_call> \\\" }\"}}\n</tool_call>done";
  const ParsedMessage m = ExpectSplitInvariant(Options(ToolCallFormat::kHermes), text);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, R"({"code": "x = {'a': '}'}  # </tool_call> \" }"})");
  EXPECT_EQ(m.content, "done");
}

TEST(HermesParser, OtherKeyOrderIsReadWhole) {
  const std::string text =
      "<tool_call>\n{\"arguments\": {\"b\": 2, \"a\": \"x\"}, \"name\": \"f\"}\n</tool_call>";
  const ParsedMessage m = ExpectSplitInvariant(Options(ToolCallFormat::kHermes), text);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0], Call("f", R"({"b":2,"a":"x"})"));
}

TEST(HermesParser, ArgumentsAsAStringAreUnwrapped) {
  const std::string text =
      "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>";
  const ParsedMessage m = ExpectSplitInvariant(Options(ToolCallFormat::kHermes), text);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0], Call("f", R"({"a":1})"));
}

TEST(HermesParser, UnreadableCallIsContent) {
  const std::string text = "Hi <tool_call>\nnot json at all\n</tool_call> bye";
  const ParsedMessage m = ExpectSplitInvariant(Options(ToolCallFormat::kHermes), text);
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, text);
}

TEST(HermesParser, TruncatedCalls) {
  // The name is known: a call with what the arguments had so far.
  ParsedMessage m = ExpectSplitInvariant(Options(ToolCallFormat::kHermes),
                                         "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0], Call("f", R"({"a": 1)"));
  // The head is not complete: the text is content.
  m = ExpectSplitInvariant(Options(ToolCallFormat::kHermes), "ok <tool_call>\n{\"name\": \"f");
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, "ok <tool_call>\n{\"name\": \"f");
  // A partial tag at the end is content.
  m = ExpectSplitInvariant(Options(ToolCallFormat::kHermes), "x <tool_ca");
  EXPECT_EQ(m.content, "x <tool_ca");
}

TEST(HermesParser, TextAroundAndLessThanSigns) {
  const std::string text =
      "if a < b and c <tool: yes\n\n<tool_call>{\"name\": \"f\", \"parameters\": {}}</tool_call>"
      "\n\nAfter.";
  const ParsedMessage m = ExpectSplitInvariant(Options(ToolCallFormat::kHermes), text);
  EXPECT_EQ(m.content, "if a < b and c <tool: yes\n\nAfter.");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0], Call("f", "{}"));
}

TEST(HermesParser, WhitespaceOnlyAnswerIsKept) {
  const ParsedMessage m = ExpectSplitInvariant(Options(ToolCallFormat::kHermes), "  \n");
  EXPECT_EQ(m.content, "  \n");
}

TEST(HermesParser, FirstDeltaCarriesTheNameThenFragments) {
  OutputParser parser(Options(ToolCallFormat::kHermes));
  OutputPieces pieces;
  parser.Feed("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\"", &pieces);
  // The start and the first fragment travel together.
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_TRUE(pieces[0].starts_call());
  EXPECT_EQ(pieces[0].tool_name, "f");
  EXPECT_EQ(pieces[0].text, "{\"a\"");
  pieces.clear();
  parser.Feed(": 1}}\n</tool_call>", &pieces);
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_FALSE(pieces[0].starts_call());
  EXPECT_EQ(pieces[0].text, ": 1}");
}

// ---- reasoning ----

TEST(ReasoningParser, ThinkBlockThenContentAndCall) {
  const std::string text =
      "<think>\nThe user wants weather.\n</think>\n\nSure.\n<tool_call>\n{\"name\": \"w\", "
      "\"arguments\": {\"c\": \"P\"}}\n</tool_call>";
  const OutputParserOptions o = Options(ToolCallFormat::kHermes, /*reasoning=*/true);
  const ParsedMessage m = ExpectSplitInvariant(o, text);
  EXPECT_EQ(m.reasoning, "\nThe user wants weather.\n");
  EXPECT_EQ(m.content, "Sure.");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  ExpectNoPartialTagsInContent(o, text, {"<think>", "</think>", "<tool_call>"});
}

TEST(ReasoningParser, PromptOpenedTheBlock) {
  const OutputParserOptions o = Options(ToolCallFormat::kNone, true, /*starts_in_reasoning=*/true);
  ParsedMessage m = ExpectSplitInvariant(o, "Let me think.\n</think>\n\nThe answer is 4.");
  EXPECT_EQ(m.reasoning, "Let me think.\n");
  EXPECT_EQ(m.content, "The answer is 4.");
  // Cut off while thinking: all reasoning.
  m = ExpectSplitInvariant(o, "Still thinking </thi");
  EXPECT_EQ(m.reasoning, "Still thinking </thi");
  EXPECT_EQ(m.content, "");
}

TEST(ReasoningParser, NoThinkBlockIsContent) {
  const OutputParserOptions o = Options(ToolCallFormat::kNone, true);
  ParsedMessage m = ExpectSplitInvariant(o, "  Hello <think>not reasoning</think>");
  EXPECT_EQ(m.reasoning, "");
  EXPECT_EQ(m.content, "  Hello <think>not reasoning</think>");
  m = ExpectSplitInvariant(o, "<thin");
  EXPECT_EQ(m.content, "<thin");
  m = ExpectSplitInvariant(o, "<think></think>");
  EXPECT_EQ(m.reasoning, "");
  EXPECT_EQ(m.content, "");
}

TEST(ReasoningParser, PromptOpensReasoning) {
  EXPECT_TRUE(PromptOpensReasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(PromptOpensReasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(PromptOpensReasoning("<|im_start|>assistant\n"));
}

// ---- Qwen3-Coder XML ----

Json WeatherTools() {
  return Json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "ratio": {"type": "number"}, "opts": {"type": "object"}, "tags": {"type": "array"},
        "note": {"type": ["string", "null"]}, "any": {"anyOf": [{"type": "integer"},
        {"type": "string"}]}}}}}])");
}

TEST(Qwen3CoderParser, TypedParameters) {
  OutputParserOptions o = Options(ToolCallFormat::kQwen3Coder);
  o.tools = WeatherTools();
  const std::string text =
      "I'll look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n"
      "</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n"
      "<parameter=ratio>\n0.5\n</parameter>\n<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n"
      "<parameter=tags>\n[\"x\"]\n</parameter>\n<parameter=note>\nnull\n</parameter>\n"
      "<parameter=any>\nseven\n</parameter>\n<parameter=extra>\n42\n</parameter>\n</function>\n"
      "</tool_call>";
  const ParsedMessage m = ExpectSplitInvariant(o, text);
  EXPECT_EQ(m.content, "I'll look.");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "get_weather");
  EXPECT_EQ(m.tool_calls[0].arguments,
            R"({"city": "San Francisco", "days": 3, "metric": true, "ratio": 0.5, )"
            R"("opts": {"a":[1,2]}, "tags": ["x"], "note": null, "any": "seven", "extra": "42"})");
  EXPECT_TRUE(Json::parse(m.tool_calls[0].arguments).is_object());
  ExpectNoPartialTagsInContent(o, text, {"<tool_call>", "<function="});
}

TEST(Qwen3CoderParser, MultilineValuesAndMissingClosingTags) {
  OutputParserOptions o = Options(ToolCallFormat::kQwen3Coder);
  const std::string text =
      "<tool_call>\n<function=write_file>\n<parameter=path>\na.py\n<parameter=content>\n"
      "def f():\n    return 1 < 2\n\n</function>\n</tool_call>\n<function=noop>\n</function>";
  const ParsedMessage m = ExpectSplitInvariant(o, text);
  ASSERT_EQ(m.tool_calls.size(), 2u);
  EXPECT_EQ(m.tool_calls[0], Call("write_file",
                                  "{\"path\": \"a.py\", \"content\": "
                                  "\"def f():\\n    return 1 < 2\\n\"}"));
  EXPECT_EQ(m.tool_calls[1], Call("noop", "{}"));
  EXPECT_EQ(m.content, "");
}

TEST(Qwen3CoderParser, NotACallAndTruncation) {
  OutputParserOptions o = Options(ToolCallFormat::kQwen3Coder);
  ParsedMessage m = ExpectSplitInvariant(o, "a <tool_call> b");
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, "a <tool_call> b");
  m = ExpectSplitInvariant(o, "x <function=bad\nname> y");
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, "x <function=bad\nname> y");
  // Cut inside a value: the call closes with what it has.
  m = ExpectSplitInvariant(o, "<tool_call>\n<function=f>\n<parameter=p>\nhal");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0], Call("f", R"({"p": "hal"})"));
  // Cut inside the function name: text.
  m = ExpectSplitInvariant(o, "<tool_call>\n<function=ge");
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, "<tool_call>\n<function=ge");
}

TEST(Qwen3CoderParser, StreamsOneParameterAtATime) {
  OutputParserOptions o = Options(ToolCallFormat::kQwen3Coder);
  o.tools = WeatherTools();
  OutputParser parser(o);
  OutputPieces p;
  parser.Feed("<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n", &p);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].tool_name, "get_weather");
  EXPECT_EQ(p[0].text, R"({"city": "Rome")");
  p.clear();
  parser.Feed("<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>", &p);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].text, R"(, "days": 2})");
}

TEST(Qwen3CoderParser, TypedParameterValue) {
  using parsers::TypedParameterValue;
  const Json integer = Json{{"type", "integer"}};
  EXPECT_EQ(TypedParameterValue("12", integer), Json(12));
  EXPECT_EQ(TypedParameterValue("3.0", integer), Json(3));
  EXPECT_EQ(TypedParameterValue("twelve", integer), Json("twelve"));
  EXPECT_EQ(TypedParameterValue("12", Json()), Json("12"));
  EXPECT_EQ(TypedParameterValue("false", Json{{"type", "boolean"}}), Json(false));
  EXPECT_EQ(TypedParameterValue("[1", Json{{"type", "array"}}), Json("[1"));
  EXPECT_EQ(
      TypedParameterValue(std::string(100, '[') + std::string(100, ']'), Json{{"type", "array"}}),
      Json(std::string(100, '[') + std::string(100, ']')));  // too deep: a string
  EXPECT_EQ(TypedParameterValue("1e3", Json{{"type", "number"}}), Json(1000.0));
}

// ---- Llama 3 JSON ----

TEST(Llama3JsonParser, OneCall) {
  const std::string text = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}";
  const ParsedMessage m = ExpectSplitInvariant(Options(ToolCallFormat::kLlama3Json), text);
  EXPECT_EQ(m.content, "");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0], Call("get_weather", R"({"city": "Oslo"})"));
}

TEST(Llama3JsonParser, PythonTagAndSeveralCalls) {
  const std::string text =
      "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"parameters\": {\"y\": 2}, "
      "\"name\": \"b\"}";
  const ParsedMessage m = ExpectSplitInvariant(Options(ToolCallFormat::kLlama3Json), text);
  ASSERT_EQ(m.tool_calls.size(), 2u);
  EXPECT_EQ(m.tool_calls[0], Call("a", R"({"x": 1})"));
  EXPECT_EQ(m.tool_calls[1], Call("b", R"({"y":2})"));
  EXPECT_EQ(m.content, "");
}

TEST(Llama3JsonParser, TextAndJsonAnswersAreContent) {
  const OutputParserOptions o = Options(ToolCallFormat::kLlama3Json);
  EXPECT_EQ(ExpectSplitInvariant(o, "The weather is {\"name\": \"x\"}").content,
            "The weather is {\"name\": \"x\"}");
  EXPECT_EQ(ExpectSplitInvariant(o, "{\"answer\": 42} is it").content, "{\"answer\": 42} is it");
  EXPECT_EQ(ExpectSplitInvariant(o, "<|python_tag|>print(1)").content, "<|python_tag|>print(1)");
  EXPECT_EQ(ExpectSplitInvariant(o, "  {\"name\": \"f\", \"param").content,
            "  {\"name\": \"f\", \"param");
  const ParsedMessage m = ExpectSplitInvariant(
      o, "{\"name\": \"f\", \"parameters\": {}, \"extra\": {\"k\": \"}\"}}\n\nThen text.");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0], Call("f", "{}"));
  EXPECT_EQ(m.content, "\n\nThen text.");
}

// ---- scanning helpers ----

TEST(TextScan, CallHead) {
  using parsers::CallHead;
  using parsers::Match;
  using parsers::MatchJsonCallHead;
  CallHead head;
  EXPECT_EQ(MatchJsonCallHead(" { \"name\" : \"a\\\"b\" , \"arguments\" : {", &head), Match::kYes);
  EXPECT_EQ(head.name, "a\"b");
  EXPECT_EQ(MatchJsonCallHead("{\"name\": \"f\", \"argu", &head), Match::kNeedMore);
  EXPECT_EQ(MatchJsonCallHead("{\"name\": \"f\", \"arguments\": \"", &head), Match::kNo);
  EXPECT_EQ(MatchJsonCallHead("{\"name\": \"\", \"arguments\": {", &head), Match::kNo);
  EXPECT_EQ(MatchJsonCallHead("{\"id\": 1", &head), Match::kNo);
  EXPECT_EQ(MatchJsonCallHead("{\"name\": \"" + std::string(2000, 'x'), &head), Match::kNo);
  EXPECT_EQ(parsers::PartialTagSuffix("abc<tool", "<tool_call>"), 5u);
  EXPECT_EQ(parsers::PartialTagSuffix("abc", "<tool_call>"), 0u);
}

// ---- format detection from chat templates ----

ChatTemplate Template(const std::string& source) {
  Result<ChatTemplate> t = ChatTemplate::FromSource(source, nlohmann::json::object());
  EXPECT_TRUE(t.ok()) << t.status().message();
  return std::move(t).value();
}

TEST(DetectOutputFormats, FromTheTemplates) {
  // kestrel-tiny: Qwen-style <tool_call> JSON, no reasoning.
  Result<ChatTemplate> tiny =
      ChatTemplate::FromDirectory(KESTREL_SOURCE_DIR "/models/kestrel-tiny");
  ASSERT_TRUE(tiny.ok()) << tiny.status().message();
  OutputFormats f = DetectOutputFormats(*tiny);
  EXPECT_EQ(f.tool_calls, ToolCallFormat::kHermes);
  EXPECT_FALSE(f.reasoning);

  // The shape of Qwen3-Coder / Qwen3.5 templates.
  f = DetectOutputFormats(Template(R"(
{%- for m in messages %}{%- if m.tool_calls %}{%- for tc in m.tool_calls %}
{{- '<tool_call>\n<function=' + tc.function.name + '>\n' }}
{%- for k, v in tc.function.arguments | items %}{{- '<parameter=' + k + '>\n' + v + '\n</parameter>\n' }}{%- endfor %}
{{- '</function>\n</tool_call>' }}{%- endfor %}{%- else %}{{ m.content }}{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n<think>\n' }}{%- endif %})"));
  EXPECT_EQ(f.tool_calls, ToolCallFormat::kQwen3Coder);
  EXPECT_TRUE(f.reasoning);

  // The shape of Llama 3.1's.
  f = DetectOutputFormats(Template(R"(
{%- for m in messages %}{%- if m.tool_calls %}{%- set tc = m.tool_calls[0].function %}
{{- '{"name": "' + tc.name + '", "parameters": ' + (tc.arguments | tojson) + '}' }}
{%- else %}{{ m.content }}{%- endif %}{%- endfor %})"));
  EXPECT_EQ(f.tool_calls, ToolCallFormat::kLlama3Json);
  EXPECT_FALSE(f.reasoning);

  // Reasoning rendered back in <think>, and a template that rejects the probe.
  f = DetectOutputFormats(Template(R"(
{%- for m in messages %}{%- if m.reasoning_content %}{{ '<think>\n' + m.reasoning_content + '\n</think>\n' }}{%- endif %}{%- endfor %})"));
  EXPECT_EQ(f.tool_calls, ToolCallFormat::kNone);
  EXPECT_TRUE(f.reasoning);
  f = DetectOutputFormats(Template("{{ raise_exception('no tools here') }}"));
  EXPECT_EQ(f.tool_calls, ToolCallFormat::kNone);
  EXPECT_FALSE(f.reasoning);
}

TEST(DetectOutputFormats, RealQwen3Template) {
  Result<ChatTemplate> qwen =
      ChatTemplate::FromDirectory(KESTREL_SOURCE_DIR "/tests/data/npm/qwen3");
  if (!qwen.ok()) GTEST_SKIP() << "tests/data/npm/qwen3 missing (run scripts/setup.sh)";
  const OutputFormats f = DetectOutputFormats(*qwen);
  EXPECT_EQ(f.tool_calls, ToolCallFormat::kHermes);
  EXPECT_TRUE(f.reasoning);
}

TEST(ToolCallFormat, Names) {
  for (ToolCallFormat f : {ToolCallFormat::kNone, ToolCallFormat::kHermes,
                           ToolCallFormat::kQwen3Coder, ToolCallFormat::kLlama3Json}) {
    ToolCallFormat back = ToolCallFormat::kNone;
    EXPECT_TRUE(ParseToolCallFormat(ToolCallFormatName(f), &back));
    EXPECT_EQ(back, f);
  }
  ToolCallFormat f;
  EXPECT_FALSE(ParseToolCallFormat("mistral", &f));
}

}  // namespace
}  // namespace kestrel::server
