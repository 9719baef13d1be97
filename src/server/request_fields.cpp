// Body decoding and the request fields both OpenAI endpoints share.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "core/json_file.h"
#include "engine/stop_matcher.h"
#include "server/openai_request.h"
#include "server/structured_output.h"
#include "tokenizer/unicode.h"

namespace kestrel::server {
namespace {

using detail::TypeName;
using detail::WrongType;

std::string Quoted(const std::string& param) {
  return "'" + param + "'";
}

std::optional<ApiError> ReadNumber(const Json& obj, const char* key, float* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return WrongType(key, "a number", *it);
  *out = static_cast<float>(it->get<double>());
  return std::nullopt;
}

std::optional<ApiError> ReadSeed(const Json& body, GenerationOptions* out) {
  auto it = body.find("seed");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_number_unsigned()) {
    out->sampling.seed = it->get<uint64_t>();
  } else if (it->is_number_integer()) {
    out->sampling.seed = static_cast<uint64_t>(it->get<int64_t>());
  } else {
    std::optional<int64_t> seed;
    if (auto e = detail::ReadInt(body, "seed", "seed", std::numeric_limits<int64_t>::min(),
                                 std::numeric_limits<int64_t>::max(), &seed)) {
      return e;
    }
    out->sampling.seed = static_cast<uint64_t>(*seed);
  }
  out->seed_given = true;
  return std::nullopt;
}

// {"<token id>": bias in [-100, 100], ...}, applied in the order sent.
std::optional<ApiError> ReadLogitBias(const Json& body, SamplingParams* out) {
  auto it = body.find("logit_bias");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return WrongType("logit_bias", "an object", *it);
  for (const auto& [key, value] : it->items()) {
    int64_t id = 0;
    const char* end = key.data() + key.size();
    auto [ptr, ec] = std::from_chars(key.data(), end, id);
    if (key.empty() || ec != std::errc() || ptr != end || id < 0 ||
        id > std::numeric_limits<int32_t>::max()) {
      return BadRequest("'logit_bias' keys must be token ids (non-negative integers), got '" +
                            tok::Utf8Lossy(key) + "'",
                        "logit_bias");
    }
    if (!value.is_number()) {
      return WrongType("logit_bias", "a map of token ids to numbers", value);
    }
    const double bias = value.get<double>();
    if (!(bias >= -100.0 && bias <= 100.0)) {
      return BadRequest(
          "'logit_bias' values must be in [-100, 100], got " + value.dump() + " for token " + key,
          "logit_bias");
    }
    out->logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(bias));
  }
  return std::nullopt;
}

std::optional<ApiError> ReadStop(const Json& body, std::vector<std::string>* out) {
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) {
    out->push_back(it->get<std::string>());
  } else if (it->is_array()) {
    for (size_t i = 0; i < it->size(); ++i) {
      const Json& s = (*it)[i];
      if (!s.is_string()) return WrongType("stop[" + std::to_string(i) + "]", "a string", s);
      out->push_back(s.get<std::string>());
    }
  } else {
    return WrongType("stop", "a string or an array of strings", *it);
  }
  if (Status s = StopMatcher::Validate(*out); !s.ok()) return BadRequest(s.message(), "stop");
  return std::nullopt;
}

std::optional<ApiError> ReadStreamFields(const Json& body, GenerationOptions* out) {
  if (auto e = detail::ReadBool(body, "stream", "stream", &out->stream)) return e;
  auto it = body.find("stream_options");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return WrongType("stream_options", "an object", *it);
  if (!out->stream) {
    return BadRequest("'stream_options' is only allowed when 'stream' is true", "stream_options");
  }
  if (auto e = detail::ReadBool(*it, "include_usage", "stream_options.include_usage",
                               &out->include_usage)) {
    return e;
  }
  bool continuous = false;
  if (auto e = detail::ReadBool(*it, "continuous_usage_stats",
                               "stream_options.continuous_usage_stats", &continuous)) {
    return e;
  }
  out->continuous_usage = continuous && out->include_usage;  // as vLLM: only with include_usage
  return std::nullopt;
}

}  // namespace

namespace detail {

ApiError WrongType(const std::string& param, const char* expected, const Json& got) {
  return BadRequest("'" + param + "' must be " + expected + ", got " + TypeName(got), param);
}

std::string Index(const std::string& base, size_t i) {
  return base + "[" + std::to_string(i) + "]";
}

ApiError Required(const std::string& param) {
  return BadRequest("'" + param + "' is required", param);
}

bool ToolChoiceModeOf(const std::string& text, ToolChoice::Mode* mode) {
  if (text == "auto") {
    *mode = ToolChoice::Mode::kAuto;
  } else if (text == "none") {
    *mode = ToolChoice::Mode::kNone;
  } else if (text == "required") {
    *mode = ToolChoice::Mode::kRequired;
  } else {
    return false;
  }
  return true;
}

const char* TypeName(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::object:
      return "an object";
    case Json::value_t::number_float:
      return "a number";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "an integer";
    default:
      return "an unsupported value";
  }
}

std::optional<ApiError> ReadBool(const Json& obj, const char* key, const std::string& param,
                                 bool* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return WrongType(param, "a boolean", *it);
  *out = it->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> IntValue(const Json& v, const std::string& param, int64_t min_value,
                                 int64_t max_value, int64_t* out) {
  if (!v.is_number()) return WrongType(param, "an integer", v);
  int64_t value = 0;
  bool in_range = true;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    in_range = u <= static_cast<uint64_t>(max_value);
    value = in_range ? static_cast<int64_t>(u) : max_value;
  } else if (v.is_number_integer()) {
    value = v.get<int64_t>();
  } else {
    const double d = v.get<double>();
    if (std::floor(d) != d) {
      return BadRequest(Quoted(param) + " must be an integer, got " + v.dump(), param);
    }
    // 2^63 itself is not representable as int64: compare in double with a strict upper bound.
    in_range = d >= static_cast<double>(min_value) && d < 9223372036854775808.0 &&
               d <= static_cast<double>(max_value);
    value = in_range ? static_cast<int64_t>(d) : 0;
  }
  if (!in_range || value < min_value || value > max_value) {
    return BadRequest(Quoted(param) + " must be between " + std::to_string(min_value) + " and " +
                          std::to_string(max_value) + ", got " + v.dump(),
                      param);
  }
  *out = value;
  return std::nullopt;
}

std::optional<ApiError> ReadInt(const Json& obj, const char* key, const std::string& param,
                                int64_t min_value, int64_t max_value, std::optional<int64_t>* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  int64_t value = 0;
  if (auto e = IntValue(*it, param, min_value, max_value, &value)) return e;
  *out = value;
  return std::nullopt;
}

std::optional<ApiError> ReadString(const Json& obj, const char* key, const std::string& param,
                                   std::optional<std::string>* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) return WrongType(param, "a string", *it);
  *out = it->get<std::string>();
  return std::nullopt;
}

std::optional<ApiError> ParseCommonFields(const Json& body, const ParseContext& ctx,
                                          GenerationOptions* out) {
  std::optional<std::string> model;
  if (auto e = ReadString(body, "model", "model", &model)) return e;
  if (model && !model->empty()) {
    const auto& names = ctx.accepted_models;
    if (std::find(names.begin(), names.end(), *model) == names.end()) {
      return ModelNotFound(tok::Utf8Lossy(*model));
    }
    out->model = *model;
  }

  SamplingParams& p = out->sampling;
  p = ctx.defaults;
  for (auto [key, field] : {std::pair{"temperature", &p.temperature},
                            {"top_p", &p.top_p},
                            {"min_p", &p.min_p},
                            {"presence_penalty", &p.presence_penalty},
                            {"frequency_penalty", &p.frequency_penalty},
                            {"repetition_penalty", &p.repetition_penalty}}) {
    if (auto e = ReadNumber(body, key, field)) return e;
  }
  std::optional<int64_t> top_k;
  if (auto e = ReadInt(body, "top_k", "top_k", std::numeric_limits<int32_t>::min(),
                       std::numeric_limits<int32_t>::max(), &top_k)) {
    return e;
  }
  if (top_k) p.top_k = *top_k < 0 ? 0 : static_cast<int32_t>(*top_k);
  if (auto e = ReadLogitBias(body, &p)) return e;
  if (auto e = ReadSeed(body, out)) return e;

  constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();
  std::optional<int64_t> max_tokens, max_completion_tokens;
  if (auto e = ReadInt(body, "max_tokens", "max_tokens", 1, kMaxInt, &max_tokens)) return e;
  if (auto e = ReadInt(body, "max_completion_tokens", "max_completion_tokens", 1, kMaxInt,
                       &max_completion_tokens)) {
    return e;
  }
  out->max_tokens = max_completion_tokens ? max_completion_tokens : max_tokens;

  if (auto e = ReadStop(body, &out->stop)) return e;
  std::optional<int64_t> n;
  if (auto e = ReadInt(body, "n", "n", 1, kMaxChoices, &n)) return e;
  out->n = static_cast<int32_t>(n.value_or(1));
  if (auto e = ReadStreamFields(body, out)) return e;
  if (auto e = ReadBool(body, "ignore_eos", "ignore_eos", &out->ignore_eos)) return e;
  // response_format / structured_outputs: compiled by the handler (AttachGrammar).
  if (auto e = ParseOutputConstraint(body, &out->constraint)) return e;
  std::optional<std::string> user;
  return ReadString(body, "user", "user", &user);
}

std::optional<ApiError> ValidateSampling(const SamplingParams& params, int32_t vocab_size) {
  Status s = ValidateSamplingParams(params, vocab_size);
  if (s.ok()) return std::nullopt;
  // The message starts with the OpenAI field it is about ("top_p must be in (0, 1] ...").
  const std::string& m = s.message();
  return BadRequest(m, m.substr(0, m.find(' ')));
}

}  // namespace detail

std::optional<ApiError> ParseJsonBody(std::string_view body, Json* out) {
  if (body.empty()) return BadRequest("The request body is empty; expected a JSON object");
  if (!tok::IsValidUtf8(body)) return BadRequest("The request body is not valid UTF-8");
  if (JsonNestingDepth(body, kMaxJsonDepth) > kMaxJsonDepth) {
    return BadRequest("The request body nests arrays/objects deeper than " +
                      std::to_string(kMaxJsonDepth) + " levels");
  }
  Json j;
  try {
    j = Json::parse(body);  // the exception carries the position of the error
  } catch (const Json::exception& e) {
    return BadRequest(std::string("Malformed JSON in the request body: ") + e.what());
  }
  if (!j.is_object()) {
    return BadRequest(std::string("The request body must be a JSON object, got ") + TypeName(j));
  }
  *out = std::move(j);
  return std::nullopt;
}

std::variant<int32_t, ApiError> ResolveMaxTokens(int64_t n_prompt_tokens,
                                                 std::optional<int64_t> max_tokens,
                                                 int64_t context_tokens,
                                                 const std::string& prompt_param) {
  const std::string limit =
      "This model's maximum context length is " + std::to_string(context_tokens) + " tokens. ";
  if (n_prompt_tokens >= context_tokens) {
    return BadRequest(limit + "However, your " + prompt_param + " resulted in " +
                          std::to_string(n_prompt_tokens) +
                          " tokens, which leaves no room for the completion. Please reduce the "
                          "length of the " +
                          prompt_param + ".",
                      prompt_param, "context_length_exceeded");
  }
  const int64_t room = context_tokens - n_prompt_tokens;
  if (!max_tokens) {
    return static_cast<int32_t>(std::min<int64_t>(room, std::numeric_limits<int32_t>::max()));
  }
  if (*max_tokens > room) {
    // max_tokens may be close to 2^63: the sum is only written when it cannot overflow.
    const std::string requested =
        *max_tokens > std::numeric_limits<int64_t>::max() - n_prompt_tokens
            ? "more than " + std::to_string(context_tokens)
            : std::to_string(n_prompt_tokens + *max_tokens);
    return BadRequest(limit + "However, you requested " + requested + " tokens (" +
                          std::to_string(n_prompt_tokens) + " in the " + prompt_param + ", " +
                          std::to_string(*max_tokens) +
                          " in the completion). Please reduce the length of the " + prompt_param +
                          " or completion.",
                      prompt_param, "context_length_exceeded");
  }
  return static_cast<int32_t>(*max_tokens);
}

}  // namespace kestrel::server
