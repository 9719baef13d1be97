// Drives the real `kestrel serve` binary on models/kestrel-tiny from outside, as clients do:
// start on a free port, wait for /health, exercise the endpoints and error paths, disconnect a
// stream, then SIGTERM and expect exit code 0.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <csignal>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve_process.h"

namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

constexpr const char* kApiKey = "test-key-123";

using kestrel::testing::ServeProcess;

class ServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::signal(SIGPIPE, SIG_IGN);
    server_ = new ServeProcess();
    started_ = server_->Start({"--api-key", kApiKey, "--shutdown-grace", "60"});
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(started_) << "kestrel serve did not start:\n" << server_->stderr_text();
  }

  static httplib::Client Client() {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(60, 0);
    return c;
  }
  static httplib::Headers Auth() { return {{"Authorization", std::string("Bearer ") + kApiKey}}; }
  static httplib::Result PostJson(const std::string& path, const std::string& body,
                                  httplib::Headers headers = Auth()) {
    return Client().Post(path.c_str(), headers, body, "application/json");
  }
  // The error object of a response, checked for OpenAI's shape.
  static json ErrorOf(const httplib::Result& r) {
    json j = json::parse(r->body, nullptr, false);
    EXPECT_TRUE(j.is_object() && j.contains("error")) << r->body;
    if (!j.is_object() || !j.contains("error")) return json::object();
    const json& e = j["error"];
    EXPECT_TRUE(e["message"].is_string());
    EXPECT_TRUE(e["type"].is_string());
    EXPECT_TRUE(e.contains("param"));
    EXPECT_TRUE(e.contains("code"));
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
    return e;
  }

  static ServeProcess* server_;
  static bool started_;
};

ServeProcess* ServeTest::server_ = nullptr;
bool ServeTest::started_ = false;

// Raw HTTP/1.1 over a socket, for what httplib's client hides (early close, chunked uploads).
int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// Reads until `needle` appears or the timeout passes.
std::string ReadUntil(int fd, const std::string& needle, std::chrono::milliseconds timeout) {
  std::string got;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (got.find(needle) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

double MetricValue(const std::string& metrics, const std::string& sample) {
  const size_t at = metrics.find("\n" + sample + " ");
  if (at == std::string::npos) return -1;
  return std::stod(metrics.substr(at + sample.size() + 2));
}

TEST_F(ServeTest, HealthAndModels) {
  auto health = Client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body)["status"], "ok");

  auto models = Client().Get("/v1/models", Auth());
  ASSERT_TRUE(models);
  ASSERT_EQ(models->status, 200);
  json m = json::parse(models->body);
  EXPECT_EQ(m["object"], "list");
  ASSERT_EQ(m["data"].size(), 1u);
  EXPECT_EQ(m["data"][0]["id"], "kestrel-tiny");
  EXPECT_EQ(m["data"][0]["object"], "model");

  auto one = Client().Get("/v1/models/kestrel-tiny", Auth());
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 200);
  auto missing = Client().Get("/v1/models/gpt-4", Auth());
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(ErrorOf(missing)["code"], "model_not_found");
}

TEST_F(ServeTest, ChatCompletion) {
  auto r = PostJson("/v1/chat/completions", R"({"model": "kestrel-tiny", "max_tokens": 6,
      "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Hi"}],
      "temperature": 0, "logprobs": true, "top_logprobs": 2})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j["model"], "kestrel-tiny");
  const json& choice = j["choices"][0];
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_TRUE(choice["message"]["content"].is_string());
  EXPECT_TRUE(choice["finish_reason"] == "stop" || choice["finish_reason"] == "length");
  const json& usage = j["usage"];
  EXPECT_GT(usage["prompt_tokens"], 0);
  EXPECT_GE(usage["completion_tokens"], 1);
  EXPECT_LE(usage["completion_tokens"], 6);
  EXPECT_EQ(usage["total_tokens"],
            usage["prompt_tokens"].get<int>() + usage["completion_tokens"].get<int>());
  EXPECT_TRUE(usage["prompt_tokens_details"]["cached_tokens"].is_number());
  EXPECT_EQ(choice["logprobs"]["content"].size(), usage["completion_tokens"].get<size_t>());
  EXPECT_EQ(choice["logprobs"]["content"][0]["top_logprobs"].size(), 2u);
}

TEST_F(ServeTest, StreamingChatCompletion) {
  auto r = PostJson("/v1/chat/completions", R"({"max_tokens": 5, "stream": true,
      "stream_options": {"include_usage": true},
      "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}]})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  const std::string& body = r->body;
  ASSERT_GE(body.size(), 20u);
  EXPECT_EQ(body.rfind("data: ", 0), 0u);
  EXPECT_EQ(body.substr(body.size() - 14), "data: [DONE]\n\n");
  std::vector<json> chunks;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    ASSERT_NE(end, std::string::npos);
    const std::string payload = body.substr(pos + 6, end - pos - 6);
    if (payload != "[DONE]") chunks.push_back(json::parse(payload));
    pos = end + 2;
  }
  ASSERT_GE(chunks.size(), 3u);
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i]["object"], "chat.completion.chunk");
    EXPECT_EQ(chunks[i]["id"], chunks[0]["id"]);
    if (chunks[i]["choices"][0]["delta"].contains("content")) {
      text += chunks[i]["choices"][0]["delta"]["content"].get<std::string>();
    }
  }
  const json& finish = chunks[chunks.size() - 2];
  EXPECT_TRUE(finish["choices"][0]["finish_reason"].is_string());
  const json& usage_chunk = chunks.back();
  EXPECT_EQ(usage_chunk["choices"], json::array());
  EXPECT_LE(usage_chunk["usage"]["completion_tokens"], 5);
}

TEST_F(ServeTest, TextCompletion) {
  auto r = PostJson("/v1/completions",
                    R"({"prompt": [1, 2, 3], "max_tokens": 4, "logprobs": 1, "seed": 7})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);
  EXPECT_TRUE(j["choices"][0]["text"].is_string());
  EXPECT_EQ(j["choices"][0]["logprobs"]["tokens"].size(),
            j["usage"]["completion_tokens"].get<size_t>());
  // Same seed, same request: same text.
  auto again = PostJson("/v1/completions",
                        R"({"prompt": [1, 2, 3], "max_tokens": 4, "logprobs": 1, "seed": 7})");
  ASSERT_TRUE(again);
  EXPECT_EQ(json::parse(again->body)["choices"][0]["text"], j["choices"][0]["text"]);
}

std::string LongPrompt(int n_tokens) {
  std::string ids;
  for (int i = 0; i < n_tokens; ++i) ids += (i ? ",1" : "1");
  return "{\"prompt\": [" + ids + "]}";
}

TEST_F(ServeTest, BadRequests) {
  struct Case {
    const char* path;
    std::string body;
    int status;
    const char* param;  // nullptr: not checked
  };
  const std::vector<Case> cases = {
      {"/v1/chat/completions", "{not json", 400, nullptr},
      {"/v1/chat/completions", "{\"messages\": \"\xff\"}", 400, nullptr},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}],
                                   "temperature": "warm"})",
       400, "temperature"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}],
                                   "max_tokens": 0})",
       400, "max_tokens"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], "n": 17})", 400,
       "n"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}],
                                   "max_tokens": 100000})",
       400, "messages"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}],
                                   "model": "gpt-4o"})",
       404, "model"},
      {"/v1/completions", R"({"prompt": "hi", "echo": true, "logprobs": 2})", 400, "echo"},
      {"/v1/completions", R"({"prompt": [1, 99999]})", 400, "prompt[1]"},
      {"/v1/completions", LongPrompt(3000), 400, "prompt"},  // context is 2048
  };
  for (const Case& c : cases) {
    auto r = PostJson(c.path, c.body);
    ASSERT_TRUE(r) << c.body;
    EXPECT_EQ(r->status, c.status) << c.body << " -> " << r->body;
    json e = ErrorOf(r);
    if (c.param != nullptr) {
      EXPECT_EQ(e["param"], c.param) << r->body;
    }
  }
}

TEST_F(ServeTest, AuthenticationRoutesAndLimits) {
  auto no_key = PostJson("/v1/chat/completions", "{}", {});
  ASSERT_TRUE(no_key);
  EXPECT_EQ(no_key->status, 401);
  EXPECT_EQ(ErrorOf(no_key)["code"], "invalid_api_key");
  auto wrong_key =
      PostJson("/v1/chat/completions", "{}", {{"Authorization", "Bearer not-the-key"}});
  ASSERT_TRUE(wrong_key);
  EXPECT_EQ(wrong_key->status, 401);
  auto models_no_key = Client().Get("/v1/models");
  ASSERT_TRUE(models_no_key);
  EXPECT_EQ(models_no_key->status, 401);

  auto unknown = Client().Get("/v2/nothing");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  ErrorOf(unknown);
  auto unknown_post = PostJson("/v1/nothing", "{}");
  ASSERT_TRUE(unknown_post);
  EXPECT_EQ(unknown_post->status, 404);

  auto wrong_method = Client().Get("/v1/chat/completions", Auth());
  ASSERT_TRUE(wrong_method);
  EXPECT_EQ(wrong_method->status, 405);
  EXPECT_EQ(wrong_method->get_header_value("Allow"), "POST");
  ErrorOf(wrong_method);
  auto wrong_method_post = PostJson("/health", "{}");
  ASSERT_TRUE(wrong_method_post);
  EXPECT_EQ(wrong_method_post->status, 405);

  auto too_large = PostJson("/v1/chat/completions", std::string(9u << 20, ' '));
  ASSERT_TRUE(too_large);
  EXPECT_EQ(too_large->status, 413);
  ErrorOf(too_large);
}

TEST_F(ServeTest, ChunkedUploadIsBoundedToo) {
  const int fd = Connect(server_->port());
  ASSERT_GE(fd, 0);
  std::thread writer([fd] {
    std::string head = std::string("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n") +
                       "Authorization: Bearer " + kApiKey +
                       "\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n";
    SendAll(fd, head);
    const std::string chunk = "100000\r\n" + std::string(0x100000, ' ') + "\r\n";  // 1 MiB
    for (int i = 0; i < 9; ++i) {
      if (!SendAll(fd, chunk)) return;
    }
    SendAll(fd, "0\r\n\r\n");
  });
  const std::string response = ReadUntil(fd, "}}", 30s);
  writer.join();
  close(fd);
  EXPECT_EQ(response.rfind("HTTP/1.1 413", 0), 0u) << response.substr(0, 200);
  EXPECT_NE(response.find("request_too_large"), std::string::npos);
}

TEST_F(ServeTest, DisconnectCancelsTheStream) {
  auto before = Client().Get("/metrics");
  ASSERT_TRUE(before);
  const double cancelled_before =
      MetricValue(before->body, R"(kestrel_requests_finished_total{finish_reason="cancelled"})");
  ASSERT_GE(cancelled_before, 0) << before->body;

  const int fd = Connect(server_->port());
  ASSERT_GE(fd, 0);
  const std::string body =
      R"({"prompt": "Once upon a time", "max_tokens": 1900, "ignore_eos": true, "stream": true})";
  ASSERT_TRUE(SendAll(
      fd, std::string("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n") + "Authorization: Bearer " +
              kApiKey + "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body));
  const std::string first = ReadUntil(fd, "data: ", 30s);
  ASSERT_NE(first.find("data: "), std::string::npos) << first;
  close(fd);  // the client goes away mid-stream

  double cancelled = cancelled_before;
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (cancelled <= cancelled_before && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
    auto m = Client().Get("/metrics");
    if (m) {
      cancelled =
          MetricValue(m->body, R"(kestrel_requests_finished_total{finish_reason="cancelled"})");
    }
  }
  EXPECT_GT(cancelled, cancelled_before) << "the engine request was not cancelled";
}

TEST_F(ServeTest, DisconnectCancelsANonStreamingRequest) {
  auto before = Client().Get("/metrics");
  ASSERT_TRUE(before);
  const std::string cancelled_sample =
      R"(kestrel_requests_finished_total{finish_reason="cancelled"})";
  const double cancelled_before = MetricValue(before->body, cancelled_sample);

  // A client that gives up (a timeout) before the answer, which comes all at once at the end.
  httplib::Client impatient("127.0.0.1", server_->port());
  impatient.set_read_timeout(0, 200000);
  auto r = impatient.Post("/v1/completions", Auth(),
                          R"({"prompt": "Once", "max_tokens": 1900, "ignore_eos": true})",
                          "application/json");
  EXPECT_FALSE(r);  // timed out
  impatient.stop();

  double cancelled = cancelled_before;
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (cancelled <= cancelled_before && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
    auto m = Client().Get("/metrics");
    if (m) cancelled = MetricValue(m->body, cancelled_sample);
  }
  EXPECT_GT(cancelled, cancelled_before) << "the engine request was not cancelled";
}

TEST_F(ServeTest, MetricsAfterRequests) {
  ASSERT_TRUE(PostJson("/v1/completions", R"({"prompt": "a", "max_tokens": 2})"));
  // A response is counted once it is fully written, which may be just after the client has it.
  const std::string counted =
      R"(kestrel_http_requests_total{route="/v1/completions",status="200"})";
  std::string metrics;
  std::string content_type;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  for (;;) {
    auto r = Client().Get("/metrics");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
    metrics = r->body;
    content_type = r->get_header_value("Content-Type");
    if (MetricValue(metrics, counted) >= 1 || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(content_type.rfind("text/plain", 0), 0u);
  EXPECT_GE(MetricValue(metrics, counted), 1);
  // At least one token: a sampled end-of-sequence may end the request after its first token.
  EXPECT_GE(MetricValue(metrics, "kestrel_generation_tokens_total"), 1);
  EXPECT_NE(metrics.find("kestrel_time_to_first_token_seconds_bucket{le=\"+Inf\"}"),
            std::string::npos);
  EXPECT_NE(metrics.find("kestrel_inter_token_latency_seconds_count"), std::string::npos);
}

// Runs last (gtest keeps declaration order within a file): the process exits here.
// SIGTERM while a stream runs: new requests get 503, the stream still runs to [DONE], exit 0.
TEST_F(ServeTest, ZzSigtermDrainsThenExitsCleanly) {
  const int fd = Connect(server_->port());
  ASSERT_GE(fd, 0);
  const std::string body =
      R"({"prompt": "Once upon a time", "max_tokens": 1900, "ignore_eos": true, "stream": true})";
  ASSERT_TRUE(SendAll(
      fd, std::string("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n") + "Authorization: Bearer " +
              kApiKey + "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body));
  ASSERT_NE(ReadUntil(fd, "data: ", 30s).find("data: "), std::string::npos);
  // The stream takes seconds (1900 tokens); the probes below take milliseconds.
  server_->Signal(SIGTERM);

  int health_status = 0;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (health_status != 503 && std::chrono::steady_clock::now() < deadline) {
    auto h = Client().Get("/health");
    if (h) health_status = h->status;
    if (health_status != 503) std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(health_status, 503);
  auto refused = PostJson("/v1/completions", R"({"prompt": "a", "max_tokens": 2})");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503);
  ErrorOf(refused);

  const std::string rest = ReadUntil(fd, "data: [DONE]", 60s);
  close(fd);
  EXPECT_NE(rest.find("\"finish_reason\":\"length\""), std::string::npos);
  EXPECT_NE(rest.find("data: [DONE]"), std::string::npos) << "the running stream was cut off";

  EXPECT_EQ(server_->WaitExit(30s), 0) << server_->stderr_text();
  EXPECT_NE(server_->stderr_text().find("stopped"), std::string::npos) << server_->stderr_text();
}

// Past the grace period, the streams still running are cancelled: they end with an error
// frame and [DONE], and the process still exits 0.
TEST(ServeShutdown, GraceExpiryCancelsRunningStreams) {
  std::signal(SIGPIPE, SIG_IGN);
  ServeProcess server;
  ASSERT_TRUE(server.Start({"--shutdown-grace", "1"})) << server.stderr_text();
  const int fd = Connect(server.port());
  ASSERT_GE(fd, 0);
  const std::string body =
      R"({"prompt": "Once upon a time", "max_tokens": 1900, "ignore_eos": true, "stream": true})";
  ASSERT_TRUE(SendAll(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\n\r\n" + body));
  ASSERT_NE(ReadUntil(fd, "data: ", 30s).find("data: "), std::string::npos);
  server.Signal(SIGTERM);
  const std::string rest = ReadUntil(fd, "data: [DONE]", 60s);
  close(fd);
  EXPECT_NE(rest.find("shutting down"), std::string::npos) << rest.substr(rest.size() - 300);
  EXPECT_NE(rest.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(rest.find("\"finish_reason\":\"length\""), std::string::npos);
  EXPECT_EQ(server.WaitExit(30s), 0) << server.stderr_text();
  EXPECT_NE(server.stderr_text().find("cancelling 1 unfinished request"), std::string::npos)
      << server.stderr_text();
}

// ---- hardening: framing, slow clients, admission, auth details (docs/server.md) -------------

// Sends `data` on a fresh connection and reads until the server closes it (or the timeout).
std::string RawExchange(int port, const std::string& data,
                        std::chrono::milliseconds timeout = 10000ms) {
  const int fd = Connect(port);
  if (fd < 0) return "";
  SendAll(fd, data);
  std::string got = ReadUntil(fd, "\x01never\x02", timeout);
  close(fd);
  return got;
}

int StatusOf(const std::string& response) {
  if (response.rfind("HTTP/1.", 0) != 0 || response.size() < 12) return -1;
  return std::stoi(response.substr(9, 3));
}

class ServeHardening : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::signal(SIGPIPE, SIG_IGN);
    server_ = new ServeProcess();
    // 2 running + 0 waiting: 18 HTTP threads, a 1 s head deadline.
    started_ = server_->Start({"--api-key", kApiKey, "--protect-metrics", "--max-num-seqs", "2",
                               "--max-waiting", "0", "--header-timeout", "1"});
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(started_) << "kestrel serve did not start:\n" << server_->stderr_text();
  }
  static int port() { return server_->port(); }
  static httplib::Client Client() {
    httplib::Client c("127.0.0.1", port());
    c.set_read_timeout(60, 0);
    return c;
  }
  static ServeProcess* server_;
  static bool started_;
};

ServeProcess* ServeHardening::server_ = nullptr;
bool ServeHardening::started_ = false;

TEST_F(ServeHardening, FramingErrorsAreRefusedBeforeRouting) {
  const std::string auth = std::string("Authorization: Bearer ") + kApiKey + "\r\n";
  const std::string post = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + auth +
                           "Content-Type: application/json\r\n";
  struct Case {
    std::string request;
    int status;
    std::string message;
  };
  const std::vector<Case> cases = {
      {post + "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello", 400, "Conflicting"},
      {post + "Content-Length: 5, 6\r\n\r\nhello", 400, "Conflicting"},
      {post + "Content-Length: -5\r\n\r\nhello", 400, "Invalid Content-Length"},
      {post + "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "together"},
      {post + "Transfer-Encoding: gzip\r\n\r\n", 400, "chunked"},
      {std::string("GET /health HTTP/1.1\r\nHost: x\r\nX-A: a") + '\0' + "b\r\n\r\n", 400, "NUL"},
      {"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n", 400, "folding"},
      {"GET /health HTTP/1.1\r\nHost: x\r\nX-A : a\r\n\r\n", 400, "colon"},
      {"GET /health HTTP/1.1\r\n\r\n", 400, "Host"},
      {"GET /health HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400, "Host"},
      {"GET /health HTTP/2.0\r\nHost: x\r\n\r\n", 505, "HTTP/1.0 and HTTP/1.1"},
      {"GET /health HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "HTTP/1.0"},
      {"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(20000, 'a') + "\r\n\r\n", 431,
       "exceeds"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.request.substr(0, 80));
    const auto t0 = std::chrono::steady_clock::now();
    const std::string r = RawExchange(port(), c.request);
    EXPECT_EQ(StatusOf(r), c.status) << r.substr(0, 300);
    EXPECT_NE(r.find(c.message), std::string::npos) << r;
    EXPECT_NE(r.find("Connection: close"), std::string::npos) << r;
    EXPECT_NE(r.find("\"error\""), std::string::npos) << r;
    // Answered at once, not after a read timeout.
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  }
  // Identical repeated lengths are one length (RFC 9112 6.3).
  const std::string body = R"({"prompt": "a", "max_tokens": 1})";
  const std::string ok = RawExchange(
      port(), post + "Content-Length: " + std::to_string(body.size()) + "\r\nContent-Length: " +
                  std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
  EXPECT_EQ(StatusOf(ok), 200) << ok.substr(0, 300);
}

TEST_F(ServeHardening, SlowHeadsGet408AndCannotStarveOthers) {
  // A head trickling in: 408 once the 1 s deadline passes, although each line came within the
  // read timeout.
  const int fd = Connect(port());
  ASSERT_GE(fd, 0);
  const auto t0 = std::chrono::steady_clock::now();
  std::string got;
  for (int i = 0; i < 8 && got.empty(); ++i) {
    SendAll(fd, i == 0 ? "GET /health HTTP/1.1\r\n" : "X-Slow: " + std::to_string(i) + "\r\n");
    got = ReadUntil(fd, "\r\n\r\n", 400ms);
  }
  got += ReadUntil(fd, "}}", 2s);
  close(fd);
  EXPECT_EQ(StatusOf(got), 408) << got;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 4s);

  // 300 slow clients (each sends half a head and stalls): every one is answered (408 or 503)
  // and a normal request is answered within seconds, never left hanging.
  std::vector<int> slow;
  for (int i = 0; i < 300; ++i) {
    const int c = Connect(port());
    if (c < 0) continue;
    SendAll(c, "GET /health HTTP/1.1\r\nHost: x\r\n");
    slow.push_back(c);
  }
  EXPECT_EQ(slow.size(), 300u) << "the listen backlog refused connections";
  const auto t1 = std::chrono::steady_clock::now();
  const std::string normal = RawExchange(port(), "GET /health HTTP/1.1\r\nHost: x\r\n"
                                                 "Connection: close\r\n\r\n",
                                         15000ms);
  const int status = StatusOf(normal);
  EXPECT_TRUE(status == 200 || status == 503) << normal;
  if (status == 503) {
    EXPECT_NE(normal.find("Retry-After: 1"), std::string::npos) << normal;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t1, 5s);
  int answered = 0;
  for (int c : slow) {
    const std::string r = ReadUntil(c, "}}", 20s);
    answered += StatusOf(r) == 408 || StatusOf(r) == 503;
    close(c);
  }
  EXPECT_EQ(answered, 300);
  // And the server is back to normal.
  auto health = Client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST_F(ServeHardening, HttpOneZeroGetsNoChunkedCoding) {
  const std::string body = R"({"prompt": "a", "max_tokens": 3, "stream": true})";
  const std::string r = RawExchange(
      port(), std::string("POST /v1/completions HTTP/1.0\r\nAuthorization: Bearer ") + kApiKey +
                  "\r\nContent-Type: application/json\r\nContent-Length: " +
                  std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_EQ(StatusOf(r), 200) << r.substr(0, 300);
  EXPECT_EQ(r.find("Transfer-Encoding"), std::string::npos) << r.substr(0, 300);
  EXPECT_NE(r.find("Connection: close"), std::string::npos);
  // The body is the SSE stream itself, not chunk-size lines.
  const size_t at = r.find("\r\n\r\n");
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(r.compare(at + 4, 6, "data: "), 0) << r.substr(at, 40);
  EXPECT_NE(r.find("data: [DONE]"), std::string::npos);
}

TEST_F(ServeHardening, AuthSchemeContentTypeAndMetrics) {
  const std::string body = R"({"prompt": "a", "max_tokens": 1})";
  for (const char* scheme : {"Bearer ", "bearer ", "BEARER "}) {
    auto r = Client().Post("/v1/completions", {{"Authorization", scheme + std::string(kApiKey)}},
                           body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << scheme;
  }
  auto x = Client().Post("/v1/completions", {{"x-api-key", kApiKey}}, body, "application/json");
  ASSERT_TRUE(x);
  EXPECT_EQ(x->status, 200);
  const httplib::Headers auth = {{"Authorization", std::string("Bearer ") + kApiKey}};
  for (const char* type : {"text/plain", "application/x-www-form-urlencoded"}) {
    auto r = Client().Post("/v1/completions", auth, body, type);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 415) << type;
    EXPECT_NE(r->body.find("application/json"), std::string::npos) << r->body;
  }
  auto charset = Client().Post("/v1/completions", auth, body, "application/json; charset=utf-8");
  ASSERT_TRUE(charset);
  EXPECT_EQ(charset->status, 200);
  // --protect-metrics: /metrics needs the key.
  auto open = Client().Get("/metrics");
  ASSERT_TRUE(open);
  EXPECT_EQ(open->status, 401);
  auto keyed = Client().Get("/metrics", auth);
  ASSERT_TRUE(keyed);
  EXPECT_EQ(keyed->status, 200);
}

TEST_F(ServeHardening, MaxWaitingCountsOnlyBeyondTheRunningCapacity) {
  // --max-num-seqs 2 --max-waiting 0: two long requests at once run; a third gets 429.
  const std::string auth = std::string("Authorization: Bearer ") + kApiKey + "\r\n";
  const std::string body =
      R"({"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": true, "stream": true})";
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + auth +
                              "Content-Type: application/json\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\n\r\n" + body;
  std::vector<int> streams;
  for (int i = 0; i < 2; ++i) {
    const int fd = Connect(port());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendAll(fd, request));
    EXPECT_EQ(StatusOf(ReadUntil(fd, "data: ", 30s)), 200) << "request " << i;
    streams.push_back(fd);
  }
  auto third = Client().Post("/v1/completions", {{"Authorization", std::string("Bearer ") + kApiKey}},
                             R"({"prompt": "a", "max_tokens": 1})", "application/json");
  ASSERT_TRUE(third);
  EXPECT_EQ(third->status, 429) << third->body;
  EXPECT_EQ(third->get_header_value("Retry-After"), "1");
  const std::string& msg = third->body;
  const size_t first = msg.find("retry later");
  EXPECT_NE(first, std::string::npos) << msg;
  EXPECT_EQ(msg.find("retry later", first + 1), std::string::npos) << msg;
  for (int fd : streams) close(fd);  // cancels them
}

// One --kv-memory budget holds (4 hd) / (hd + 4) times the tokens with --kv-cache-dtype int8
// (int8 codes plus an f32 scale per row instead of f32 rows), and the int8 server serves.
TEST(ServeKvCache, Int8CacheHoldsMoreTokensInTheSameBudgetAndServes) {
  std::signal(SIGPIPE, SIG_IGN);
  auto capacity = [](const std::vector<std::string>& flags, bool complete) -> long long {
    ServeProcess server;
    if (!server.Start(flags)) {
      ADD_FAILURE() << "did not start: " << server.stderr_text();
      return -1;
    }
    std::smatch m;
    const std::string& log = server.stderr_text();
    if (!std::regex_search(log, m, std::regex(R"(KV cache: (\d+) tokens)"))) {
      ADD_FAILURE() << log;
      return -1;
    }
    if (complete) {
      httplib::Client client(server.url());
      auto r = client.Post("/v1/completions", R"({"prompt": "Once upon a time", "max_tokens": 8})",
                           "application/json");
      EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    }
    return std::stoll(m[1]);
  };
  const long long f32 = capacity({}, false);
  const long long int8 = capacity({"--kv-cache-dtype", "int8"}, true);
  ASSERT_GT(f32, 0);
  const double hd = 64;  // kestrel-tiny
  EXPECT_NEAR(static_cast<double>(int8) / static_cast<double>(f32), 4 * hd / (hd + 4), 0.05)
      << f32 << " vs " << int8 << " tokens";
}

}  // namespace
