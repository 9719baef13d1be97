#include "kv/block_pool.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/check.h"

namespace kestrel {

BlockPool::BlockPool(int32_t n_blocks)
    : ref_counts_(static_cast<size_t>(std::max(n_blocks, 0)), 0) {  // so that the KCHECK fires
  KCHECK(n_blocks >= 0);
  prev_.assign(static_cast<size_t>(n_blocks) + 1, 0);
  next_.assign(static_cast<size_t>(n_blocks) + 1, 0);
  const int32_t s = sentinel();
  prev_[s] = next_[s] = s;
  // Ascending ids from the head so that block 0 is handed out first.
  for (int32_t b = 0; b < n_blocks; ++b) LinkBefore(b, s);
}

void BlockPool::Unlink(int32_t block) {
  next_[prev_[block]] = next_[block];
  prev_[next_[block]] = prev_[block];
  --n_free_;
}

void BlockPool::LinkBefore(int32_t block, int32_t next) {
  const int32_t prev = prev_[next];
  prev_[block] = prev;
  next_[block] = next;
  next_[prev] = block;
  prev_[next] = block;
  ++n_free_;
}

std::optional<int32_t> BlockPool::Allocate() {
  if (n_free_ == 0) return std::nullopt;
  const int32_t b = next_[sentinel()];
  Unlink(b);
  KCHECK(ref_counts_[b] == 0);
  ref_counts_[b] = 1;
  return b;
}

void BlockPool::AddRef(int32_t block) {
  KCHECK(block >= 0 && block < n_blocks());
  KCHECK(ref_counts_[block] > 0);
  ++ref_counts_[block];
}

void BlockPool::Revive(int32_t block) {
  KCHECK(block >= 0 && block < n_blocks());
  if (ref_counts_[block]++ == 0) Unlink(block);
}

void BlockPool::Release(int32_t block, FreePosition where) {
  KCHECK(block >= 0 && block < n_blocks());
  KCHECK_MSG(ref_counts_[block] > 0, "double free of a KV block");
  if (--ref_counts_[block] > 0) return;
  LinkBefore(block, where == FreePosition::kEvictLast ? sentinel() : next_[sentinel()]);
}

int32_t BlockPool::ref_count(int32_t block) const {
  KCHECK(block >= 0 && block < n_blocks());
  return ref_counts_[block];
}

std::vector<int32_t> BlockPool::FreeListOrder() const {
  std::vector<int32_t> order;
  order.reserve(static_cast<size_t>(n_free_));
  for (int32_t b = next_[sentinel()]; b != sentinel(); b = next_[b]) order.push_back(b);
  return order;
}

BlockTable::BlockTable(BlockTable&& other) noexcept
    : pool_(other.pool_), block_size_(other.block_size_), blocks_(std::move(other.blocks_)) {
  other.blocks_.clear();
}

BlockTable& BlockTable::operator=(BlockTable&& other) noexcept {
  if (this != &other) {
    Clear();
    pool_ = other.pool_;
    block_size_ = other.block_size_;
    blocks_ = std::move(other.blocks_);
    other.blocks_.clear();
  }
  return *this;
}

Status BlockTable::EnsureCapacity(int64_t n_tokens) {
  // In 64 bits: a huge request must fail here, not wrap around int32 to "enough blocks".
  const int64_t needed = n_tokens / block_size_ + (n_tokens % block_size_ > 0 ? 1 : 0);
  const int64_t extra = needed - static_cast<int64_t>(blocks_.size());
  if (extra <= 0) return Status::Ok();
  if (extra > pool_->n_free()) {
    return ResourceExhausted("KV cache full: " + std::to_string(n_tokens) + " tokens need " +
                             std::to_string(extra) + " more blocks of " +
                             std::to_string(block_size_) + " tokens, " +
                             std::to_string(pool_->n_free()) + " free");
  }
  for (int64_t i = 0; i < extra; ++i) {
    std::optional<int32_t> b = pool_->Allocate();
    KCHECK(b.has_value());
    blocks_.push_back(*b);
  }
  return Status::Ok();
}

int32_t BlockTable::SlotFor(int64_t pos) const {
  KCHECK(pos >= 0);
  size_t idx = static_cast<size_t>(pos / block_size_);
  KCHECK(idx < blocks_.size());
  return blocks_[idx] * block_size_ + static_cast<int32_t>(pos % block_size_);
}

void BlockTable::Clear() {
  for (int32_t b : blocks_) pool_->Release(b);
  blocks_.clear();
}

}  // namespace kestrel
