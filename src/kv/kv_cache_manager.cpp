#include "kv/kv_cache_manager.h"

#include <algorithm>

#include "core/check.h"

// Header-only xxHash: no library to link. Under -march=native on an AVX-512 machine
// (KESTREL_NATIVE) its AVX-512 loop trips GCC 12's -Wuninitialized inside avx512fintrin.h
// (_mm512_undefined_epi32), which -Werror turns into a failed build; the AVX2 loop gives the same
// hashes (XXH3's value does not depend on the vector width).
#define XXH_INLINE_ALL
#if defined(__AVX512F__) && defined(__AVX2__)
#define XXH_VECTOR XXH_AVX2
#endif
#include <xxhash.h>

namespace kestrel {
namespace {

BlockHash FromXxh(XXH128_hash_t h) {
  return BlockHash{h.low64, h.high64};
}

}  // namespace

BlockHash HashExtraKey(std::string_view extra_key) {
  return FromXxh(XXH3_128bits(extra_key.data(), extra_key.size()));
}

BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> tokens) {
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  KCHECK(XXH3_128bits_reset(&state) == XXH_OK);
  const uint64_t parent_words[2] = {parent.lo, parent.hi};
  KCHECK(XXH3_128bits_update(&state, parent_words, sizeof(parent_words)) == XXH_OK);
  KCHECK(XXH3_128bits_update(&state, tokens.data(), tokens.size_bytes()) == XXH_OK);
  return FromXxh(XXH3_128bits_digest(&state));
}

SeqBlocks::~SeqBlocks() {
  KCHECK_MSG(blocks_.empty(), "a sequence was destroyed holding KV blocks");
}

KvCacheManager::KvCacheManager(const KvCacheConfig& config)
    : pool_(config.n_blocks),
      block_size_(config.block_size_tokens),
      caching_(config.enable_prefix_caching),
      root_(HashExtraKey(config.extra_key)),
      block_hash_(static_cast<size_t>(std::max(config.n_blocks, 0))),
      registered_(static_cast<size_t>(std::max(config.n_blocks, 0)), 0),
      state_(config.n_live_state_slots, config.n_snapshot_slots) {
  KCHECK(block_size_ > 0);
  index_.reserve(static_cast<size_t>(std::max(config.n_blocks, 0)));
}

const BlockHash* KvCacheManager::RegisteredHash(int32_t block) const {
  KCHECK(block >= 0 && block < n_blocks());
  return registered_[block] ? &block_hash_[block] : nullptr;
}

void KvCacheManager::EnsureHashes(SeqBlocks& seq, std::span<const int32_t> tokens,
                                  int32_t n_full_blocks) const {
  KCHECK(static_cast<int64_t>(n_full_blocks) * block_size_ <= static_cast<int64_t>(tokens.size()));
  while (static_cast<int32_t>(seq.hashes_.size()) < n_full_blocks) {
    const size_t i = seq.hashes_.size();
    const BlockHash& parent = i == 0 ? root_ : seq.hashes_[i - 1];
    seq.hashes_.push_back(HashBlock(parent, tokens.subspan(i * static_cast<size_t>(block_size_),
                                                           static_cast<size_t>(block_size_))));
  }
}

int32_t KvCacheManager::CountHits(const SeqBlocks& seq, int32_t max_blocks) const {
  int32_t n = 0;
  while (n < max_blocks && n < static_cast<int32_t>(seq.hashes_.size()) &&
         index_.contains(seq.hashes_[static_cast<size_t>(n)])) {
    ++n;
  }
  return n;
}

int32_t KvCacheManager::FindCachedPrefix(SeqBlocks& seq, std::span<const int32_t> tokens) {
  KCHECK(seq.blocks_.empty());
  if (!caching_ || tokens.empty()) return 0;
  // At most n - 1 tokens, so the last one is computed and gives the logits to sample from.
  const int32_t max_blocks = static_cast<int32_t>((tokens.size() - 1) / block_size_);
  EnsureHashes(seq, tokens, max_blocks);
  int32_t n_hits = CountHits(seq, max_blocks);
  // Hybrid models: only as far as the last cached block whose prefix has a state snapshot.
  if (state_.enabled()) {
    while (n_hits > 0 && !state_.Contains(seq.hashes_[static_cast<size_t>(n_hits - 1)])) --n_hits;
  }
  return n_hits * block_size_;
}

bool KvCacheManager::CanAllocate(const SeqBlocks& seq, int32_t n_cached_tokens,
                                 int64_t n_total_tokens) const {
  KCHECK(n_cached_tokens >= 0 && n_cached_tokens % block_size_ == 0);
  KCHECK(n_cached_tokens == 0 || seq.blocks_.empty());
  KCHECK(n_total_tokens >= n_cached_tokens);
  const int32_t n_hits = n_cached_tokens / block_size_;
  // Cached blocks nobody holds sit in the free list: taking them shrinks it too.
  int32_t n_hits_free = 0;
  for (int32_t i = 0; i < n_hits; ++i) {
    auto it = index_.find(seq.hashes_[static_cast<size_t>(i)]);
    KCHECK_MSG(it != index_.end(), "cached prefix changed between FindCachedPrefix and Allocate");
    if (pool_.is_free(it->second)) ++n_hits_free;
  }
  const int64_t n_fresh = std::max<int64_t>(
      0, (n_total_tokens + block_size_ - 1) / block_size_ - seq.n_blocks() - n_hits);
  if (state_.enabled() && seq.state_slot_ < 0 && state_.n_free_live() == 0) return false;
  return n_fresh + n_hits_free <= pool_.n_free();
}

int32_t KvCacheManager::AllocateFresh() {
  std::optional<int32_t> b = pool_.Allocate();
  KCHECK(b.has_value());
  if (registered_[*b]) {  // evict: its content is about to be overwritten
    auto it = index_.find(block_hash_[*b]);
    KCHECK(it != index_.end() && it->second == *b);
    state_.Drop(block_hash_[*b]);  // a snapshot goes with its block
    index_.erase(it);
    registered_[*b] = 0;
    --n_cached_free_;
  }
  return *b;
}

bool KvCacheManager::Allocate(SeqBlocks& seq, int32_t n_cached_tokens, int64_t n_total_tokens) {
  if (!CanAllocate(seq, n_cached_tokens, n_total_tokens)) return false;
  // Revive the hits first so that the fresh allocations below cannot evict them.
  const int32_t n_hits = n_cached_tokens / block_size_;
  for (int32_t i = 0; i < n_hits; ++i) {
    const int32_t b = index_.at(seq.hashes_[static_cast<size_t>(i)]);
    if (pool_.is_free(b)) --n_cached_free_;
    pool_.Revive(b);
    seq.blocks_.push_back(b);
  }
  if (n_hits > 0) seq.n_registered_ = n_hits;
  if (state_.enabled() && seq.state_slot_ < 0) {
    seq.state_slot_ = state_.AcquireLive();
    if (n_hits > 0) {
      const std::optional<int32_t> snapshot =
          state_.Find(seq.hashes_[static_cast<size_t>(n_hits - 1)]);
      KCHECK_MSG(snapshot.has_value(), "a hybrid prefix hit without its state snapshot");
      seq.restore_from_ = *snapshot;
    }
  }
  const int32_t n_needed = BlocksFor(n_total_tokens);
  while (seq.n_blocks() < n_needed) seq.blocks_.push_back(AllocateFresh());
  return true;
}

void KvCacheManager::CacheFullBlocks(SeqBlocks& seq, std::span<const int32_t> tokens,
                                     int64_t n_computed_tokens) {
  if (!caching_) return;
  KCHECK(n_computed_tokens <= static_cast<int64_t>(tokens.size()));
  const int32_t n_full =
      std::min(static_cast<int32_t>(n_computed_tokens / block_size_), seq.n_blocks());
  if (n_full > seq.n_registered_) {
    EnsureHashes(seq, tokens, n_full);
    for (int32_t i = seq.n_registered_; i < n_full; ++i) {
      const int32_t b = seq.blocks_[static_cast<size_t>(i)];
      KCHECK(!registered_[b]);  // fresh blocks leave the index when allocated
      const BlockHash& h = seq.hashes_[static_cast<size_t>(i)];
      if (index_.try_emplace(h, b).second) {
        block_hash_[b] = h;
        registered_[b] = 1;
      }
    }
    seq.n_registered_ = n_full;
  }
  RegisterSnapshots(seq);
}

void KvCacheManager::RegisterSnapshots(SeqBlocks& seq) {
  auto& pending = seq.pending_snapshots_;
  size_t kept = 0;
  for (const SeqBlocks::PendingSnapshot& p : pending) {
    if (p.block >= seq.n_registered_) {  // its block is not computed yet
      pending[kept++] = p;
      continue;
    }
    const BlockHash& h = seq.hashes_[static_cast<size_t>(p.block)];
    if (p.decode) {
      // A sequence keeps only its latest decode-time snapshot: the one a follow-up turn that
      // extends this conversation can hit.
      if (seq.decode_snapshot_block_ >= 0 && seq.decode_snapshot_block_ != p.block) {
        state_.Drop(seq.hashes_[static_cast<size_t>(seq.decode_snapshot_block_)]);
      }
      seq.decode_snapshot_block_ = p.block;
    }
    state_.Register(p.slot, h);
  }
  pending.resize(kept);
}

int32_t KvCacheManager::TakeStateRestore(SeqBlocks& seq) {
  const int32_t slot = seq.restore_from_;
  seq.restore_from_ = -1;
  return slot;
}

void KvCacheManager::PlanStateSnapshots(SeqBlocks& seq, std::span<const int32_t> known_tokens,
                                        int64_t begin, int64_t end,
                                        std::vector<PlannedSnapshot>* out) {
  if (!caching_ || !state_.enabled() || state_.n_snapshots() == 0 || end <= begin) return;
  // Boundaries p = (j + 1) * block_size with begin < p <= end.
  int64_t j_first = begin / block_size_;
  const int64_t j_last = end / block_size_ - 1;
  if (j_last < j_first) return;
  const bool decode = end - begin == 1;
  // A long prefill chunk keeps only its last boundaries: the pool would evict earlier ones
  // before they could be used.
  const int64_t limit = decode ? 1 : std::max<int64_t>(1, state_.n_snapshots() / 4);
  j_first = std::max(j_first, j_last - limit + 1);
  for (int64_t j = j_first; j <= j_last; ++j) {
    const int64_t boundary = (j + 1) * block_size_;
    if (boundary <= static_cast<int64_t>(known_tokens.size())) {
      EnsureHashes(seq, known_tokens, static_cast<int32_t>(j + 1));
      if (state_.Contains(seq.hashes_[static_cast<size_t>(j)])) continue;
    }
    const std::optional<int32_t> slot = state_.AcquireSnapshot();
    if (!slot) break;
    seq.pending_snapshots_.push_back({static_cast<int32_t>(j), *slot, decode});
    out->push_back({boundary - 1, *slot});
  }
}

void KvCacheManager::Free(SeqBlocks& seq) {
  for (auto it = seq.blocks_.rbegin(); it != seq.blocks_.rend(); ++it) {
    const int32_t b = *it;
    const bool cached = registered_[b] != 0;
    pool_.Release(b, cached ? FreePosition::kEvictLast : FreePosition::kEvictFirst);
    if (cached && pool_.is_free(b)) ++n_cached_free_;
  }
  seq.blocks_.clear();
  seq.n_registered_ = 0;
  if (seq.state_slot_ >= 0) state_.ReleaseLive(seq.state_slot_);
  seq.state_slot_ = -1;
  seq.restore_from_ = -1;
  for (const SeqBlocks::PendingSnapshot& p : seq.pending_snapshots_) state_.ReleaseSnapshot(p.slot);
  seq.pending_snapshots_.clear();
}

int32_t KvCacheManager::SlotFor(const SeqBlocks& seq, int64_t pos) const {
  KCHECK(pos >= 0);
  const size_t idx = static_cast<size_t>(pos / block_size_);
  KCHECK(idx < seq.blocks_.size());
  return seq.blocks_[idx] * block_size_ + static_cast<int32_t>(pos % block_size_);
}

}  // namespace kestrel
