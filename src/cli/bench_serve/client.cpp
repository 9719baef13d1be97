#include "cli/bench_serve/client.h"

#include <httplib.h>

#include <algorithm>
#include <cmath>

#include "cli/bench_serve/stats.h"

namespace kestrel::bench {

using nlohmann::json;

Result<ServerUrl> ParseServerUrl(const std::string& url) {
  const size_t scheme_end = url.find("://");
  const std::string scheme = scheme_end == std::string::npos ? "" : url.substr(0, scheme_end);
  if (scheme != "http" && scheme != "https") {
    return InvalidArgument("--url must start with http:// or https://, got '" + url + "'");
  }
  const size_t host_begin = scheme_end + 3;
  const size_t path_begin = std::min(url.find('/', host_begin), url.size());
  if (path_begin == host_begin) return InvalidArgument("--url has no host: '" + url + "'");
  ServerUrl out;
  out.text = url;
  out.origin = url.substr(0, path_begin);
  out.prefix = url.substr(path_begin);
  while (!out.prefix.empty() && out.prefix.back() == '/') out.prefix.pop_back();
  if (out.prefix.size() >= 3 && out.prefix.compare(out.prefix.size() - 3, 3, "/v1") == 0) {
    out.prefix.resize(out.prefix.size() - 3);
  }
  return out;
}

const char* EndpointPath(Endpoint endpoint) {
  return endpoint == Endpoint::kChat ? "/v1/chat/completions" : "/v1/completions";
}

std::string RequestBody(const RequestSpec& spec, const BodyOptions& options) {
  json body = json::object();
  if (!options.model.empty()) body["model"] = options.model;
  if (options.endpoint == Endpoint::kChat) {
    json messages = json::array();
    for (const Message& m : spec.messages)
      messages.push_back({{"role", m.role}, {"content", m.content}});
    body["messages"] = std::move(messages);
  } else {
    body["prompt"] = CompletionPrompt(spec.messages);
  }
  body["max_tokens"] = spec.max_tokens;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (options.continuous_usage) body["stream_options"]["continuous_usage_stats"] = true;
  if (options.ignore_eos) {
    // Extensions (vLLM, SGLang, Kestrel): generate exactly max_tokens. Servers that ignore them
    // are measured all the same: token counts come from usage.
    body["ignore_eos"] = true;
    body["min_tokens"] = spec.max_tokens;
  }
  for (auto it = options.extra.begin(); it != options.extra.end(); ++it)
    body[it.key()] = it.value();
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

const char* OutcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kOk:
      return "ok";
    case Outcome::kHttpError:
      return "http_error";
    case Outcome::kRateLimited:
      return "rate_limited";
    case Outcome::kConnectionError:
      return "connection_error";
    case Outcome::kStreamError:
      return "stream_error";
  }
  return "?";
}

namespace {

// One line of at most 200 bytes: the OpenAI error message when the body has one.
std::string ShortError(const std::string& body) {
  std::string text = body;
  json j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error")) {
    const json& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) {
      text = e["message"].get<std::string>();
    } else if (e.is_string()) {
      text = e.get<std::string>();
    }
  }
  std::replace(text.begin(), text.end(), '\n', ' ');
  if (text.size() > 200) text = text.substr(0, 200) + "...";
  return text;
}

bool NonEmptyString(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() && !it->get_ref<const std::string&>().empty();
}

}  // namespace

void StreamRecorder::OnBytes(std::string_view bytes, double t) {
  events_.clear();
  parser_.Feed(bytes, &events_);
  for (const SseEvent& e : events_) OnEvent(e, t);
}

void StreamRecorder::Finish(double t) {
  events_.clear();
  parser_.Finish(&events_);
  for (const SseEvent& e : events_) OnEvent(e, t);
  record_->end_s = t;
  if (record_->outcome == Outcome::kOk && !saw_done_ && !saw_finish_reason_) {
    record_->outcome = Outcome::kStreamError;
    record_->error = "the stream ended before a finish_reason or [DONE]";
  }
}

void StreamRecorder::OnEvent(const SseEvent& event, double t) {
  if (event.data == "[DONE]") {
    saw_done_ = true;
    return;
  }
  auto stream_error = [this](const std::string& message) {
    if (record_->outcome != Outcome::kOk) return;
    record_->outcome = Outcome::kStreamError;
    record_->error = message;
  };
  const json j = json::parse(event.data, nullptr, false);
  if (!j.is_object()) {
    stream_error("a stream event is not a JSON object: " + ShortError(event.data));
    return;
  }
  if (j.contains("error")) {
    stream_error("error event: " + ShortError(event.data));
    return;
  }
  bool content = false;
  bool has_choices = false;
  if (auto choices = j.find("choices"); choices != j.end() && choices->is_array()) {
    has_choices = !choices->empty();
    for (const json& choice : *choices) {
      if (!choice.is_object()) continue;
      // Chat deltas carry content (or reasoning, which is output tokens as well); completions
      // carry text.
      if (auto delta = choice.find("delta"); delta != choice.end() && delta->is_object()) {
        content = content || NonEmptyString(*delta, "content") ||
                  NonEmptyString(*delta, "reasoning_content") ||
                  NonEmptyString(*delta, "reasoning");
      }
      content = content || NonEmptyString(choice, "text");
      if (auto fr = choice.find("finish_reason"); fr != choice.end() && !fr->is_null()) {
        saw_finish_reason_ = true;
      }
    }
  }
  if (content) record_->content_times_s.push_back(t);
  if (auto usage = j.find("usage"); usage != j.end() && usage->is_object()) {
    auto read = [&](const char* key, int64_t* out) {
      auto it = usage->find(key);
      if (it == usage->end() || !it->is_number_integer()) return false;
      *out = it->get<int64_t>();
      return true;
    };
    if (read("completion_tokens", &record_->usage_output_tokens)) {
      record_->usage_present = true;
      // A chunk of the choices with the usage so far (not the final usage-only chunk).
      const int64_t before = record_->token_counts.empty() ? 0 : record_->token_counts.back();
      if (has_choices && record_->usage_output_tokens > before) {
        record_->token_times_s.push_back(t);
        record_->token_counts.push_back(record_->usage_output_tokens);
      }
    }
    read("prompt_tokens", &record_->usage_prompt_tokens);
  }
}

std::vector<double> RequestRecord::InterTokenLatencies() const {
  if (token_times_s.empty()) return SplitInterTokenLatencies(content_times_s, output_tokens());
  std::vector<double> out;
  for (size_t i = 1; i < token_times_s.size(); ++i) {
    const int64_t k = token_counts[i] - token_counts[i - 1];
    const double gap = token_times_s[i] - token_times_s[i - 1];
    out.insert(out.end(), static_cast<size_t>(k), gap / static_cast<double>(k));
  }
  return out;
}

double RequestRecord::TokensArrivedBetween(double from, double to) const {
  if (!token_times_s.empty()) {
    double tokens = 0;
    for (size_t i = 0; i < token_times_s.size(); ++i) {
      if (token_times_s[i] < from || token_times_s[i] > to) continue;
      tokens += static_cast<double>(token_counts[i] - (i > 0 ? token_counts[i - 1] : 0));
    }
    return tokens;
  }
  if (content_times_s.empty()) return 0;
  const auto in = std::count_if(content_times_s.begin(), content_times_s.end(),
                                [&](double t) { return t >= from && t <= to; });
  return static_cast<double>(output_tokens()) * static_cast<double>(in) /
         static_cast<double>(content_times_s.size());
}

StreamClient::StreamClient(const ServerUrl& url, const std::string& api_key, double timeout_s)
    : client_(std::make_unique<httplib::Client>(url.origin)),
      prefix_(url.prefix),
      api_key_(api_key) {
  const auto sec = static_cast<time_t>(timeout_s);
  const auto usec = static_cast<time_t>((timeout_s - static_cast<double>(sec)) * 1e6);
  client_->set_connection_timeout(std::min<time_t>(sec, 10), usec);
  client_->set_read_timeout(sec, usec);
  client_->set_write_timeout(sec, usec);
  client_->set_keep_alive(true);
  client_->set_decompress(false);
  // Headers and body go out in separate writes: without TCP_NODELAY the body waits for the
  // server's delayed ACK (~40 ms on Linux), which would be counted as time to first token.
  client_->set_tcp_nodelay(true);
}

StreamClient::~StreamClient() = default;

RequestRecord StreamClient::Stream(const std::string& path, const std::string& body,
                                   Clock::time_point epoch) {
  RequestRecord record;
  auto now_s = [epoch] { return std::chrono::duration<double>(Clock::now() - epoch).count(); };
  StreamRecorder recorder(&record);
  int status = 0;
  std::string error_body;

  httplib::Request req;
  req.method = "POST";
  req.path = prefix_ + path;
  req.headers = {{"Accept", "text/event-stream"}, {"Accept-Encoding", "identity"}};
  if (!api_key_.empty()) req.headers.emplace("Authorization", "Bearer " + api_key_);
  req.headers.emplace("Content-Type", "application/json");
  req.body = body;
  req.response_handler = [&status](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (status == 200) {
      recorder.OnBytes(std::string_view(data, n), now_s());
    } else if (error_body.size() < 4096) {
      error_body.append(data, std::min(n, 4096 - error_body.size()));
    }
    return true;
  };

  record.start_s = now_s();
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent = client_->send(req, res, err);
  const double end = now_s();
  record.end_s = end;
  if (status == 0) {
    record.outcome = Outcome::kConnectionError;
    record.error = httplib::to_string(err) + " error";
    return record;
  }
  record.http_status = status;
  if (status != 200) {
    record.outcome = status == 429 ? Outcome::kRateLimited : Outcome::kHttpError;
    record.error = "HTTP " + std::to_string(status) + ": " + ShortError(error_body);
    return record;
  }
  recorder.Finish(end);
  if (!sent) {
    record.outcome = Outcome::kConnectionError;
    record.error = "the stream broke off: " + httplib::to_string(err);
  }
  return record;
}

Result<json> StreamClient::GetJson(const std::string& path) {
  httplib::Headers headers;
  if (!api_key_.empty()) headers.emplace("Authorization", "Bearer " + api_key_);
  httplib::Result r = client_->Get(prefix_ + path, headers);
  if (!r) {
    return Unavailable("no answer to GET " + prefix_ + path + " (" + httplib::to_string(r.error()) +
                       " error)");
  }
  if (r->status != 200) {
    return Unavailable("GET " + prefix_ + path + " answered HTTP " + std::to_string(r->status) +
                       (r->body.empty() ? "" : ": " + ShortError(r->body)));
  }
  json j = json::parse(r->body, nullptr, false);
  if (j.is_discarded()) return Unavailable("GET " + prefix_ + path + " did not answer JSON");
  return j;
}

Result<std::string> DiscoverModel(const ServerUrl& url, const std::string& api_key) {
  StreamClient client(url, api_key, 30);
  Result<json> models = client.GetJson("/v1/models");
  if (!models.ok()) return models.status().With(url.text + ": ");
  const json& data = models->contains("data") ? (*models)["data"] : json();
  if (!data.is_array() || data.empty() || !data[0].is_object() || !data[0].contains("id") ||
      !data[0]["id"].is_string()) {
    return Unavailable(url.text + ": GET /v1/models lists no model; pass --model NAME");
  }
  return data[0]["id"].get<std::string>();
}

}  // namespace kestrel::bench
