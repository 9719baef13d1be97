// The responses of /v1/responses kept in memory for `previous_response_id` and
// GET /v1/responses/{id}: bounded by a count and a byte budget, least recently used evicted
// first. Thread-safe. A restart forgets them all (OpenAI keeps them 30 days; a client that
// continues a forgotten response gets a 400 naming previous_response_id).
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include <nlohmann/json.hpp>

namespace kestrel::server {

class ResponseStore {
 public:
  struct Entry {
    nlohmann::ordered_json response;  // the response object as it was answered
    // The conversation a follow-up continues, as chat messages: the input of this response
    // (after its own previous_response_id), then its output. Instructions are not included:
    // OpenAI does not carry them over.
    nlohmann::ordered_json messages;
  };

  ResponseStore(size_t max_entries, size_t max_bytes);

  void Put(const std::string& id, Entry entry);
  // Marks the entry as recently used. nullptr when unknown (never stored, deleted or evicted).
  std::shared_ptr<const Entry> Get(const std::string& id);
  bool Erase(const std::string& id);
  size_t size() const;
  size_t bytes() const;

 private:
  using Item = std::pair<std::string, std::shared_ptr<const Entry>>;
  void EvictLocked();

  const size_t max_entries_;
  const size_t max_bytes_;
  mutable std::mutex mu_;
  std::list<Item> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<Item>::iterator> index_;
  std::unordered_map<std::string, size_t> sizes_;
  size_t bytes_ = 0;
};

}  // namespace kestrel::server
