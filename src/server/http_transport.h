// The connection layer under httplib: Kestrel reads each request's head itself, with limits a
// hostile client cannot stretch, and hands httplib a stream that replays it. httplib then parses,
// routes and writes responses as before.
//
// What this layer adds (docs/server.md "Transport limits"):
//   * a deadline for the whole request head (request line + headers), however slowly it
//     trickles in: 408 and close when it passes; an idle keep-alive connection is closed after
//     keep_alive_timeout; a head larger than max_head_bytes gets 431;
//   * RFC 9112 framing checks before anything is routed: differing Content-Length values,
//     Content-Length beside Transfer-Encoding, a transfer coding other than chunked, header
//     values holding NUL / CR / LF, obs-fold lines, whitespace before a colon, a missing or
//     repeated Host in HTTP/1.1, versions other than 1.0 and 1.1 (505); each a 400 and close;
//   * when every HTTP thread is busy and the accept queue is full, the connection is answered
//     at once with 503 and `Retry-After` instead of waiting (BoundedTaskQueue's overflow);
//   * a listen backlog of `backlog` instead of httplib's 5.
#pragma once

#include <httplib.h>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace kestrel::server {

struct TransportLimits {
  int head_timeout_s = 10;        // the whole request head, from its first byte
  size_t max_head_bytes = 16384;  // request line + headers
  int backlog = 1024;             // listen queue
};

// Why a request head is refused: the status (400, 431, 505, ...) and a message.
struct HeadError {
  int status = 400;
  std::string message;
};

// RFC 9112 checks of one complete request head (up to and including the empty line).
std::optional<HeadError> CheckRequestHead(std::string_view head);

class HttpTransport : public httplib::Server {
 public:
  HttpTransport() = default;
  void set_limits(const TransportLimits& limits) { limits_ = limits; }
  const TransportLimits& limits() const { return limits_; }

  // After bind_to_port / bind_to_any_port: the listen queue becomes limits.backlog long.
  void RaiseBacklog();

  // Answers a connection that found no free thread with 503 (BoundedTaskQueue calls it, through
  // the job, on the accept thread) instead of serving it.
  static void RejectNextOnThisThread(bool on);

 private:
  bool process_and_close_socket(socket_t sock) override;

  TransportLimits limits_;
};

}  // namespace kestrel::server
