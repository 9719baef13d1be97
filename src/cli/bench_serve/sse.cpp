#include "cli/bench_serve/sse.h"

namespace kestrel::bench {

void SseParser::Feed(std::string_view bytes, std::vector<SseEvent>* out) {
  for (char c : bytes) {
    if (after_cr_) {
      after_cr_ = false;
      if (c == '\n') continue;  // the "\r\n" whose "\r" already ended the line
    }
    if (c == '\r' || c == '\n') {
      after_cr_ = c == '\r';
      Line(pending_, out);
      pending_.clear();
    } else {
      pending_.push_back(c);
    }
  }
}

void SseParser::Finish(std::vector<SseEvent>* out) {
  if (!pending_.empty()) Line(pending_, out);
  pending_.clear();
  Line("", out);
}

void SseParser::Line(std::string_view line, std::vector<SseEvent>* out) {
  if (line.empty()) {
    if (has_data_) out->push_back({std::move(event_), std::move(data_)});
    event_.clear();
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line.front() == ':') return;
  const size_t colon = line.find(':');
  const std::string_view field = line.substr(0, colon);
  std::string_view value = colon == std::string_view::npos ? "" : line.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (field == "data") {
    if (has_data_) data_.push_back('\n');
    data_.append(value);
    has_data_ = true;
  } else if (field == "event") {
    event_ = value;
  }
  // id and retry do not matter to a benchmark.
}

}  // namespace kestrel::bench
