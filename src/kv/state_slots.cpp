#include "kv/state_slots.h"

#include "core/check.h"

namespace kestrel {

StateSlots::StateSlots(int32_t n_live, int32_t n_snapshots)
    : n_live_(n_live), n_snapshots_(n_snapshots) {
  KCHECK(n_live >= 0 && n_snapshots >= 0);
  // Handed out from the back: slot 0 first.
  for (int32_t s = n_live - 1; s >= 0; --s) free_live_.push_back(s);
  for (int32_t s = n_live + n_snapshots - 1; s >= n_live; --s) free_snapshots_.push_back(s);
  index_.reserve(static_cast<size_t>(n_snapshots));
}

int32_t StateSlots::AcquireLive() {
  KCHECK_MSG(!free_live_.empty(), "more running sequences than live state slots");
  const int32_t s = free_live_.back();
  free_live_.pop_back();
  return s;
}

void StateSlots::ReleaseLive(int32_t slot) {
  KCHECK(slot >= 0 && slot < n_live_);
  free_live_.push_back(slot);
}

std::optional<int32_t> StateSlots::AcquireSnapshot() {
  if (!free_snapshots_.empty()) {
    const int32_t s = free_snapshots_.back();
    free_snapshots_.pop_back();
    return s;
  }
  if (lru_.empty()) return std::nullopt;  // every snapshot slot is being filled
  const Entry victim = lru_.front();
  index_.erase(victim.hash);
  lru_.pop_front();
  ++n_evictions_;
  return victim.slot;
}

void StateSlots::Register(int32_t slot, const BlockHash& hash) {
  KCHECK(slot >= n_live_ && slot < n_live_ + n_snapshots_);
  if (index_.contains(hash)) {  // the same prefix was snapshotted meanwhile
    free_snapshots_.push_back(slot);
    return;
  }
  lru_.push_back(Entry{hash, slot});
  index_.emplace(hash, std::prev(lru_.end()));
}

void StateSlots::ReleaseSnapshot(int32_t slot) {
  KCHECK(slot >= n_live_ && slot < n_live_ + n_snapshots_);
  free_snapshots_.push_back(slot);
}

std::optional<int32_t> StateSlots::Find(const BlockHash& hash) {
  auto it = index_.find(hash);
  if (it == index_.end()) return std::nullopt;
  lru_.splice(lru_.end(), lru_, it->second);  // most recently used
  return it->second->slot;
}

void StateSlots::Drop(const BlockHash& hash) {
  auto it = index_.find(hash);
  if (it == index_.end()) return;
  free_snapshots_.push_back(it->second->slot);
  lru_.erase(it->second);
  index_.erase(it);
}

}  // namespace kestrel
