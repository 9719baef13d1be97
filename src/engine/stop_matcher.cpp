#include "engine/stop_matcher.h"

#include <algorithm>
#include <utility>

#include "core/check.h"

namespace kestrel {
namespace {

// Well-formed UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
      ++i;
      continue;
    }
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      n = 1;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      n = 2;
      if (b0 == 0xE0) lo = 0xA0;  // overlong
      if (b0 == 0xED) hi = 0x9F;  // surrogates
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      n = 3;
      if (b0 == 0xF0) lo = 0x90;  // overlong
      if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;  // truncated sequence
    for (size_t k = 1; k <= n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      const unsigned char min = k == 1 ? lo : 0x80, max = k == 1 ? hi : 0xBF;
      if (b < min || b > max) return false;
    }
    i += n + 1;
  }
  return true;
}

// failure[i] = length of the longest proper prefix of s[0..i] that is also its suffix.
std::vector<int32_t> KmpFailure(const std::string& s) {
  std::vector<int32_t> failure(s.size(), 0);
  int32_t k = 0;
  for (size_t i = 1; i < s.size(); ++i) {
    while (k > 0 && s[i] != s[static_cast<size_t>(k)]) k = failure[static_cast<size_t>(k) - 1];
    if (s[i] == s[static_cast<size_t>(k)]) ++k;
    failure[i] = k;
  }
  return failure;
}

}  // namespace

Status StopMatcher::Validate(const std::vector<std::string>& stops) {
  if (stops.size() > kMaxStops) {
    return InvalidArgument("at most " + std::to_string(kMaxStops) +
                           " stop strings are allowed, got " + std::to_string(stops.size()));
  }
  for (size_t i = 0; i < stops.size(); ++i) {
    const std::string& s = stops[i];
    const std::string name = "stop[" + std::to_string(i) + "]";
    if (s.empty()) return InvalidArgument(name + " is empty");
    if (s.size() > kMaxStopBytes) {
      return InvalidArgument(name + " is longer than " + std::to_string(kMaxStopBytes) + " bytes");
    }
    if (!IsValidUtf8(s)) return InvalidArgument(name + " is not valid UTF-8");
  }
  return Status::Ok();
}

Result<StopMatcher> StopMatcher::Create(std::vector<std::string> stops) {
  KTRY(Validate(stops));
  return StopMatcher(std::move(stops));
}

StopMatcher::StopMatcher(std::vector<std::string> stops)
    : stops_(std::move(stops)), matched_(stops_.size(), 0) {
  failure_.reserve(stops_.size());
  size_t longest = 0;
  for (const std::string& s : stops_) {
    failure_.push_back(KmpFailure(s));
    longest = std::max(longest, s.size());
  }
  pending_.reserve(longest);
}

StopMatcher::Output StopMatcher::Push(std::string_view delta) {
  KCHECK_MSG(!stopped_, "StopMatcher::Push after a stop was reported");
  Output out;
  if (stops_.empty()) {
    out.text.assign(delta);
    return out;
  }
  // pending_ holds the tail of the stream that some automaton has matched so far, so every
  // occurrence that completes in this delta starts inside pending_ + delta.
  const size_t held_before = pending_.size();
  pending_.append(delta);
  for (size_t pos = held_before; pos < pending_.size(); ++pos) {
    const char c = pending_[pos];
    int32_t winner = -1;
    for (size_t k = 0; k < stops_.size(); ++k) {
      const std::string& stop = stops_[k];
      int32_t q = matched_[k];
      while (q > 0 && stop[static_cast<size_t>(q)] != c) {
        q = failure_[k][static_cast<size_t>(q) - 1];
      }
      if (stop[static_cast<size_t>(q)] == c) ++q;
      matched_[k] = q;
      if (static_cast<size_t>(q) == stop.size() &&
          (winner < 0 || stop.size() > stops_[static_cast<size_t>(winner)].size())) {
        winner = static_cast<int32_t>(k);
      }
    }
    if (winner >= 0) {
      const size_t stop_begin = pos + 1 - stops_[static_cast<size_t>(winner)].size();
      out.text.assign(pending_, 0, stop_begin);
      out.stopped = true;
      out.stop_index = winner;
      pending_.clear();
      stopped_ = true;
      return out;
    }
  }
  // Hold back the longest tail that is still a prefix of some stop string.
  const size_t held = static_cast<size_t>(*std::max_element(matched_.begin(), matched_.end()));
  KCHECK(held <= pending_.size());
  out.text.assign(pending_, 0, pending_.size() - held);
  pending_.erase(0, pending_.size() - held);
  return out;
}

std::string StopMatcher::Finish() {
  std::string rest = std::move(pending_);
  pending_.clear();
  std::fill(matched_.begin(), matched_.end(), 0);
  return rest;
}

}  // namespace kestrel
