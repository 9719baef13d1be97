// The name of a full KV block in the prefix cache: a chained 128-bit hash of its tokens and its
// parent block's hash (kv_cache_manager.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace kestrel {

struct BlockHash {
  uint64_t lo = 0;
  uint64_t hi = 0;
  friend bool operator==(const BlockHash&, const BlockHash&) = default;
};

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const { return static_cast<size_t>(h.lo); }
};

// The root of every chain for one model (and later one LoRA, one KV dtype...).
BlockHash HashExtraKey(std::string_view extra_key);
// XXH3-128 over the 16 bytes of parent then the token ids (little-endian int32).
BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> tokens);

}  // namespace kestrel
