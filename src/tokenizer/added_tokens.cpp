#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace kestrel::tok {
namespace {

// Start of the code point that ends just before `end` (text is valid UTF-8).
size_t PrevCharStart(std::string_view text, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<uint8_t>(text[i]) & 0xC0) == 0x80) --i;
  return i;
}

uint8_t FlagsAt(std::string_view text, size_t i) {
  int len;
  return GetCharTable().Flags(DecodeUtf8(text.data() + i, &len));
}

}  // namespace

void AddedTokenMatcher::Build(std::vector<AddedToken> tokens, std::vector<std::string> patterns) {
  tokens_ = std::move(tokens);
  nodes_.assign(1, Node{});
  std::fill(std::begin(first_byte_), std::end(first_byte_), false);
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const std::string& pattern = patterns[t];
    if (pattern.empty()) continue;
    first_byte_[static_cast<uint8_t>(pattern[0])] = true;
    int32_t node = 0;
    for (const char ch : pattern) {
      const auto byte = static_cast<uint8_t>(ch);
      int32_t next = Child(node, byte);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_[node].children.emplace_back(byte, next);
        nodes_.emplace_back();
      }
      node = next;
    }
    // Two tokens with the same pattern: the later one wins (like building HF's automaton from
    // its id map, where one content has one id).
    nodes_[node].token = static_cast<int32_t>(t);
  }
}

int32_t AddedTokenMatcher::Child(int32_t node, uint8_t byte) const {
  for (const auto& [b, child] : nodes_[node].children) {
    if (b == byte) return child;
  }
  return -1;
}

void AddedTokenMatcher::Split(std::string_view text, std::vector<Piece>* pieces) const {
  pieces->clear();
  const CharTable& table = GetCharTable();
  auto is_space_at = [&](size_t i) {
    int len;
    return (table.Flags(DecodeUtf8(text.data() + i, &len)) & kCharSpace) != 0;
  };
  size_t start_offset = 0;  // end of the last emitted piece
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    if (!first_byte_[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    // Longest pattern starting at i.
    int32_t node = 0;
    int32_t best_token = -1;
    size_t best_end = 0;
    for (size_t j = i; j < n; ++j) {
      node = Child(node, static_cast<uint8_t>(text[j]));
      if (node < 0) break;
      if (nodes_[node].token >= 0) {
        best_token = nodes_[node].token;
        best_end = j + 1;
      }
    }
    if (best_token < 0) {
      ++i;
      continue;
    }
    const AddedToken& token = tokens_[best_token];
    size_t start = i;
    size_t stop = best_end;
    i = best_end;  // the automaton resumes after the raw match, whatever happens below
    if (token.single_word) {
      const bool word_before =
          start > 0 && (FlagsAt(text, PrevCharStart(text, start)) & kCharWord);
      const bool word_after = stop < n && (FlagsAt(text, stop) & kCharWord);
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        const size_t prev = PrevCharStart(text, new_start);
        if (!is_space_at(prev)) break;
        new_start = prev;
      }
      start = std::max(new_start, start_offset);
    }
    if (token.rstrip) {
      while (stop < n && is_space_at(stop)) {
        int len;
        DecodeUtf8(text.data() + stop, &len);
        stop += static_cast<size_t>(len);
      }
    }
    if (start_offset < start) {
      pieces->push_back({static_cast<uint32_t>(start_offset), static_cast<uint32_t>(start), -1});
    }
    pieces->push_back({static_cast<uint32_t>(start), static_cast<uint32_t>(stop), token.id});
    start_offset = stop;
  }
  if (start_offset < n) {
    pieces->push_back({static_cast<uint32_t>(start_offset), static_cast<uint32_t>(n), -1});
  }
}

}  // namespace kestrel::tok
