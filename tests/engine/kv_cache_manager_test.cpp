// KvCacheManager: chained block hashes, prefix lookup, ref counts of shared prefixes, the LRU
// order of freed blocks, eviction, and exact accounting under thousands of random operations.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "kv/kv_cache_manager.h"

namespace kestrel {
namespace {

constexpr int32_t kBs = 4;  // block size of most tests

std::vector<int32_t> Range(int32_t begin, int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), begin);
  return v;
}

KvCacheConfig Config(int32_t n_blocks, bool caching = true) {
  return KvCacheConfig{n_blocks, kBs, caching, "test-model"};
}

// Runs a sequence the way the scheduler does: prefix lookup, allocate, "compute", cache.
int32_t AdmitAndCompute(KvCacheManager& kv, SeqBlocks& seq, const std::vector<int32_t>& tokens) {
  const int32_t n_cached = kv.FindCachedPrefix(seq, tokens);
  EXPECT_TRUE(kv.Allocate(seq, n_cached, static_cast<int64_t>(tokens.size())));
  kv.CacheFullBlocks(seq, tokens, static_cast<int64_t>(tokens.size()));
  return n_cached;
}

TEST(BlockHashTest, ChainDependsOnEveryEarlierTokenAndTheExtraKey) {
  const BlockHash root = HashExtraKey("model-a");
  EXPECT_EQ(root, HashExtraKey("model-a"));
  EXPECT_NE(root, HashExtraKey("model-b"));
  const std::vector<int32_t> a = {1, 2, 3, 4}, b = {1, 2, 3, 5}, c = {5, 6, 7, 8};
  const BlockHash ha = HashBlock(root, a);
  EXPECT_EQ(ha, HashBlock(root, a));                     // deterministic
  EXPECT_NE(ha, HashBlock(root, b));                     // one token differs
  EXPECT_NE(ha, HashBlock(HashExtraKey("model-b"), a));  // other model
  // The same block content after different parents gets different names.
  EXPECT_NE(HashBlock(ha, c), HashBlock(HashBlock(root, b), c));
  EXPECT_NE(HashBlock(root, c), HashBlock(ha, c));
  // Token ids are hashed as 32-bit values, not bytes: 256 is not 0.
  EXPECT_NE(HashBlock(root, std::vector<int32_t>{256, 0, 0, 0}),
            HashBlock(root, std::vector<int32_t>{0, 1, 0, 0}));
  // Both halves carry entropy.
  EXPECT_NE(ha.lo, 0u);
  EXPECT_NE(ha.hi, 0u);
  EXPECT_NE(ha.lo, ha.hi);
}

TEST(KvCacheManagerTest, SequenceHashesAreTheChainOfItsBlocks) {
  KvCacheManager kv(Config(8));
  SeqBlocks seq;
  const std::vector<int32_t> tokens = Range(10, 10);  // 2 full blocks + 2 tokens
  AdmitAndCompute(kv, seq, tokens);
  ASSERT_EQ(seq.block_hashes().size(), 2u);
  const BlockHash h0 = HashBlock(HashExtraKey("test-model"), std::span(tokens).subspan(0, 4));
  EXPECT_EQ(seq.block_hashes()[0], h0);
  EXPECT_EQ(seq.block_hashes()[1], HashBlock(h0, std::span(tokens).subspan(4, 4)));
  EXPECT_EQ(seq.n_registered_blocks(), 2);
  ASSERT_NE(kv.RegisteredHash(seq.blocks()[0]), nullptr);
  EXPECT_EQ(*kv.RegisteredHash(seq.blocks()[0]), h0);
  EXPECT_EQ(kv.RegisteredHash(seq.blocks()[2]), nullptr);  // partial block
  kv.Free(seq);
}

TEST(KvCacheManagerTest, CachedPrefixNeverCoversTheWholePrompt) {
  KvCacheManager kv(Config(16));
  SeqBlocks first;
  const std::vector<int32_t> tokens = Range(0, 12);  // exactly 3 blocks
  EXPECT_EQ(AdmitAndCompute(kv, first, tokens), 0);
  EXPECT_EQ(kv.n_indexed_blocks(), 3);
  kv.Free(first);
  for (int32_t n = 1; n <= 12; ++n) {  // every prefix of the cached tokens as a prompt
    SeqBlocks seq;
    const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + n);
    const int32_t hit = kv.FindCachedPrefix(seq, prompt);
    EXPECT_EQ(hit, (n - 1) / kBs * kBs) << n;
    EXPECT_LT(hit, n);
  }
  SeqBlocks longer;  // one more token: all 3 blocks hit
  std::vector<int32_t> prompt = tokens;
  prompt.push_back(99);
  EXPECT_EQ(kv.FindCachedPrefix(longer, prompt), 12);
}

TEST(KvCacheManagerTest, SharedPrefixBlocksAreReferenceCounted) {
  KvCacheManager kv(Config(16));
  std::vector<int32_t> a = Range(0, 10);  // blocks [0..3][4..7] + 2
  std::vector<int32_t> b = Range(0, 8);
  b.push_back(50);
  b.push_back(51);
  b.push_back(52);
  SeqBlocks sa, sb;
  AdmitAndCompute(kv, sa, a);
  EXPECT_EQ(kv.n_used_blocks(), 3);
  EXPECT_EQ(AdmitAndCompute(kv, sb, b), 8);  // both full blocks of a
  EXPECT_EQ(sb.blocks()[0], sa.blocks()[0]);
  EXPECT_EQ(sb.blocks()[1], sa.blocks()[1]);
  EXPECT_NE(sb.blocks()[2], sa.blocks()[2]);
  EXPECT_EQ(kv.pool().ref_count(sa.blocks()[0]), 2);
  EXPECT_EQ(kv.pool().ref_count(sa.blocks()[1]), 2);
  EXPECT_EQ(kv.pool().ref_count(sa.blocks()[2]), 1);
  EXPECT_EQ(kv.n_used_blocks(), 4);
  const std::vector<int32_t> shared = {sa.blocks()[0], sa.blocks()[1]};
  kv.Free(sa);
  EXPECT_EQ(kv.pool().ref_count(shared[0]), 1);
  EXPECT_EQ(kv.pool().ref_count(shared[1]), 1);
  EXPECT_EQ(kv.n_used_blocks(), 3);         // the shared two and b's own third
  EXPECT_EQ(kv.n_cached_free_blocks(), 0);  // a's third block was partial: nothing cached
  kv.Free(sb);
  EXPECT_EQ(kv.n_used_blocks(), 0);
  EXPECT_EQ(kv.n_cached_free_blocks(), 2);
  EXPECT_EQ(kv.n_free_blocks(), 16);
}

TEST(KvCacheManagerTest, FreedBlocksAreReusedInLruOrderUncachedFirst) {
  KvCacheManager kv(Config(8));
  SeqBlocks s1, s2;
  AdmitAndCompute(kv, s1, Range(0, 9));    // blocks 0,1 cached, 2 partial
  AdmitAndCompute(kv, s2, Range(100, 9));  // blocks 3,4 cached, 5 partial
  EXPECT_EQ(s1.blocks(), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(s2.blocks(), (std::vector<int32_t>{3, 4, 5}));
  kv.Free(s1);
  kv.Free(s2);
  // Uncached blocks at the head (reused first), then s1's cached blocks tail first, then s2's.
  EXPECT_EQ(kv.pool().FreeListOrder(), (std::vector<int32_t>{5, 2, 6, 7, 1, 0, 4, 3}));
  EXPECT_EQ(kv.n_cached_free_blocks(), 4);
  // A 6-block sequence takes the 4 blocks holding nothing, then evicts s1's 2nd block (1), then 0.
  SeqBlocks big;
  ASSERT_TRUE(kv.Allocate(big, 0, 24));
  EXPECT_EQ(big.blocks(), (std::vector<int32_t>{5, 2, 6, 7, 1, 0}));
  EXPECT_EQ(kv.n_indexed_blocks(), 2);  // s1's blocks left the index
  EXPECT_EQ(kv.n_cached_free_blocks(), 2);
  SeqBlocks again1, again2;
  EXPECT_EQ(kv.FindCachedPrefix(again1, Range(0, 9)), 0);
  EXPECT_EQ(kv.FindCachedPrefix(again2, Range(100, 9)), 8);  // s2's prefix is still there
  kv.Free(big);
}

TEST(KvCacheManagerTest, EvictingTheFirstBlockHidesTheRestOfTheChain) {
  KvCacheManager kv(Config(4));
  SeqBlocks s;
  AdmitAndCompute(kv, s, Range(0, 13));  // 3 full blocks cached + 1
  const int32_t first = s.blocks()[0];
  kv.Free(s);  // free order (head..tail): 3, then 2, 1, 0 (tail first)
  EXPECT_EQ(kv.pool().FreeListOrder(), (std::vector<int32_t>{3, 2, 1, 0}));
  // Use up the pool until the first block is evicted.
  SeqBlocks filler;
  ASSERT_TRUE(kv.Allocate(filler, 0, 16));
  EXPECT_EQ(kv.n_indexed_blocks(), 0);
  kv.Free(filler);
  SeqBlocks probe;
  EXPECT_EQ(kv.FindCachedPrefix(probe, Range(0, 13)), 0);
  EXPECT_EQ(kv.RegisteredHash(first), nullptr);
}

TEST(KvCacheManagerTest, AHitTakesAFreeCachedBlockBackOutOfTheFreeList) {
  KvCacheManager kv(Config(4));
  SeqBlocks s;
  AdmitAndCompute(kv, s, Range(0, 9));  // blocks 0,1 cached, 2 partial
  kv.Free(s);
  EXPECT_EQ(kv.n_free_blocks(), 4);
  EXPECT_EQ(kv.n_cached_free_blocks(), 2);
  SeqBlocks t;
  const std::vector<int32_t> prompt = Range(0, 16);
  const int32_t hit = kv.FindCachedPrefix(t, prompt);
  EXPECT_EQ(hit, 8);
  // 16 tokens = 4 blocks: 2 hits (both free, so they count against the free list) + 2 fresh.
  EXPECT_TRUE(kv.CanAllocate(t, hit, 16));
  EXPECT_FALSE(kv.CanAllocate(t, hit, 17));  // a 5th block does not exist
  ASSERT_TRUE(kv.Allocate(t, hit, 16));
  EXPECT_EQ(t.blocks()[0], 0);
  EXPECT_EQ(t.blocks()[1], 1);
  EXPECT_EQ(kv.n_free_blocks(), 0);
  EXPECT_EQ(kv.n_cached_free_blocks(), 0);
  EXPECT_EQ(kv.n_indexed_blocks(), 2);  // the fresh blocks did not evict the hits
  kv.Free(t);
}

TEST(KvCacheManagerTest, AllocateIsAllOrNothing) {
  KvCacheManager kv(Config(4));
  SeqBlocks a, b;
  ASSERT_TRUE(kv.Allocate(a, 0, 9));  // 3 blocks
  EXPECT_FALSE(kv.Allocate(b, 0, 5));
  EXPECT_EQ(b.n_blocks(), 0);
  EXPECT_EQ(kv.n_free_blocks(), 1);
  EXPECT_FALSE(kv.Allocate(a, 0, 17));
  EXPECT_EQ(a.n_blocks(), 3);
  ASSERT_TRUE(kv.Allocate(a, 0, 16));
  EXPECT_EQ(kv.n_free_blocks(), 0);
  ASSERT_TRUE(kv.Allocate(a, 0, 10));  // never shrinks
  EXPECT_EQ(a.n_blocks(), 4);
  kv.Free(a);
  EXPECT_EQ(kv.n_free_blocks(), 4);
}

TEST(KvCacheManagerTest, DuplicateContentStaysUnregisteredAndIsReusedFirst) {
  KvCacheManager kv(Config(8));
  SeqBlocks a, b;
  const std::vector<int32_t> prompt = Range(0, 9);
  // Both admitted before either computed anything: no hit for b.
  ASSERT_EQ(kv.FindCachedPrefix(a, prompt), 0);
  ASSERT_TRUE(kv.Allocate(a, 0, 9));
  ASSERT_EQ(kv.FindCachedPrefix(b, prompt), 0);
  ASSERT_TRUE(kv.Allocate(b, 0, 9));
  kv.CacheFullBlocks(a, prompt, 9);
  kv.CacheFullBlocks(b, prompt, 9);
  EXPECT_EQ(kv.n_indexed_blocks(), 2);
  EXPECT_NE(kv.RegisteredHash(a.blocks()[0]), nullptr);
  EXPECT_EQ(kv.RegisteredHash(b.blocks()[0]), nullptr);
  const std::vector<int32_t> b_blocks = b.blocks();
  kv.Free(b);  // all three of b's blocks hold nothing findable: they go to the head
  const std::vector<int32_t> order = kv.pool().FreeListOrder();
  EXPECT_EQ(std::vector<int32_t>(order.begin(), order.begin() + 3), b_blocks);
  kv.Free(a);
  EXPECT_EQ(kv.n_cached_free_blocks(), 2);
}

TEST(KvCacheManagerTest, CachingCanBeTurnedOff) {
  KvCacheManager kv(Config(8, /*caching=*/false));
  SeqBlocks a, b;
  EXPECT_EQ(AdmitAndCompute(kv, a, Range(0, 9)), 0);
  EXPECT_EQ(kv.n_indexed_blocks(), 0);
  EXPECT_EQ(AdmitAndCompute(kv, b, Range(0, 9)), 0);
  kv.Free(a);
  kv.Free(b);
  EXPECT_EQ(kv.n_cached_free_blocks(), 0);
  EXPECT_EQ(kv.n_free_blocks(), 8);
}

TEST(KvCacheManagerTest, HashesSurviveAFreeAndFindTheSequenceItself) {
  // A preempted sequence keeps its tokens; re-admitted, it finds its own computed blocks,
  // generated tokens included.
  KvCacheManager kv(Config(8));
  SeqBlocks s;
  std::vector<int32_t> tokens = Range(0, 6);
  AdmitAndCompute(kv, s, tokens);
  for (int32_t t = 0; t < 7; ++t) {  // decode 7 tokens: 13 in all, 12 computed
    tokens.push_back(1000 + t);
    ASSERT_TRUE(kv.Allocate(s, 0, static_cast<int64_t>(tokens.size())));
    kv.CacheFullBlocks(s, tokens, static_cast<int64_t>(tokens.size()) - 1);
  }
  EXPECT_EQ(s.n_registered_blocks(), 3);
  kv.Free(s);
  EXPECT_EQ(kv.FindCachedPrefix(s, tokens), 12);
}

TEST(KvCacheManagerDeathTest, MisuseIsCaught) {
  KvCacheManager kv(Config(4));
  SeqBlocks a;
  ASSERT_TRUE(kv.Allocate(a, 0, 4));
  EXPECT_DEATH(kv.FindCachedPrefix(a, Range(0, 8)), "blocks_.empty");
  EXPECT_DEATH(kv.SlotFor(a, 4), "idx < seq.blocks_");
  EXPECT_DEATH(
      {
        SeqBlocks leaked;
        (void)kv.Allocate(leaked, 0, 1);
      },
      "holding KV blocks");
  kv.Free(a);
}

// Thousands of random operations over a small pool, checked after each against a brute-force
// recount: references, the free list, the index and the cached-free counter; no leak at the end.
TEST(KvCacheManagerTest, RandomOperationsLeakNothing) {
  constexpr int32_t kBlocks = 24;
  constexpr size_t kSeqs = 8;
  KvCacheManager kv(Config(kBlocks));
  std::mt19937 gen(1234567);
  struct Slot {
    std::unique_ptr<SeqBlocks> blocks = std::make_unique<SeqBlocks>();
    std::vector<int32_t> tokens;
    int64_t n_computed = 0;
  };
  std::vector<Slot> seqs(kSeqs);
  int n_hits = 0, n_failed = 0, n_evictions_seen = 0;

  auto check = [&]() {
    std::map<int32_t, int32_t> refs;
    for (const Slot& s : seqs)
      for (int32_t b : s.blocks->blocks()) ++refs[b];
    ASSERT_EQ(kv.n_used_blocks(), static_cast<int32_t>(refs.size()));
    int32_t cached_free = 0, indexed = 0;
    for (int32_t b = 0; b < kBlocks; ++b) {
      const auto it = refs.find(b);
      ASSERT_EQ(kv.pool().ref_count(b), it == refs.end() ? 0 : it->second) << b;
      if (kv.RegisteredHash(b) != nullptr) {
        ++indexed;
        if (kv.pool().is_free(b)) ++cached_free;
      }
    }
    ASSERT_EQ(kv.n_indexed_blocks(), indexed);
    ASSERT_EQ(kv.n_cached_free_blocks(), cached_free);
    ASSERT_EQ(static_cast<int32_t>(kv.pool().FreeListOrder().size()), kv.n_free_blocks());
  };

  for (int op = 0; op < 5000; ++op) {
    Slot& s = seqs[gen() % kSeqs];
    const int kind = static_cast<int>(gen() % 10);
    if (s.blocks->n_blocks() == 0 && s.tokens.empty()) {  // a new sequence
      // Prompts share one of three stems so that prefixes collide often.
      const int32_t stem = static_cast<int32_t>(gen() % 3);
      const int32_t n = 1 + static_cast<int32_t>(gen() % 30);
      for (int32_t i = 0; i < n; ++i)
        s.tokens.push_back(i < 12 ? stem * 100 + i : 7000 + static_cast<int32_t>(gen() % 5));
      const int32_t indexed_before = kv.n_indexed_blocks();
      const int32_t hit = kv.FindCachedPrefix(*s.blocks, s.tokens);
      ASSERT_LT(hit, static_cast<int32_t>(s.tokens.size()));
      const int64_t chunk =
          std::min<int64_t>(static_cast<int64_t>(s.tokens.size()), hit + 1 + gen() % 12);
      if (kv.Allocate(*s.blocks, hit, chunk)) {
        n_hits += hit > 0;
        s.n_computed = chunk;
        kv.CacheFullBlocks(*s.blocks, s.tokens, s.n_computed);
        n_evictions_seen += kv.n_indexed_blocks() < indexed_before;
      } else {
        ++n_failed;
        s = Slot{};  // rejected: the slot stays empty
      }
    } else if (kind < 6 && s.blocks->n_blocks() > 0) {  // next chunk or decode token
      if (s.n_computed == static_cast<int64_t>(s.tokens.size())) {
        s.tokens.push_back(static_cast<int32_t>(gen() % 4));  // "sampled"
      }
      const int64_t target =
          std::min<int64_t>(static_cast<int64_t>(s.tokens.size()), s.n_computed + 1 + gen() % 6);
      if (kv.Allocate(*s.blocks, 0, target)) {
        s.n_computed = target;
        kv.CacheFullBlocks(*s.blocks, s.tokens, s.n_computed);
      } else {
        ++n_failed;
      }
    } else if (kind < 8) {  // finish or cancel
      kv.Free(*s.blocks);
      s = Slot{};
    } else {  // preempt: free, keep tokens, recompute later
      kv.Free(*s.blocks);
      s.n_computed = 0;
      const int32_t hit = kv.FindCachedPrefix(*s.blocks, s.tokens);
      if (kv.Allocate(*s.blocks, hit, hit + 1)) {
        s.n_computed = hit + 1;
        kv.CacheFullBlocks(*s.blocks, s.tokens, s.n_computed);
      } else {
        s = Slot{};
      }
    }
    if (op % 7 == 0) check();
    if (HasFatalFailure()) return;
  }
  check();
  EXPECT_GT(n_hits, 100);
  EXPECT_GT(n_failed, 50);
  EXPECT_GT(n_evictions_seen, 10);
  for (Slot& s : seqs) kv.Free(*s.blocks);
  check();
  EXPECT_EQ(kv.n_free_blocks(), kBlocks);
  EXPECT_EQ(kv.n_used_blocks(), 0);
}

// ---- hybrid models: live state slots and state snapshots ------------------------------------

KvCacheConfig HybridConfig(int32_t n_blocks, int32_t n_live, int32_t n_snapshots) {
  KvCacheConfig c = Config(n_blocks);
  c.n_live_state_slots = n_live;
  c.n_snapshot_slots = n_snapshots;
  return c;
}

// Prefill of `tokens` in chunks, taking the planned snapshots; returns the snapshot positions.
std::vector<int64_t> PrefillWithSnapshots(KvCacheManager& kv, SeqBlocks& seq,
                                          const std::vector<int32_t>& tokens, int64_t begin,
                                          int64_t chunk) {
  std::vector<int64_t> positions;
  for (int64_t at = begin; at < static_cast<int64_t>(tokens.size()); at += chunk) {
    const int64_t end = std::min<int64_t>(at + chunk, static_cast<int64_t>(tokens.size()));
    EXPECT_TRUE(kv.Allocate(seq, 0, end));
    std::vector<PlannedSnapshot> planned;
    kv.PlanStateSnapshots(seq, tokens, at, end, &planned);
    for (const PlannedSnapshot& p : planned) {
      EXPECT_GE(p.position, at);
      EXPECT_LT(p.position, end);
      EXPECT_EQ((p.position + 1) % kBs, 0);
      EXPECT_GE(p.slot, kv.state_slots().n_live());
      positions.push_back(p.position);
    }
    kv.CacheFullBlocks(seq, tokens, end);
  }
  return positions;
}

TEST(KvCacheManagerHybridTest, HitsOnlyWhereTheStateOfThatPrefixWasKept) {
  KvCacheManager kv(HybridConfig(32, 2, 8));
  ASSERT_TRUE(kv.has_state());
  const std::vector<int32_t> tokens = Range(100, 22);  // 5 full blocks + 2
  SeqBlocks a;
  EXPECT_EQ(kv.FindCachedPrefix(a, tokens), 0);
  ASSERT_TRUE(kv.Allocate(a, 0, 6));
  EXPECT_GE(a.state_slot(), 0);
  EXPECT_LT(a.state_slot(), 2);
  EXPECT_EQ(kv.TakeStateRestore(a), -1);  // nothing to restore for a cold start
  // Chunks of 6 tokens: boundaries 4, 8, 12, 16, 20 fall inside chunks.
  kv.CacheFullBlocks(a, tokens, 0);
  std::vector<PlannedSnapshot> planned;
  kv.PlanStateSnapshots(a, tokens, 0, 6, &planned);
  ASSERT_EQ(planned.size(), 1u);
  EXPECT_EQ(planned[0].position, 3);
  kv.CacheFullBlocks(a, tokens, 6);
  const std::vector<int64_t> later = PrefillWithSnapshots(kv, a, tokens, 6, 6);
  EXPECT_EQ(later, (std::vector<int64_t>{7, 11, 15, 19}));
  EXPECT_EQ(kv.n_state_snapshots(), 5);

  // Another sequence with the same 18 leading tokens: a hit of 4 blocks (the 5th differs).
  std::vector<int32_t> other = tokens;
  other[18] = 7;
  SeqBlocks b;
  EXPECT_EQ(kv.FindCachedPrefix(b, other), 16);
  ASSERT_TRUE(kv.Allocate(b, 16, 22));
  EXPECT_NE(b.state_slot(), a.state_slot());
  const int32_t restore = kv.TakeStateRestore(b);
  EXPECT_GE(restore, kv.state_slots().n_live());
  EXPECT_EQ(kv.TakeStateRestore(b), -1);  // taken once
  kv.Free(b);
  kv.Free(a);
  EXPECT_EQ(kv.state_slots().n_free_live(), 2);
}

TEST(KvCacheManagerHybridTest, KvWithoutItsStateIsNeverAHit) {
  // No snapshot slots: blocks are cached, but a hybrid model cannot use them.
  KvCacheManager kv(HybridConfig(32, 1, 0));
  const std::vector<int32_t> tokens = Range(0, 20);
  SeqBlocks a;
  AdmitAndCompute(kv, a, tokens);
  kv.Free(a);
  EXPECT_GT(kv.n_cached_free_blocks(), 0);
  SeqBlocks b;
  EXPECT_EQ(kv.FindCachedPrefix(b, tokens), 0);
  ASSERT_TRUE(kv.Allocate(b, 0, 20));
  kv.Free(b);

  // Snapshots at the boundaries 8 and 16 only (chunks [6, 8) and [14, 16)).
  KvCacheManager kv2(HybridConfig(32, 1, 8));
  SeqBlocks c;
  ASSERT_TRUE(kv2.Allocate(c, 0, 20));
  std::vector<PlannedSnapshot> planned;
  kv2.PlanStateSnapshots(c, tokens, 6, 8, &planned);
  kv2.PlanStateSnapshots(c, tokens, 14, 16, &planned);
  ASSERT_EQ(planned.size(), 2u);
  EXPECT_EQ(planned[0].position, 7);
  EXPECT_EQ(planned[1].position, 15);
  kv2.CacheFullBlocks(c, tokens, 20);
  kv2.Free(c);
  EXPECT_EQ(kv2.n_state_snapshots(), 2);
  SeqBlocks d;  // all 20 tokens again: 4 blocks findable, the 4th has a snapshot
  EXPECT_EQ(kv2.FindCachedPrefix(d, tokens), 16);
  std::vector<int32_t> shorter(tokens.begin(), tokens.begin() + 14);
  shorter.push_back(99);
  SeqBlocks e;  // 3 blocks findable, the 3rd (boundary 12) without a snapshot: back to 8
  EXPECT_EQ(kv2.FindCachedPrefix(e, shorter), 8);
}

TEST(KvCacheManagerHybridTest, EvictingABlockDropsItsSnapshotAndSlotsAreBounded) {
  // 6 blocks, 4 snapshot slots.
  KvCacheManager kv(HybridConfig(6, 1, 4));
  const std::vector<int32_t> a_tokens = Range(0, 24);  // all 6 blocks
  SeqBlocks a;
  ASSERT_TRUE(kv.Allocate(a, 0, 24));
  std::vector<PlannedSnapshot> planned;
  kv.PlanStateSnapshots(a, a_tokens, 0, 24, &planned);
  // A chunk keeps at most n_snapshots / 4 = 1 of its boundaries: the last.
  ASSERT_EQ(planned.size(), 1u);
  EXPECT_EQ(planned[0].position, 23);
  kv.CacheFullBlocks(a, a_tokens, 24);
  EXPECT_EQ(kv.n_state_snapshots(), 1);
  kv.Free(a);
  // A sequence with other tokens takes every block: all evicted, and the snapshot with them.
  SeqBlocks b;
  const std::vector<int32_t> b_tokens = Range(1000, 24);
  EXPECT_EQ(kv.FindCachedPrefix(b, b_tokens), 0);
  ASSERT_TRUE(kv.Allocate(b, 0, 24));
  EXPECT_EQ(kv.n_state_snapshots(), 0);
  SeqBlocks probe;
  EXPECT_EQ(kv.FindCachedPrefix(probe, a_tokens), 0);
  kv.Free(b);

  // The snapshot pool is LRU: more boundaries than slots evict the oldest.
  KvCacheManager small(HybridConfig(64, 1, 4));
  const std::vector<int32_t> long_tokens = Range(0, 100);
  SeqBlocks c;
  ASSERT_TRUE(small.Allocate(c, 0, 100));
  for (int64_t at = 0; at < 100; ++at) {  // decode-like steps: every boundary is planned
    std::vector<PlannedSnapshot> p;
    small.PlanStateSnapshots(c, long_tokens, at, at + 1, &p);
    small.CacheFullBlocks(c, long_tokens, at + 1);
  }
  // Decode keeps only the sequence's latest snapshot.
  EXPECT_EQ(small.n_state_snapshots(), 1);
  small.Free(c);
}

}  // namespace
}  // namespace kestrel
