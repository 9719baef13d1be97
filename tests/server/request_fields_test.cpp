// Body decoding, the fields both endpoints share, and the context-length budget.
#include <gtest/gtest.h>

#include <string>

#include "server/openai_request.h"

namespace kestrel::server {
namespace {

ParseContext Context() {
  ParseContext ctx;
  ctx.defaults.temperature = 0.7f;
  ctx.defaults.top_p = 0.95f;
  ctx.defaults.top_k = 20;
  ctx.vocab_size = 1000;
  ctx.accepted_models = {"served-name", "model-dir"};
  return ctx;
}

// Parses {"prompt": "x", <extra fields>} as a completion request.
std::optional<ApiError> ParseWith(const std::string& extra_fields, CompletionRequest* out) {
  const std::string text =
      "{\"prompt\": \"x\"" + (extra_fields.empty() ? "" : ", " + extra_fields) + "}";
  Json body;
  if (auto e = ParseJsonBody(text, &body)) return e;
  return ParseCompletionRequest(body, Context(), out);
}

std::optional<ApiError> ParseWith(const std::string& extra_fields) {
  CompletionRequest req;
  return ParseWith(extra_fields, &req);
}

void ExpectError(const std::string& fields, int status, const std::string& param) {
  std::optional<ApiError> e = ParseWith(fields);
  ASSERT_TRUE(e.has_value()) << fields;
  EXPECT_EQ(e->status, status) << fields << ": " << e->message;
  EXPECT_EQ(e->param, param) << fields << ": " << e->message;
  EXPECT_EQ(e->type, "invalid_request_error") << fields;
  EXPECT_FALSE(e->message.empty());
}

TEST(ParseJsonBody, AcceptsAnObject) {
  Json j;
  EXPECT_FALSE(ParseJsonBody(R"({"a": [1, {"b": "c"}]})", &j).has_value());
  EXPECT_EQ(j["a"][1]["b"], "c");
}

TEST(ParseJsonBody, RejectsBadBodies) {
  Json j;
  for (std::string body :
       {std::string(""), std::string("{"), std::string("{\"a\": }"), std::string("[1, 2]"),
        std::string("\"text\""), std::string("null"), std::string("{\"a\": 1} trailing")}) {
    std::optional<ApiError> e = ParseJsonBody(body, &j);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->status, 400) << body;
    EXPECT_EQ(e->type, "invalid_request_error");
  }
  std::optional<ApiError> malformed = ParseJsonBody("{\"a\": 1,}", &j);
  ASSERT_TRUE(malformed.has_value());
  EXPECT_NE(malformed->message.find("Malformed JSON"), std::string::npos);
}

TEST(ParseJsonBody, RejectsInvalidUtf8) {
  Json j;
  for (std::string bad : {std::string("{\"a\": \"\xff\"}"), std::string("{\"a\": \"\xc3\"}"),
                          std::string("{\"a\": \"\xed\xa0\x80\"}"),  // UTF-16 surrogate
                          std::string("{\"a\": \"\xc0\xaf\"}")}) {   // overlong '/'
    std::optional<ApiError> e = ParseJsonBody(bad, &j);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->status, 400);
    EXPECT_NE(e->message.find("UTF-8"), std::string::npos) << e->message;
  }
  EXPECT_FALSE(ParseJsonBody("{\"a\": \"h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80\"}", &j));
}

TEST(ParseJsonBody, LimitsNesting) {
  Json j;
  auto nested = [](int depth) {
    return "{\"a\": " + std::string(depth - 1, '[') + std::string(depth - 1, ']') + "}";
  };
  EXPECT_FALSE(ParseJsonBody(nested(kMaxJsonDepth), &j).has_value());
  std::optional<ApiError> e = ParseJsonBody(nested(kMaxJsonDepth + 1), &j);
  ASSERT_TRUE(e.has_value());
  EXPECT_NE(e->message.find("deeper"), std::string::npos);
  // Brackets inside strings do not count.
  EXPECT_FALSE(ParseJsonBody("{\"a\": \"" + std::string(500, '[') + "\\\"{{\"}", &j));
}

TEST(CommonFields, OmittedFieldsTakeTheModelDefaults) {
  CompletionRequest req;
  ASSERT_FALSE(ParseWith("", &req).has_value());
  const GenerationOptions& o = req.options;
  EXPECT_FLOAT_EQ(o.sampling.temperature, 0.7f);
  EXPECT_FLOAT_EQ(o.sampling.top_p, 0.95f);
  EXPECT_EQ(o.sampling.top_k, 20);
  EXPECT_FALSE(o.seed_given);
  EXPECT_FALSE(o.max_tokens.has_value());
  EXPECT_TRUE(o.stop.empty());
  EXPECT_FALSE(o.stream);
  EXPECT_FALSE(o.include_usage);
  EXPECT_FALSE(o.sampling.logprobs);
  EXPECT_EQ(o.model, "");
}

TEST(CommonFields, NullIsTheSameAsOmitted) {
  CompletionRequest req;
  ASSERT_FALSE(ParseWith(R"("temperature": null, "top_p": null, "max_tokens": null,
      "stop": null, "seed": null, "stream": null, "logit_bias": null, "n": null, "model": null,
      "user": null, "response_format": null, "logprobs": null)",
                         &req)
                   .has_value());
  EXPECT_FLOAT_EQ(req.options.sampling.temperature, 0.7f);
  EXPECT_FALSE(req.options.max_tokens.has_value());
}

TEST(CommonFields, ReadsEveryField) {
  CompletionRequest req;
  ASSERT_FALSE(ParseWith(R"("model": "served-name", "temperature": 0, "top_p": 0.5,
      "top_k": 7, "min_p": 0.1, "presence_penalty": 1.5, "frequency_penalty": -0.5,
      "repetition_penalty": 1.1, "seed": 42, "max_tokens": 12, "stop": ["a", "bc"], "n": 1,
      "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true,
      "user": "u", "logit_bias": {"5": -100, "7": 2.5}, "unknown_field": {"x": 1})",
                         &req)
                   .has_value());
  const GenerationOptions& o = req.options;
  EXPECT_EQ(o.model, "served-name");
  EXPECT_FLOAT_EQ(o.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(o.sampling.top_p, 0.5f);
  EXPECT_EQ(o.sampling.top_k, 7);
  EXPECT_FLOAT_EQ(o.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(o.sampling.presence_penalty, 1.5f);
  EXPECT_FLOAT_EQ(o.sampling.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(o.sampling.repetition_penalty, 1.1f);
  EXPECT_TRUE(o.seed_given);
  EXPECT_EQ(o.sampling.seed, 42u);
  EXPECT_EQ(o.max_tokens, 12);
  EXPECT_EQ(o.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_TRUE(o.stream);
  EXPECT_TRUE(o.include_usage);
  EXPECT_FALSE(o.continuous_usage);
  EXPECT_TRUE(o.ignore_eos);
  ASSERT_EQ(o.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(o.sampling.logit_bias[0], (std::pair<int32_t, float>{5, -100.0f}));
  EXPECT_EQ(o.sampling.logit_bias[1], (std::pair<int32_t, float>{7, 2.5f}));
}

TEST(CommonFields, SmallConversions) {
  CompletionRequest req;
  ASSERT_FALSE(ParseWith(R"("stop": "END", "top_k": -1, "max_tokens": 5.0, "seed": -1)", &req));
  EXPECT_EQ(req.options.stop, (std::vector<std::string>{"END"}));
  EXPECT_EQ(req.options.sampling.top_k, 0);  // -1 disables top-k
  EXPECT_EQ(req.options.max_tokens, 5);
  EXPECT_EQ(req.options.sampling.seed, ~uint64_t{0});
  CompletionRequest big_seed;
  ASSERT_FALSE(ParseWith(R"("seed": 18446744073709551615)", &big_seed));
  EXPECT_EQ(big_seed.options.sampling.seed, ~uint64_t{0});
}

TEST(CommonFields, MaxCompletionTokensWinsOverMaxTokens) {
  CompletionRequest req;
  ASSERT_FALSE(ParseWith(R"("max_tokens": 10, "max_completion_tokens": 20)", &req));
  EXPECT_EQ(req.options.max_tokens, 20);
}

TEST(CommonFields, ModelNames) {
  EXPECT_FALSE(ParseWith(R"("model": "model-dir")").has_value());
  EXPECT_FALSE(ParseWith(R"("model": "")").has_value());
  std::optional<ApiError> e = ParseWith(R"("model": "gpt-4o")");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->status, 404);
  EXPECT_EQ(e->code, "model_not_found");
  EXPECT_EQ(e->param, "model");
  ExpectError(R"("model": 5)", 400, "model");
}

TEST(CommonFields, WrongTypesNameTheField) {
  ExpectError(R"("temperature": "hot")", 400, "temperature");
  ExpectError(R"("top_p": [1])", 400, "top_p");
  ExpectError(R"("min_p": true)", 400, "min_p");
  ExpectError(R"("presence_penalty": {})", 400, "presence_penalty");
  ExpectError(R"("frequency_penalty": "1")", 400, "frequency_penalty");
  ExpectError(R"("repetition_penalty": false)", 400, "repetition_penalty");
  ExpectError(R"("top_k": "5")", 400, "top_k");
  ExpectError(R"("top_k": 5.5)", 400, "top_k");
  ExpectError(R"("seed": "42")", 400, "seed");
  ExpectError(R"("seed": 1.5)", 400, "seed");
  ExpectError(R"("max_tokens": "10")", 400, "max_tokens");
  ExpectError(R"("max_tokens": 10.5)", 400, "max_tokens");
  ExpectError(R"("max_completion_tokens": [])", 400, "max_completion_tokens");
  ExpectError(R"("stop": 5)", 400, "stop");
  ExpectError(R"("stop": ["a", 1])", 400, "stop[1]");
  ExpectError(R"("n": "1")", 400, "n");
  ExpectError(R"("stream": "yes")", 400, "stream");
  ExpectError(R"("stream": true, "stream_options": true)", 400, "stream_options");
  ExpectError(R"("stream": true, "stream_options": {"include_usage": 1})", 400,
              "stream_options.include_usage");
  ExpectError(R"("stream": true, "stream_options": {"continuous_usage_stats": "on"})", 400,
              "stream_options.continuous_usage_stats");
  ExpectError(R"("ignore_eos": 1)", 400, "ignore_eos");
  ExpectError(R"("logit_bias": [1, 2])", 400, "logit_bias");
  ExpectError(R"("logit_bias": {"5": "up"})", 400, "logit_bias");
  ExpectError(R"("user": 5)", 400, "user");
  ExpectError(R"("response_format": "json")", 400, "response_format");
}

TEST(CommonFields, ContinuousUsageStatsOnlyWithIncludeUsage) {
  CompletionRequest req;
  ASSERT_FALSE(ParseWith(R"("stream": true, "stream_options": {"include_usage": true,
      "continuous_usage_stats": true})",
                         &req)
                   .has_value());
  EXPECT_TRUE(req.options.continuous_usage);
  CompletionRequest without;
  ASSERT_FALSE(ParseWith(R"("stream": true, "stream_options": {"continuous_usage_stats": true})",
                         &without)
                   .has_value());
  EXPECT_FALSE(without.options.continuous_usage);  // as vLLM: ignored without include_usage
}

TEST(CommonFields, OutOfRangeValuesNameTheField) {
  ExpectError(R"("temperature": -0.5)", 400, "temperature");
  ExpectError(R"("temperature": 1e300)", 400, "temperature");
  ExpectError(R"("top_p": 0)", 400, "top_p");
  ExpectError(R"("top_p": 1.5)", 400, "top_p");
  ExpectError(R"("min_p": 2)", 400, "min_p");
  ExpectError(R"("repetition_penalty": 0)", 400, "repetition_penalty");
  ExpectError(R"("presence_penalty": 2.5)", 400, "presence_penalty");
  ExpectError(R"("frequency_penalty": -3)", 400, "frequency_penalty");
  ExpectError(R"("top_k": 3000000000)", 400, "top_k");
  ExpectError(R"("max_tokens": 0)", 400, "max_tokens");
  ExpectError(R"("max_tokens": -5)", 400, "max_tokens");
  ExpectError(R"("max_completion_tokens": 0)", 400, "max_completion_tokens");
  ExpectError(R"("n": 17)", 400, "n");
  ExpectError(R"("n": 0)", 400, "n");
  ExpectError(R"("logit_bias": {"abc": 1})", 400, "logit_bias");
  ExpectError(R"("logit_bias": {"-1": 1})", 400, "logit_bias");
  ExpectError(R"("logit_bias": {"5": 101})", 400, "logit_bias");
  ExpectError(R"("logit_bias": {"5": -100.5})", 400, "logit_bias");
  ExpectError(R"("logit_bias": {"1000": 1})", 400, "logit_bias");  // vocabulary is 1000
  ExpectError(R"("stream_options": {"include_usage": true})", 400, "stream_options");
  ExpectError(R"("response_format": {"type": "yaml"})", 400, "response_format.type");
  ExpectError(R"("response_format": {"type": "json_schema"})", 400, "response_format.json_schema");
  ExpectError(R"("structured_outputs": {"regex": 5})", 400, "structured_outputs.regex");
  ExpectError(R"("structured_outputs": {"regex": "a", "choice": ["b"]})", 400,
              "structured_outputs");
  ExpectError(R"("structured_outputs": {"xml": "a"})", 400, "structured_outputs.xml");
  ExpectError(R"("response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"})",
              400, "structured_outputs");
  EXPECT_FALSE(ParseWith(R"("response_format": {"type": "text"})").has_value());
  EXPECT_FALSE(ParseWith(R"("response_format": {"type": "json_object"})").has_value());
  EXPECT_FALSE(ParseWith(R"("response_format": {"type": "json_schema", "json_schema":
                         {"name": "x", "schema": {"type": "object"}}})")
                   .has_value());
  EXPECT_FALSE(ParseWith(R"("structured_outputs": {"choice": ["a", "b"]})").has_value());
}

TEST(CommonFields, StopStringsFollowTheMatcherLimits) {
  ExpectError(R"("stop": [""])", 400, "stop");
  ExpectError(R"("stop": "")", 400, "stop");
  ExpectError("\"stop\": \"" + std::string(1025, 'x') + "\"", 400, "stop");
  std::string many = "\"stop\": [";
  for (int i = 0; i < 65; ++i) many += std::string(i ? "," : "") + "\"s" + std::to_string(i) + "\"";
  ExpectError(many + "]", 400, "stop");
  // More than OpenAI's 4 is allowed, up to the matcher's limit.
  EXPECT_FALSE(ParseWith(R"("stop": ["a", "b", "c", "d", "e", "f"])").has_value());
}

TEST(ResolveMaxTokens, DefaultsToTheRestOfTheContext) {
  auto r = ResolveMaxTokens(100, std::nullopt, 2048, "prompt");
  ASSERT_TRUE(std::holds_alternative<int32_t>(r));
  EXPECT_EQ(std::get<int32_t>(r), 1948);
}

TEST(ResolveMaxTokens, AcceptsWhatFits) {
  auto r = ResolveMaxTokens(100, 1948, 2048, "prompt");
  ASSERT_TRUE(std::holds_alternative<int32_t>(r));
  EXPECT_EQ(std::get<int32_t>(r), 1948);
}

TEST(ResolveMaxTokens, RefusesWhatDoesNotFit) {
  for (auto [prompt, max_tokens] : {std::pair<int64_t, std::optional<int64_t>>{2048, std::nullopt},
                                    {3000, std::nullopt},
                                    {100, 1949},
                                    {100, INT64_MAX}}) {
    auto r = ResolveMaxTokens(prompt, max_tokens, 2048, "messages");
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << prompt;
    const ApiError& e = std::get<ApiError>(r);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "context_length_exceeded");
    EXPECT_EQ(e.param, "messages");
    EXPECT_NE(e.message.find("2048"), std::string::npos) << e.message;
  }
}

}  // namespace
}  // namespace kestrel::server
