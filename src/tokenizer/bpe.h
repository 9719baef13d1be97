// Byte-level BPE model: a pre-token's bytes -> token ids, merging by rank exactly as HF's
// `BPE::merge_word` / `Word::merge_all` (lowest rank first, leftmost first among equal ranks).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/flat_map.h"

namespace kestrel::tok {

class BpeModel {
 public:
  struct Options {
    bool ignore_merges = false;   // a pre-token that is itself in the vocabulary maps directly
    std::optional<int32_t> unk_id;  // used for bytes missing from the vocabulary
    bool fuse_unk = false;
  };

  BpeModel();

  // Vocabulary entries keyed by their raw bytes (byte-level strings already decoded).
  void SetVocab(StringIdMap vocab_bytes, const Options& options);
  void ReserveMerges(size_t n_merges) { merges_.Reserve(n_merges); }
  void AddMerge(int32_t left, int32_t right, uint32_t rank, int32_t merged);

  // Appends the ids of one pre-token (raw bytes). Thread-safe (the cache is per thread).
  void EncodeWord(std::string_view word, std::vector<int32_t>* ids) const;

  // Merges `symbols` in place; `force_heap` selects the O(n log n) path regardless of length
  // (tests check that both paths agree).
  void MergeSymbols(std::vector<int32_t>* symbols, bool force_heap = false) const;

  int32_t FindBytes(std::string_view bytes) const { return vocab_bytes_.Find(bytes); }
  size_t n_merges() const { return merges_.size(); }

 private:
  void InitialSymbols(std::string_view word, std::vector<int32_t>* symbols) const;
  void MergeSmall(std::vector<int32_t>* symbols) const;
  void MergeHeap(std::vector<int32_t>* symbols) const;

  StringIdMap vocab_bytes_;
  PairMap merges_;
  int32_t byte_ids_[256];
  Options options_;
  uint64_t instance_id_;  // keys the per-thread word cache
};

}  // namespace kestrel::tok
