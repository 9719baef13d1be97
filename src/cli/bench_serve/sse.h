// An incremental parser of server-sent events (the WHATWG event-stream format) for streamed
// completions: bytes arrive in arbitrary pieces from the HTTP client, events come out whole.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kestrel::bench {

struct SseEvent {
  std::string event;  // the `event:` field; empty for the default "message"
  std::string data;   // the `data:` lines joined with '\n'
};

// Lines end with "\n", "\r\n" or "\r"; an empty line dispatches the event; "data:" lines append
// to the data (one leading space dropped); lines starting with ':' are comments; an event with no
// data line is not dispatched. A '\r' at the end of a piece is held until the next byte shows
// whether a '\n' follows, so the events never depend on where the pieces were cut.
class SseParser {
 public:
  // Appends the events completed by `bytes` to *out.
  void Feed(std::string_view bytes, std::vector<SseEvent>* out);
  // At the end of the stream: dispatches an event whose closing blank line never came (servers
  // that close the connection right after the last `data:` line).
  void Finish(std::vector<SseEvent>* out);

 private:
  void Line(std::string_view line, std::vector<SseEvent>* out);

  std::string pending_;    // bytes of an unfinished line
  bool after_cr_ = false;  // the last byte seen was '\r': a '\n' next is part of that line end
  std::string event_;
  std::string data_;
  bool has_data_ = false;
};

}  // namespace kestrel::bench
