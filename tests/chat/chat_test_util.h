// Shared helpers for the chat-template tests: JSON-lines data files under tests/data/chat.
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#ifndef KESTREL_SOURCE_DIR
#error "KESTREL_SOURCE_DIR must point at the source tree"
#endif

namespace kestrel::test {

inline std::string SourcePath(const std::string& relative) {
  return std::string(KESTREL_SOURCE_DIR) + "/" + relative;
}

inline bool FileReadable(const std::string& path) {
  return std::ifstream(path).good();
}

// One ordered_json per non-empty line (key order kept, as Python's json.loads keeps it).
inline std::vector<nlohmann::ordered_json> ReadJsonLines(const std::string& path) {
  std::vector<nlohmann::ordered_json> rows;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    rows.push_back(nlohmann::ordered_json::parse(line));
  }
  return rows;
}

// Shows where two renderings first differ, for failure messages.
inline std::string FirstDifference(const std::string& got, const std::string& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  auto excerpt = [i](const std::string& s) {
    const size_t from = i > 30 ? i - 30 : 0;
    return nlohmann::json(s.substr(from, 80)).dump();
  };
  return "first difference at byte " + std::to_string(i) + "\n  got:  " + excerpt(got) +
         "\n  want: " + excerpt(want);
}

}  // namespace kestrel::test
