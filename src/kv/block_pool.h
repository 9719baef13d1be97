// Paged KV cache bookkeeping (no tensors here; the backend owns the storage).
// A fixed pool of blocks of block_size tokens; each sequence owns a block table.
// Blocks are reference counted so that the prefix cache (kv_cache_manager.h) can share them.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/status.h"

namespace kestrel {

// Sizes of one K/V block across all layers, for sizing the pool from a memory budget.
struct KvCacheSpec {
  int64_t n_layers = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size_tokens = 16;
  int64_t bytes_per_element = 4;

  int64_t bytes_per_token() const {
    return 2 * n_layers * n_kv_heads * head_dim * bytes_per_element;
  }
  int64_t bytes_per_block() const { return bytes_per_token() * block_size_tokens; }
  int64_t BlocksForBudget(int64_t budget_bytes) const { return budget_bytes / bytes_per_block(); }
};

// Free blocks wait in an O(1) doubly-linked LRU list: Allocate takes the head (the block freed
// longest ago), Release appends at the tail, or at the head for a block that holds nothing worth
// keeping. The prefix cache (kv_cache_manager.h) relies on this order: a freed block that still
// holds a cached prefix stays findable until it reaches the head and is reused, and Revive takes
// such a block back out of the middle of the list.
enum class FreePosition {
  kEvictLast,   // tail: most recently used, reused last (holds a cached prefix)
  kEvictFirst,  // head: reused first (holds nothing reusable)
};

class BlockPool {
 public:
  explicit BlockPool(int32_t n_blocks);

  int32_t n_blocks() const { return static_cast<int32_t>(ref_counts_.size()); }
  int32_t n_free() const { return n_free_; }
  int32_t n_used() const { return n_blocks() - n_free(); }

  std::optional<int32_t> Allocate();  // the LRU head; ref count 1
  void AddRef(int32_t block);         // block must be in use
  // Drops one reference; at 0 the block joins the free list at `where`.
  void Release(int32_t block, FreePosition where = FreePosition::kEvictLast);
  // Takes a reference to a block that may be free (it leaves the free list) or in use.
  void Revive(int32_t block);
  int32_t ref_count(int32_t block) const;
  bool is_free(int32_t block) const { return ref_count(block) == 0; }
  // Free block ids from the head (next to be allocated) to the tail; O(n_free), for tests.
  std::vector<int32_t> FreeListOrder() const;

 private:
  void Unlink(int32_t block);
  void LinkBefore(int32_t block, int32_t next);  // next == sentinel() appends at the tail

  int32_t sentinel() const { return n_blocks(); }

  std::vector<int32_t> ref_counts_;  // [n_blocks]
  // Doubly-linked free list over block ids; index n_blocks is the sentinel (head = next_[s]).
  std::vector<int32_t> prev_;  // [n_blocks + 1]
  std::vector<int32_t> next_;  // [n_blocks + 1]
  int32_t n_free_ = 0;
};

}  // namespace kestrel
