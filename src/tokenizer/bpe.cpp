#include "tokenizer/bpe.h"

#include <algorithm>
#include <atomic>
#include <functional>

namespace kestrel::tok {
namespace {

std::atomic<uint64_t> g_next_instance_id{1};

// Longer words take the heap path; below this the quadratic scan over a small array is faster.
constexpr size_t kSmallWordSymbols = 96;
// Words longer than this are not cached (HF uses the same bound).
constexpr size_t kMaxCachedWordBytes = 256;

// Per-thread cache of merged words for the most recently used model. Lock-free: each thread has
// its own, and a different model simply resets it.
class WordCache {
 public:
  // Bounded per thread (a server may encode on many threads): ~16K words, ~3 MiB at most.
  static constexpr size_t kSlots = 1u << 15;
  static constexpr size_t kMaxEntries = kSlots / 2;
  static constexpr size_t kMaxArenaBytes = 2u << 20;

  void Bind(uint64_t owner) {
    if (owner_ == owner) return;
    owner_ = owner;
    Clear();
  }

  // Appends the cached ids for word and returns true on a hit.
  bool Lookup(std::string_view word, uint64_t hash, std::vector<int32_t>* ids) const {
    if (slots_.empty()) return false;
    size_t i = hash & (kSlots - 1);
    while (slots_[i].key_length != kEmpty) {
      const Slot& s = slots_[i];
      if (s.hash == hash && s.key_length == word.size() &&
          std::string_view(keys_.data() + s.key_offset, s.key_length) == word) {
        ids->insert(ids->end(), ids_.begin() + s.ids_offset,
                    ids_.begin() + s.ids_offset + s.ids_length);
        return true;
      }
      i = (i + 1) & (kSlots - 1);
    }
    return false;
  }

  void Insert(std::string_view word, uint64_t hash, const int32_t* ids, size_t n_ids) {
    if (slots_.empty()) slots_.assign(kSlots, Slot{});
    if (n_entries_ >= kMaxEntries || keys_.size() + ids_.size() * 4 > kMaxArenaBytes) Clear();
    size_t i = hash & (kSlots - 1);
    while (slots_[i].key_length != kEmpty) i = (i + 1) & (kSlots - 1);
    slots_[i] = {hash, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(word.size()),
                 static_cast<uint32_t>(ids_.size()), static_cast<uint32_t>(n_ids)};
    keys_.append(word);
    ids_.insert(ids_.end(), ids, ids + n_ids);
    ++n_entries_;
  }

 private:
  static constexpr uint32_t kEmpty = ~0u;
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_offset = 0;
    uint32_t key_length = kEmpty;
    uint32_t ids_offset = 0;
    uint32_t ids_length = 0;
  };
  void Clear() {
    if (!slots_.empty()) std::fill(slots_.begin(), slots_.end(), Slot{});
    keys_.clear();
    ids_.clear();
    n_entries_ = 0;
  }

  uint64_t owner_ = 0;
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t n_entries_ = 0;
};

thread_local WordCache t_word_cache;
thread_local std::vector<int32_t> t_symbols;

}  // namespace

BpeModel::BpeModel() : instance_id_(g_next_instance_id.fetch_add(1)) {
  for (int32_t& id : byte_ids_) id = -1;
}

void BpeModel::SetVocab(StringIdMap vocab_bytes, const Options& options) {
  vocab_bytes_ = std::move(vocab_bytes);
  options_ = options;
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    byte_ids_[b] = vocab_bytes_.Find(std::string_view(&c, 1));
  }
}

void BpeModel::AddMerge(int32_t left, int32_t right, uint32_t rank, int32_t merged) {
  merges_.Set(left, right, {rank, merged});
}

void BpeModel::InitialSymbols(std::string_view word, std::vector<int32_t>* symbols) const {
  symbols->clear();
  bool pending_unk = false;
  for (const char ch : word) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(ch)];
    if (id >= 0) {
      if (pending_unk) symbols->push_back(*options_.unk_id);
      pending_unk = false;
      symbols->push_back(id);
    } else if (options_.unk_id) {
      // HF: consecutive unknown characters fuse into one unk when fuse_unk is set.
      if (pending_unk && !options_.fuse_unk) symbols->push_back(*options_.unk_id);
      pending_unk = true;
    }
    // Without an unk token, HF drops characters missing from the vocabulary.
  }
  if (pending_unk) symbols->push_back(*options_.unk_id);
}

void BpeModel::MergeSmall(std::vector<int32_t>* symbols) const {
  int32_t* sym = symbols->data();
  size_t n = symbols->size();
  if (n < 2) return;
  constexpr uint32_t kNone = ~0u;
  uint32_t rank[kSmallWordSymbols];  // rank of the pair (sym[i], sym[i+1])
  int32_t merged[kSmallWordSymbols];
  auto lookup = [&](size_t i) {
    const PairMap::Value* v = merges_.Find(sym[i], sym[i + 1]);
    rank[i] = v ? v->rank : kNone;
    merged[i] = v ? v->new_id : -1;
  };
  for (size_t i = 0; i + 1 < n; ++i) lookup(i);
  while (n > 1) {
    size_t best = 0;
    uint32_t best_rank = rank[0];
    for (size_t i = 1; i + 1 < n; ++i) {
      if (rank[i] < best_rank) {
        best_rank = rank[i];
        best = i;
      }
    }
    if (best_rank == kNone) break;
    sym[best] = merged[best];
    for (size_t i = best + 1; i + 1 < n; ++i) sym[i] = sym[i + 1];
    for (size_t i = best; i + 2 < n; ++i) {
      rank[i] = rank[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best > 0) lookup(best - 1);
    if (best + 1 < n) lookup(best);
  }
  symbols->resize(n);
}

namespace {

struct HeapSymbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  bool alive;
};

struct MergeCandidate {
  uint32_t rank;
  int32_t pos;
  int32_t new_id;
  // Lowest rank first, then leftmost (HF's Merge ordering).
  bool operator>(const MergeCandidate& o) const {
    return rank != o.rank ? rank > o.rank : pos > o.pos;
  }
};

// Reused across calls: long words would otherwise allocate on every merge pass.
thread_local std::vector<HeapSymbol> t_heap_symbols;
thread_local std::vector<MergeCandidate> t_heap;

}  // namespace

void BpeModel::MergeHeap(std::vector<int32_t>* symbols) const {
  const size_t n = symbols->size();
  if (n < 2) return;
  std::vector<HeapSymbol>& sym = t_heap_symbols;
  sym.resize(n);
  for (size_t i = 0; i < n; ++i) {
    sym[i] = {(*symbols)[i], static_cast<int32_t>(i) - 1,
              i + 1 < n ? static_cast<int32_t>(i + 1) : -1, true};
  }
  std::vector<MergeCandidate>& heap = t_heap;
  heap.clear();
  const std::greater<MergeCandidate> cmp;
  auto push = [&](int32_t pos) {
    const int32_t next = sym[pos].next;
    if (next < 0) return;
    if (const PairMap::Value* v = merges_.Find(sym[pos].id, sym[next].id)) {
      heap.push_back({v->rank, pos, v->new_id});
      std::push_heap(heap.begin(), heap.end(), cmp);
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    const MergeCandidate top = heap.back();
    heap.pop_back();
    HeapSymbol& left = sym[top.pos];
    if (!left.alive || left.next < 0) continue;
    // Stale entry: the pair at pos changed since it was queued.
    const PairMap::Value* v = merges_.Find(left.id, sym[left.next].id);
    if (v == nullptr || v->new_id != top.new_id) continue;
    HeapSymbol& right = sym[left.next];
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    if (left.prev >= 0) push(left.prev);
    push(top.pos);
  }
  symbols->clear();
  for (int32_t i = 0; i >= 0; i = sym[i].next) symbols->push_back(sym[i].id);
}

void BpeModel::MergeSymbols(std::vector<int32_t>* symbols, bool force_heap) const {
  if (force_heap || symbols->size() > kSmallWordSymbols) {
    MergeHeap(symbols);
  } else {
    MergeSmall(symbols);
  }
}

void BpeModel::EncodeWord(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (word.size() == 1) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(word[0])];
    if (id >= 0) {
      ids->push_back(id);
    } else if (options_.unk_id) {
      ids->push_back(*options_.unk_id);
    }
    return;
  }
  if (options_.ignore_merges) {
    const int32_t id = vocab_bytes_.Find(word);
    if (id >= 0) {
      ids->push_back(id);
      return;
    }
  }
  const bool cacheable = word.size() < kMaxCachedWordBytes;
  uint64_t hash = 0;
  WordCache& cache = t_word_cache;
  if (cacheable) {
    cache.Bind(instance_id_);
    hash = HashBytes(word);
    if (cache.Lookup(word, hash, ids)) return;
  }
  std::vector<int32_t>& symbols = t_symbols;
  InitialSymbols(word, &symbols);
  MergeSymbols(&symbols);
  if (cacheable) cache.Insert(word, hash, symbols.data(), symbols.size());
  ids->insert(ids->end(), symbols.begin(), symbols.end());
}

}  // namespace kestrel::tok
