// KV block allocation with automatic prefix caching (DESIGN.md "Paged KV cache").
//
// A full block is named by a chained 128-bit hash: XXH3-128 of (its parent block's hash, its
// block_size token ids); the first block's parent is the hash of an extra key (the model
// fingerprint), so equal hashes mean equal token prefixes of one model. Registered blocks go in
// an index hash -> block. Blocks are reference counted in the BlockPool; a block freed while it
// still holds a registered hash stays in the index, at the tail of the pool's LRU free list, and
// a later request can take it back (BlockPool::Revive) until the pool hands it out again, at
// which point it leaves the index (eviction). Blocks holding nothing reusable are freed to the
// head of the list so they are reused first; a sequence's blocks are freed tail first, so that
// its last blocks (the least likely to be shared) are evicted before its first.
//
// Lifecycle of one sequence (the scheduler drives it):
//   n = FindCachedPrefix(seq, tokens)      longest cached run of leading full blocks (read-only)
//   Allocate(seq, n, n + chunk)            takes the n/block_size cached blocks, adds fresh ones
//   ... forward computes the chunk ...
//   CacheFullBlocks(seq, tokens, n + chunk) registers the blocks that are now full and computed
//   Allocate(seq, 0, more) / CacheFullBlocks(...) as the sequence grows
//   Free(seq)                              finished, cancelled or preempted
// Blocks are registered only after their K/V are written, so a hit never reads a block that a
// forward of the same step is still filling.
//
// Hybrid models (recurrent layers beside attention, KvCacheConfig::n_live_state_slots > 0): a
// running sequence also holds a live state slot (StateSlots), and the prefix cache pairs block
// hashes with state snapshots taken at block boundaries. A hit is the longest run of cached
// leading blocks whose last block has a snapshot (a KV-only hit without the state of that exact
// prefix is never used); Allocate then records that the snapshot must be copied into the
// sequence's live slot before its next step (TakeStateRestore). PlanStateSnapshots names the
// boundaries a chunk crosses whose state should be kept and the slots to copy it to; they are
// registered with the blocks in CacheFullBlocks, and dropped when their block is evicted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kv/block_hash.h"
#include "kv/block_pool.h"
#include "kv/state_slots.h"

namespace kestrel {

// The KV blocks of one sequence; changed only by KvCacheManager. The owner must hand it to
// KvCacheManager::Free before destroying it (checked).
class SeqBlocks {
 public:
  SeqBlocks() = default;
  ~SeqBlocks();
  SeqBlocks(const SeqBlocks&) = delete;
  SeqBlocks& operator=(const SeqBlocks&) = delete;

  const std::vector<int32_t>& blocks() const { return blocks_; }  // the block table
  int32_t n_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  // Leading blocks that are in the prefix index (taken from it or registered by this sequence).
  int32_t n_registered_blocks() const { return n_registered_; }
  // Chained hashes of the sequence's full blocks computed so far; they depend only on the
  // tokens, so they survive a preemption.
  const std::vector<BlockHash>& block_hashes() const { return hashes_; }
  // Hybrid models: the live state slot while the sequence holds blocks (-1 otherwise).
  int32_t state_slot() const { return state_slot_; }

 private:
  friend class KvCacheManager;
  struct PendingSnapshot {
    int32_t block;  // the state after the sequence's first (block + 1) * block_size tokens
    int32_t slot;
    bool decode;  // taken by a decode step (the sequence keeps only its latest such one)
  };
  std::vector<int32_t> blocks_;
  std::vector<BlockHash> hashes_;
  int32_t n_registered_ = 0;
  int32_t state_slot_ = -1;
  int32_t restore_from_ = -1;  // snapshot slot to copy into state_slot_ before the next step
  std::vector<PendingSnapshot> pending_snapshots_;
  int32_t decode_snapshot_block_ = -1;  // block of the latest registered decode snapshot
};

// A state snapshot a chunk should take: after the token at `position` of the sequence.
struct PlannedSnapshot {
  int64_t position;
  int32_t slot;
};

struct KvCacheConfig {
  int32_t n_blocks = 0;
  int32_t block_size_tokens = 16;
  bool enable_prefix_caching = true;
  std::string extra_key;  // e.g. the model fingerprint
  // Hybrid models: state slots [0, n_live_state_slots) for running sequences, then
  // n_snapshot_slots for prefix-cache snapshots. 0 live slots: a model without recurrent state.
  int32_t n_live_state_slots = 0;
  int32_t n_snapshot_slots = 0;
};

class KvCacheManager {
 public:
  explicit KvCacheManager(const KvCacheConfig& config);
  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  int32_t block_size_tokens() const { return block_size_; }
  int32_t n_blocks() const { return pool_.n_blocks(); }
  int64_t capacity_tokens() const { return int64_t{n_blocks()} * block_size_; }
  bool prefix_caching() const { return caching_; }
  int32_t BlocksFor(int64_t n_tokens) const {
    return static_cast<int32_t>((n_tokens + block_size_ - 1) / block_size_);
  }

  // For a sequence holding no blocks: how many leading tokens of `tokens` the index holds, in
  // whole blocks, never all of `tokens` (the last token is always computed, to get its logits).
  // Takes no reference; pass the result to Allocate before any other call changes the pool.
  int32_t FindCachedPrefix(SeqBlocks& seq, std::span<const int32_t> tokens);

  bool has_state() const { return state_.enabled(); }
  const StateSlots& state_slots() const { return state_; }

  // Whether Allocate(seq, n_cached_tokens, n_total_tokens) would succeed now.
  bool CanAllocate(const SeqBlocks& seq, int32_t n_cached_tokens, int64_t n_total_tokens) const;
  // Makes seq hold slots for its first n_total_tokens tokens: first the cached blocks found by
  // FindCachedPrefix (n_cached_tokens of them, only for a sequence holding no blocks; else 0),
  // then fresh blocks. All or nothing: false, with nothing changed, when the pool is short.
  bool Allocate(SeqBlocks& seq, int32_t n_cached_tokens, int64_t n_total_tokens);

  // After a forward wrote K/V of the first n_computed_tokens of `tokens`: registers the blocks
  // that are now full. A block whose content another block already holds in the index stays
  // unregistered (it is freed like any uncached block).
  void CacheFullBlocks(SeqBlocks& seq, std::span<const int32_t> tokens, int64_t n_computed_tokens);

  // Releases every block of seq (its hashes are kept for a re-admission), its live state slot
  // and the snapshots it has not registered yet.
  void Free(SeqBlocks& seq);

  // Hybrid models. The snapshot slot whose state must be copied into seq.state_slot() before
  // the sequence's next step (after a prefix-cache hit), or -1; cleared by the call.
  int32_t TakeStateRestore(SeqBlocks& seq);
  // For a step that computes positions [begin, end) of seq (known_tokens: its tokens whose ids
  // are known, a prefix of its tokens): the block boundaries inside (begin, end] whose state is
  // worth a snapshot, with the slot each goes to, appended to *out in position order. Skips
  // boundaries whose prefix already has a snapshot, keeps at most max_snapshots_per_chunk of a
  // prefill chunk (the last ones), and none without prefix caching.
  void PlanStateSnapshots(SeqBlocks& seq, std::span<const int32_t> known_tokens, int64_t begin,
                          int64_t end, std::vector<PlannedSnapshot>* out);

  // Global slot (block * block_size + offset) of token position pos of seq.
  int32_t SlotFor(const SeqBlocks& seq, int64_t pos) const;

  int32_t n_free_blocks() const { return pool_.n_free(); }  // allocatable, cached ones included
  int32_t n_used_blocks() const { return pool_.n_used(); }  // referenced by some sequence
  int32_t n_cached_free_blocks() const { return n_cached_free_; }  // free, still findable
  int32_t n_state_snapshots() const { return state_.n_registered(); }
  int32_t n_indexed_blocks() const { return static_cast<int32_t>(index_.size()); }
  const BlockPool& pool() const { return pool_; }
  // The hash a block is registered under, or nullptr.
  const BlockHash* RegisteredHash(int32_t block) const;

 private:
  // Computes seq's chained hashes up to n_full_blocks blocks of tokens.
  void EnsureHashes(SeqBlocks& seq, std::span<const int32_t> tokens, int32_t n_full_blocks) const;
  // Leading blocks of seq.hashes_ present in the index, at most max_blocks.
  int32_t CountHits(const SeqBlocks& seq, int32_t max_blocks) const;
  int32_t AllocateFresh();  // a block from the pool head, evicted from the index if it was cached
  void RegisterSnapshots(SeqBlocks& seq);  // pending snapshots whose blocks are now hashed

  BlockPool pool_;
  int32_t block_size_;
  bool caching_;
  BlockHash root_;
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> index_;
  std::vector<BlockHash> block_hash_;  // [n_blocks] valid where registered_[b]
  std::vector<uint8_t> registered_;    // [n_blocks] 1 if the block is in index_
  int32_t n_cached_free_ = 0;
  StateSlots state_;
};

}  // namespace kestrel
