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

}  // namespace kestrel
