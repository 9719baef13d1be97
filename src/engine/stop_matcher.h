// Stop strings matched on streamed text (the deltas of the streaming detokenizer).
//
// Push(delta) returns the text that is safe to show now: everything except the longest tail that
// could still grow into a stop string, which is held back. When a stop string completes, Push
// reports it with the text before it; the stop string and everything after it are dropped.
// Finish() releases the held tail when generation ends without a stop.
//
// Semantics (independent of how the text is split into deltas): generation stops at the first
// byte of the stream at which some stop string is complete, i.e. the occurrence with the earliest
// END wins. If several complete at that byte (one is a suffix of another), the longest wins, so no
// part of a stop string is shown; equal stop strings resolve to the lowest index.
// Example: stops {"ab", "b c"}: "xab c" stops at "ab" (shows "x"); "xb c" stops at "b c".
//
// Matching is byte-wise, one KMP automaton per stop string (O(n_stops) per byte). Stop strings
// are validated as UTF-8, so on a UTF-8 stream both the shown text and the held tail are always
// whole code points.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kestrel {

class StopMatcher {
 public:
  // Limits that bound the per-byte cost; OpenAI allows 4 stops.
  static constexpr size_t kMaxStops = 64;
  static constexpr size_t kMaxStopBytes = 1024;

  struct Output {
    std::string text;         // safe to emit now
    bool stopped = false;     // a stop string completed; text is what preceded it; generation ends
    int32_t stop_index = -1;  // index into the stop list when stopped
  };

  // Bad input (a request field): empty or non-UTF-8 stop strings, too many or too long.
  static Status Validate(const std::vector<std::string>& stops);
  // An empty list is valid: every delta passes straight through.
  static Result<StopMatcher> Create(std::vector<std::string> stops);

  // Consumes the next piece of generated text. Must not be called after a stop was reported.
  Output Push(std::string_view delta);
  // Releases the held tail (generation ended without a stop). Empty after a stop.
  std::string Finish();

  bool stopped() const { return stopped_; }
  const std::string& held() const { return pending_; }
  const std::vector<std::string>& stops() const { return stops_; }

 private:
  explicit StopMatcher(std::vector<std::string> stops);

  std::vector<std::string> stops_;
  std::vector<std::vector<int32_t>> failure_;  // [stop][i]: KMP failure function of stops_[stop]
  std::vector<int32_t> matched_;               // [stop]: bytes of it matched at the stream's end
  std::string pending_;                        // held tail: the last max(matched_) bytes
  bool stopped_ = false;
};

}  // namespace kestrel
