// Streaming parse of tokenizer.json. The vocabulary and merges (hundreds of thousands of
// entries) are collected into flat vectors as they are read instead of a JSON DOM, which would
// take most of the load time; everything else becomes an ordinary nlohmann::json document.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kestrel::tok {

struct TokenizerJson {
  // The whole file except model.vocab and model.merges, which are present there as empty
  // object / array placeholders when the file had them.
  nlohmann::json root;
  // model.vocab entries in file order (keys may repeat; the last one wins, as in HF).
  std::vector<std::pair<std::string, int64_t>> vocab;
  // model.merges in rank order, whichever spelling the file used ("a b" is split on its space).
  std::vector<std::pair<std::string, std::string>> merges;
};

// Errors name the offending field; the caller prefixes the file path.
Result<TokenizerJson> ParseTokenizerJson(std::string_view text);

}  // namespace kestrel::tok
