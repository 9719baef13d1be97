// The connection layer under httplib (see http_transport.h).
#include "server/http_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

namespace kestrel::server {
namespace {

using Clock = std::chrono::steady_clock;

thread_local bool tls_reject = false;

// Milliseconds until `deadline` (0 when past).
int MillisUntil(Clock::time_point deadline) {
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30));
}

bool WaitFor(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int r = poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    return r > 0 && (p.revents & (events | POLLHUP | POLLERR)) != 0;
  }
}

void WriteAll(int fd, std::string_view data, int timeout_ms) {
  while (!data.empty()) {
    if (!WaitFor(fd, POLLOUT, timeout_ms)) return;
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    data.remove_prefix(static_cast<size_t>(n));
  }
}

const char* Reason(int status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 408:
      return "Request Timeout";
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Error";
  }
}

std::string JsonEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

// A complete response with an OpenAI-style error body; the connection closes after it.
void WriteErrorAndClose(int fd, int status, const std::string& message, int timeout_ms,
                        bool retry_after = false) {
  const char* type = status == 503 ? "service_unavailable" : "invalid_request_error";
  const std::string body = "{\"error\":{\"message\":\"" + JsonEscape(message) + "\",\"type\":\"" +
                           type + "\",\"param\":null,\"code\":null}}";
  std::string head =
      "HTTP/1.1 " + std::to_string(status) + " " + Reason(status) +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\nConnection: close\r\n";
  if (retry_after) head += "Retry-After: 1\r\n";
  WriteAll(fd, head + "\r\n" + body, timeout_ms);
}

// The socket as httplib reads it: first the bytes Kestrel already read (the request head, and
// whatever followed it in the same reads), then the socket, each read waiting at most the read
// timeout. Kept for the whole connection, so pipelined bytes carry over to the next request.
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(int fd, time_t read_timeout_s, time_t write_timeout_s)
      : fd_(fd),
        read_timeout_ms_(static_cast<int>(read_timeout_s * 1000)),
        write_timeout_ms_(static_cast<int>(write_timeout_s * 1000)) {}

  bool is_readable() const override {
    return pos_ < buffer_.size() || WaitFor(fd_, POLLIN, read_timeout_ms_);
  }
  // Writable and not closed by the peer (a client that went away is noticed while streaming).
  bool is_writable() const override {
    if (!WaitFor(fd_, POLLOUT, write_timeout_ms_)) return false;
    char byte;
    const ssize_t n = recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return !(n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR));
  }
  ssize_t read(char* ptr, size_t size) override {
    if (pos_ < buffer_.size()) {
      const size_t n = std::min(size, buffer_.size() - pos_);
      std::memcpy(ptr, buffer_.data() + pos_, n);
      pos_ += n;
      Compact();
      return static_cast<ssize_t>(n);
    }
    if (!WaitFor(fd_, POLLIN, read_timeout_ms_)) return -1;
    for (;;) {
      const ssize_t n = recv(fd_, ptr, size, 0);
      if (n < 0 && errno == EINTR) continue;
      return n;
    }
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!WaitFor(fd_, POLLOUT, write_timeout_ms_)) return -1;
    for (;;) {
      const ssize_t n = send(fd_, ptr, size, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      return n;
    }
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    Address(getpeername, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    Address(getsockname, ip, port);
  }
  socket_t socket() const override { return fd_; }

  enum class Head { kComplete, kClosed, kTimeout, kTooLarge };
  // Reads until the buffered bytes hold a whole request head (ending in an empty line), or the
  // deadline passes. *head_end: the offset just past it.
  Head ReadHead(Clock::time_point deadline, size_t max_bytes, size_t* head_end) {
    for (;;) {
      // A request may be preceded by empty lines (RFC 9112 2.2).
      while (pos_ + 1 < buffer_.size() && buffer_[pos_] == '\r' && buffer_[pos_ + 1] == '\n') {
        pos_ += 2;
      }
      const size_t at = buffer_.find("\r\n\r\n", pos_);
      if (at != std::string::npos) {
        if (at + 4 - pos_ > max_bytes) return Head::kTooLarge;
        *head_end = at + 4;
        return Head::kComplete;
      }
      if (buffer_.size() - pos_ > max_bytes) return Head::kTooLarge;
      const int wait = MillisUntil(deadline);
      if (wait == 0 || !WaitFor(fd_, POLLIN, wait)) return Head::kTimeout;
      char chunk[4096];
      const ssize_t n = recv(fd_, chunk, sizeof(chunk), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Head::kClosed;
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }
  std::string_view Buffered(size_t end) const {
    return std::string_view(buffer_).substr(pos_, end - pos_);
  }
  bool HasBuffered() const { return pos_ < buffer_.size(); }

 private:
  template <typename Fn>
  void Address(Fn fn, std::string& ip, int& port) const {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    ip.clear();
    port = 0;
    if (fn(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return;
    char text[INET6_ADDRSTRLEN] = {0};
    if (addr.ss_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
      inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
      port = ntohs(a->sin_port);
    } else if (addr.ss_family == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
      inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
      port = ntohs(a->sin6_port);
    }
    ip = text;
  }
  void Compact() {
    if (pos_ == buffer_.size()) {
      buffer_.clear();
      pos_ = 0;
    }
  }

  int fd_;
  int read_timeout_ms_;
  int write_timeout_ms_;
  std::string buffer_;
  size_t pos_ = 0;
};

bool IsTokenChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 ||
         std::strchr("!#$%&'*+-.^_`|~", c) != nullptr;
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

std::optional<HeadError> CheckRequestHead(std::string_view head) {
  // Lines end in CRLF; the head ends with an empty line.
  std::vector<std::string_view> lines;
  for (size_t at = 0; at < head.size();) {
    const size_t end = head.find("\r\n", at);
    if (end == std::string_view::npos) break;
    lines.push_back(head.substr(at, end - at));
    at = end + 2;
  }
  if (lines.size() < 2 || !lines.back().empty()) {
    return HeadError{400, "Malformed request head"};
  }
  // Request line: method SP target SP HTTP-version.
  const std::string_view request_line = lines[0];
  const size_t sp1 = request_line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : request_line.find(' ', sp1 + 1);
  if (sp1 == 0 || sp2 == std::string_view::npos || sp2 == sp1 + 1 ||
      request_line.find(' ', sp2 + 1) != std::string_view::npos) {
    return HeadError{400, "Malformed request line"};
  }
  for (char c : request_line.substr(0, sp1)) {
    if (!IsTokenChar(c)) return HeadError{400, "Malformed request method"};
  }
  const std::string_view version = request_line.substr(sp2 + 1);
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || version[6] != '.' ||
      !std::isdigit(static_cast<unsigned char>(version[5])) ||
      !std::isdigit(static_cast<unsigned char>(version[7]))) {
    return HeadError{400, "Malformed HTTP version"};
  }
  if (version != "HTTP/1.1" && version != "HTTP/1.0") {
    return HeadError{505, "Only HTTP/1.0 and HTTP/1.1 are supported"};
  }
  const bool http11 = version == "HTTP/1.1";

  int n_host = 0;
  std::optional<std::string> content_length;
  bool transfer_encoding = false;
  for (size_t i = 1; i + 1 < lines.size(); ++i) {
    const std::string_view line = lines[i];
    if (line.front() == ' ' || line.front() == '\t') {
      return HeadError{400, "Obsolete line folding in a header is not accepted"};
    }
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) {
      return HeadError{400, "Malformed header line"};
    }
    const std::string_view name = line.substr(0, colon);
    for (char c : name) {
      if (!IsTokenChar(c)) {
        return HeadError{400, "Malformed header name (no whitespace is allowed before the colon)"};
      }
    }
    const std::string_view value = Trim(line.substr(colon + 1));
    for (char c : value) {
      if (c == '\0' || c == '\r' || c == '\n') {
        return HeadError{400, "Header " + std::string(name) + " holds a NUL, CR or LF"};
      }
    }
    if (EqualsIgnoreCase(name, "Host")) ++n_host;
    if (EqualsIgnoreCase(name, "Content-Length")) {
      // A list ("5, 5") or repeated header is accepted only when every value is the same.
      size_t at = 0;
      while (at <= value.size()) {
        size_t comma = value.find(',', at);
        if (comma == std::string_view::npos) comma = value.size();
        const std::string_view v = Trim(value.substr(at, comma - at));
        if (v.empty() || v.size() > 18 ||
            !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; })) {
          return HeadError{400, "Invalid Content-Length"};
        }
        if (content_length && *content_length != v) {
          return HeadError{400, "Conflicting Content-Length values"};
        }
        content_length = std::string(v);
        at = comma + 1;
      }
    }
    if (EqualsIgnoreCase(name, "Transfer-Encoding")) {
      if (transfer_encoding) return HeadError{400, "Repeated Transfer-Encoding"};
      transfer_encoding = true;
      if (!http11) return HeadError{400, "Transfer-Encoding in an HTTP/1.0 request"};
      if (!EqualsIgnoreCase(value, "chunked")) {
        return HeadError{400, "Only the chunked transfer coding is accepted"};
      }
    }
  }
  if (transfer_encoding && content_length) {
    return HeadError{400, "Content-Length together with Transfer-Encoding"};
  }
  if (http11 && n_host != 1) {
    return HeadError{
        400, n_host == 0 ? "HTTP/1.1 requests need a Host header" : "More than one Host header"};
  }
  return std::nullopt;
}

void HttpTransport::RaiseBacklog() {
  const socket_t sock = svr_sock_;
  if (sock != INVALID_SOCKET) ::listen(sock, limits_.backlog);
}

void HttpTransport::RejectNextOnThisThread(bool on) {
  tls_reject = on;
}

bool HttpTransport::process_and_close_socket(socket_t sock) {
  const int write_ms = static_cast<int>(write_timeout_sec_ * 1000);
  if (tls_reject) {
    WriteErrorAndClose(sock, 503, "The server has no free connection slot; retry later", write_ms,
                       /*retry_after=*/true);
  } else {
    ConnectionStream stream(sock, read_timeout_sec_, write_timeout_sec_);
    const int keep_alive_ms = static_cast<int>(keep_alive_timeout_sec_ * 1000);
    for (size_t left = keep_alive_max_count_; left > 0 && is_running(); --left) {
      // The first byte of a request: within the read timeout on a new connection, the
      // keep-alive timeout on a used one.
      const bool first = left == keep_alive_max_count_;
      if (!stream.HasBuffered() &&
          !WaitFor(sock, POLLIN,
                   first ? static_cast<int>(read_timeout_sec_ * 1000) : keep_alive_ms)) {
        break;
      }
      const Clock::time_point deadline =
          Clock::now() + std::chrono::seconds(limits_.head_timeout_s);
      size_t head_end = 0;
      const ConnectionStream::Head h = stream.ReadHead(deadline, limits_.max_head_bytes, &head_end);
      if (h == ConnectionStream::Head::kClosed) break;
      if (h == ConnectionStream::Head::kTimeout) {
        // Nothing at all of a next request on a kept-alive connection is a plain close.
        if (!first && !stream.HasBuffered()) break;
        WriteErrorAndClose(sock, 408,
                           "The request head did not arrive within " +
                               std::to_string(limits_.head_timeout_s) + " s",
                           write_ms);
        break;
      }
      if (h == ConnectionStream::Head::kTooLarge) {
        WriteErrorAndClose(
            sock, 431,
            "The request head exceeds " + std::to_string(limits_.max_head_bytes) + " bytes",
            write_ms);
        break;
      }
      if (std::optional<HeadError> e = CheckRequestHead(stream.Buffered(head_end))) {
        WriteErrorAndClose(sock, e->status, e->message, write_ms);
        break;
      }
      bool connection_closed = false;
      const bool ok =
          process_request(stream, /*close_connection=*/left == 1, connection_closed, nullptr);
      if (!ok || connection_closed) break;
    }
  }
  shutdown(sock, SHUT_RDWR);
  close(sock);
  return true;
}

}  // namespace kestrel::server
