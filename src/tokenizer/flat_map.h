// Open-addressing hash maps for the tokenizer's hot paths: byte string -> id (vocabulary) and
// (id, id) -> merge (BPE). Insert-only, built once at load time, read concurrently afterwards.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace kestrel::tok {

inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 32;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  return x;
}

// A fast non-cryptographic hash of a byte string (8 bytes per step).
inline uint64_t HashBytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xFF51AFD7ED558CCDull);
  const char* p = s.data();
  size_t n = s.size();
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ Mix64(w)) * 0xC4CEB9FE1A85EC53ull;
    h = (h << 29) | (h >> 35);
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ Mix64(w + n)) * 0xC4CEB9FE1A85EC53ull;
  }
  return Mix64(h);
}

// byte string -> int32 id. Keys live in one arena.
class StringIdMap {
 public:
  void Reserve(size_t n_keys) {
    size_t cap = 16;
    while (cap < n_keys * 2) cap <<= 1;
    Rehash(cap);
  }

  // Inserts or overwrites.
  void Set(std::string_view key, int32_t id) {
    if ((size_ + 1) * 2 > slots_.size()) Rehash(slots_.empty() ? 16 : slots_.size() * 2);
    const uint64_t h = HashBytes(key);
    size_t i = h & (slots_.size() - 1);
    while (slots_[i].id >= 0) {
      if (slots_[i].hash == h && View(slots_[i]) == key) {
        slots_[i].id = id;
        return;
      }
      i = (i + 1) & (slots_.size() - 1);
    }
    slots_[i] = {h, static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(key.size()), id};
    arena_.append(key);
    ++size_;
  }

  // -1 when absent.
  int32_t Find(std::string_view key) const {
    if (slots_.empty()) return -1;
    const uint64_t h = HashBytes(key);
    size_t i = h & (slots_.size() - 1);
    while (slots_[i].id >= 0) {
      if (slots_[i].hash == h && View(slots_[i]) == key) return slots_[i].id;
      i = (i + 1) & (slots_.size() - 1);
    }
    return -1;
  }

  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t offset = 0;
    uint32_t length = 0;
    int32_t id = -1;  // -1: empty
  };
  std::string_view View(const Slot& s) const {
    return std::string_view(arena_.data() + s.offset, s.length);
  }
  void Rehash(size_t cap) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(cap, Slot{});
    for (const Slot& s : old) {
      if (s.id < 0) continue;
      size_t i = s.hash & (cap - 1);
      while (slots_[i].id >= 0) i = (i + 1) & (cap - 1);
      slots_[i] = s;
    }
  }

  std::vector<Slot> slots_;
  std::string arena_;
  size_t size_ = 0;
};

// (left id, right id) -> (rank, merged id).
class PairMap {
 public:
  struct Value {
    uint32_t rank;
    int32_t new_id;
  };

  void Reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    Rehash(cap);
  }

  // Inserts or overwrites (a later duplicate merge wins, as in HF).
  void Set(int32_t a, int32_t b, Value v) {
    if ((size_ + 1) * 2 > slots_.size()) Rehash(slots_.empty() ? 16 : slots_.size() * 2);
    const uint64_t key = Key(a, b);
    size_t i = Mix64(key) & (slots_.size() - 1);
    while (slots_[i].key != kEmpty) {
      if (slots_[i].key == key) {
        slots_[i].value = v;
        return;
      }
      i = (i + 1) & (slots_.size() - 1);
    }
    slots_[i] = {key, v};
    ++size_;
  }

  const Value* Find(int32_t a, int32_t b) const {
    const uint64_t key = Key(a, b);
    size_t i = Mix64(key) & (slots_.size() - 1);
    while (true) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.value;
      if (s.key == kEmpty) return nullptr;
      i = (i + 1) & (slots_.size() - 1);
    }
  }

  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t Key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  struct Slot {
    uint64_t key = kEmpty;
    Value value{0, -1};
  };
  void Rehash(size_t cap) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(cap, Slot{});
    for (const Slot& s : old) {
      if (s.key == kEmpty) continue;
      size_t i = Mix64(s.key) & (cap - 1);
      while (slots_[i].key != kEmpty) i = (i + 1) & (cap - 1);
      slots_[i] = s;
    }
  }

  std::vector<Slot> slots_ = std::vector<Slot>(16);
  size_t size_ = 0;
};

}  // namespace kestrel::tok
