#include "server/response_store.h"

#include "server/api_error.h"

namespace kestrel::server {
namespace {

size_t EntryBytes(const std::string& id, const ResponseStore::Entry& e) {
  // Serialized size: a fair measure of what the trees hold, computed once per entry.
  return id.size() + Dump(e.response).size() + Dump(e.messages).size();
}

}  // namespace

ResponseStore::ResponseStore(size_t max_entries, size_t max_bytes)
    : max_entries_(max_entries), max_bytes_(max_bytes) {}

void ResponseStore::Put(const std::string& id, Entry entry) {
  const size_t entry_bytes = EntryBytes(id, entry);
  auto shared = std::make_shared<const Entry>(std::move(entry));
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = index_.find(id); it != index_.end()) {
    bytes_ -= sizes_[id];
    lru_.erase(it->second);
    index_.erase(it);
  }
  if (max_entries_ == 0 || entry_bytes > max_bytes_) {
    sizes_.erase(id);
    return;  // never fits
  }
  lru_.emplace_front(id, std::move(shared));
  index_[id] = lru_.begin();
  sizes_[id] = entry_bytes;
  bytes_ += entry_bytes;
  EvictLocked();
}

std::shared_ptr<const ResponseStore::Entry> ResponseStore::Get(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(id);
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

bool ResponseStore::Erase(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(id);
  if (it == index_.end()) return false;
  bytes_ -= sizes_[id];
  sizes_.erase(id);
  lru_.erase(it->second);
  index_.erase(it);
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

size_t ResponseStore::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

void ResponseStore::EvictLocked() {
  while (!lru_.empty() && (lru_.size() > max_entries_ || bytes_ > max_bytes_)) {
    const std::string& id = lru_.back().first;
    bytes_ -= sizes_[id];
    sizes_.erase(id);
    index_.erase(id);
    lru_.pop_back();
  }
}

}  // namespace kestrel::server
