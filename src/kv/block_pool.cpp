#include "kv/block_pool.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/check.h"

namespace kestrel {

BlockPool::BlockPool(int32_t n_blocks)
    : ref_counts_(static_cast<size_t>(std::max(n_blocks, 0)), 0) {  // so that the KCHECK fires
  KCHECK(n_blocks >= 0);
  free_list_.reserve(static_cast<size_t>(n_blocks));
  // Highest id at the bottom so that block 0 is handed out first.
  for (int32_t b = n_blocks - 1; b >= 0; --b) free_list_.push_back(b);
}

std::optional<int32_t> BlockPool::Allocate() {
  if (free_list_.empty()) return std::nullopt;
  int32_t b = free_list_.back();
  free_list_.pop_back();
  KCHECK(ref_counts_[b] == 0);
  ref_counts_[b] = 1;
  return b;
}

void BlockPool::AddRef(int32_t block) {
  KCHECK(block >= 0 && block < n_blocks());
  KCHECK(ref_counts_[block] > 0);
  ++ref_counts_[block];
}

void BlockPool::Release(int32_t block) {
  KCHECK(block >= 0 && block < n_blocks());
  KCHECK_MSG(ref_counts_[block] > 0, "double free of a KV block");
  if (--ref_counts_[block] == 0) free_list_.push_back(block);
}

int32_t BlockPool::ref_count(int32_t block) const {
  KCHECK(block >= 0 && block < n_blocks());
  return ref_counts_[block];
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
