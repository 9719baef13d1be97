// Bookkeeping of the recurrent-state slots of a hybrid model (the model owns the memory; see
// models/cache_spec.h). Slots [0, n_live) hold the state of running sequences, one each; slots
// [n_live, n_live + n_snapshots) hold prefix-cache snapshots: the state after a prefix that ends
// at a block boundary, found by that block's chained hash (kv_cache_manager.h).
//
// Snapshots are content-addressed and bounded: Acquire takes a free snapshot slot, else evicts
// the least recently used registered snapshot; Register names a filled slot by its block hash
// (a hash that already has a snapshot keeps it and the new slot is released); Find marks a hit
// as most recently used; Drop removes the snapshot of a hash (its block was evicted).
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

#include "kv/block_hash.h"

namespace kestrel {

class StateSlots {
 public:
  StateSlots(int32_t n_live, int32_t n_snapshots);

  int32_t n_live() const { return n_live_; }
  int32_t n_snapshots() const { return n_snapshots_; }
  bool enabled() const { return n_live_ > 0; }

  // Live slots.
  int32_t n_free_live() const { return static_cast<int32_t>(free_live_.size()); }
  int32_t AcquireLive();  // KCHECKs that one is free
  void ReleaseLive(int32_t slot);

  // Snapshot slots.
  std::optional<int32_t>
  AcquireSnapshot();  // free, else the LRU registered one; none if all pending
  void Register(int32_t slot, const BlockHash& hash);
  void ReleaseSnapshot(int32_t slot);                  // an acquired slot that was never registered
  std::optional<int32_t> Find(const BlockHash& hash);  // and marks it most recently used
  bool Contains(const BlockHash& hash) const { return index_.contains(hash); }
  void Drop(const BlockHash& hash);
  int32_t n_registered() const { return static_cast<int32_t>(index_.size()); }
  uint64_t n_evictions() const { return n_evictions_; }

 private:
  struct Entry {
    BlockHash hash;
    int32_t slot;
  };
  int32_t n_live_;
  int32_t n_snapshots_;
  std::vector<int32_t> free_live_;
  std::vector<int32_t> free_snapshots_;
  std::list<Entry> lru_;  // front = least recently used
  std::unordered_map<BlockHash, std::list<Entry>::iterator, BlockHashHasher> index_;
  uint64_t n_evictions_ = 0;
};

}  // namespace kestrel
