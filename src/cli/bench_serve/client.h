// The HTTP side of `kestrel bench-serve`: one streamed completion request against any
// OpenAI-compatible server, timed chunk by chunk as the bytes arrive.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_serve/sse.h"
#include "cli/bench_serve/workload.h"
#include "core/status.h"

namespace httplib {
class Client;
}

namespace kestrel::bench {

using Clock = std::chrono::steady_clock;

// "http://host:port[/prefix][/v1]" split into what the HTTP client connects to and the path
// prefix the API lives under (a trailing "/v1" is dropped: the endpoints add it).
struct ServerUrl {
  std::string origin;  // scheme://host[:port]
  std::string prefix;  // "" or "/some/path", never ending in '/'
  std::string text;    // as given
};

Result<ServerUrl> ParseServerUrl(const std::string& url);

enum class Endpoint { kChat, kCompletions };

const char* EndpointPath(Endpoint endpoint);  // "/v1/chat/completions" or "/v1/completions"

struct BodyOptions {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;
  bool ignore_eos = true;                           // send ignore_eos and min_tokens = max_tokens
  // Ask for stream_options.continuous_usage_stats (vLLM, SGLang, Kestrel): usage in every chunk,
  // so each chunk's token count is known (servers without it stream as before).
  bool continuous_usage = true;
  nlohmann::json extra = nlohmann::json::object();  // merged last (--extra-body)
};

// The JSON body of one streamed request.
std::string RequestBody(const RequestSpec& spec, const BodyOptions& options);

enum class Outcome { kOk, kHttpError, kRateLimited, kConnectionError, kStreamError };

const char* OutcomeName(Outcome outcome);

// One request as the client saw it. Times are seconds since the run's epoch.
struct RequestRecord {
  Outcome outcome = Outcome::kOk;
  int http_status = 0;
  std::string error;  // short description when not kOk
  double start_s = 0;
  double end_s = 0;
  std::vector<double> content_times_s;  // arrival of each chunk that carried output text
  // From chunks that carry choices and usage (continuous usage stats): the arrival of each chunk
  // whose usage.completion_tokens grew, and the count it reached. Empty when the server sends
  // usage only at the end.
  std::vector<double> token_times_s;
  std::vector<int64_t> token_counts;
  bool usage_present = false;
  int64_t usage_output_tokens = 0;
  int64_t usage_prompt_tokens = 0;
  int32_t turn = 0;

  // usage.completion_tokens, or the number of content chunks when the server sent no usage.
  int64_t output_tokens() const {
    return usage_present ? usage_output_tokens : static_cast<int64_t>(content_times_s.size());
  }
  // When the first output arrived: the first chunk whose usage counted a token, else the first
  // chunk with text; -1 when neither came.
  double first_output_s() const {
    if (!token_times_s.empty()) return token_times_s.front();
    return content_times_s.empty() ? -1 : content_times_s.front();
  }
  double ttft_s() const { return first_output_s() < 0 ? 0 : first_output_s() - start_s; }
  // The gaps between tokens: from the per-chunk counts when the server sent them (a chunk that
  // brings k tokens after a gap g gives k gaps of g / k), else the content chunks' gaps spread
  // over the usage count (SplitInterTokenLatencies).
  std::vector<double> InterTokenLatencies() const;
  // Output tokens that arrived in [from, to]: exact with per-chunk counts, else the usage count
  // times the share of content chunks in the window.
  double TokensArrivedBetween(double from, double to) const;
  double e2e_s() const { return end_s - start_s; }
};

// Turns the bytes of one streamed response into a RequestRecord: content chunk times, usage,
// [DONE], error frames. Separate from the socket so it can be fed by tests.
class StreamRecorder {
 public:
  explicit StreamRecorder(RequestRecord* record) : record_(record) {}
  // `bytes` arrived at time t (seconds since the epoch); every event in them gets that time.
  void OnBytes(std::string_view bytes, double t);
  // The body ended (or the connection did) at time t; decides the outcome of a 200 response.
  void Finish(double t);
  bool saw_done() const { return saw_done_; }

 private:
  void OnEvent(const SseEvent& event, double t);

  RequestRecord* record_;
  SseParser parser_;
  std::vector<SseEvent> events_;
  bool saw_done_ = false;
  bool saw_finish_reason_ = false;
};

// One HTTP/1.1 keep-alive connection to one server, owned by one worker thread.
class StreamClient {
 public:
  StreamClient(const ServerUrl& url, const std::string& api_key, double timeout_s);
  ~StreamClient();
  StreamClient(const StreamClient&) = delete;
  StreamClient& operator=(const StreamClient&) = delete;

  // POSTs `body` to `path` (under the URL's prefix) and records the streamed answer.
  RequestRecord Stream(const std::string& path, const std::string& body, Clock::time_point epoch);

  // GET of a JSON document; a readable Status on a connection failure or a non-200 answer.
  Result<nlohmann::json> GetJson(const std::string& path);

 private:
  std::unique_ptr<httplib::Client> client_;
  std::string prefix_;
  std::string api_key_;
};

// The first model id of GET /v1/models.
Result<std::string> DiscoverModel(const ServerUrl& url, const std::string& api_key);

}  // namespace kestrel::bench
