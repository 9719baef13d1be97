#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "kv/block_pool.h"

namespace kestrel {
namespace {

// ---------------------------------------------------------------- KvCacheSpec

TEST(KvCacheSpecTest, BytesPerTokenAndBlock) {
  // A Qwen3-8B-like cache in bf16: 36 layers, 8 KV heads of 128.
  KvCacheSpec spec{.n_layers = 36,
                   .n_kv_heads = 8,
                   .head_dim = 128,
                   .block_size_tokens = 16,
                   .bytes_per_element = 2};
  EXPECT_EQ(spec.bytes_per_token(), 2 * 36 * 8 * 128 * 2);  // K and V
  EXPECT_EQ(spec.bytes_per_token(), 147456);
  EXPECT_EQ(spec.bytes_per_block(), 147456 * 16);
}

TEST(KvCacheSpecTest, BlocksForBudgetRoundsDown) {
  KvCacheSpec spec{.n_layers = 2,
                   .n_kv_heads = 1,
                   .head_dim = 4,
                   .block_size_tokens = 16,
                   .bytes_per_element = 4};
  const int64_t block = spec.bytes_per_block();
  EXPECT_EQ(block, 2 * 2 * 1 * 4 * 4 * 16);
  EXPECT_EQ(spec.BlocksForBudget(0), 0);
  EXPECT_EQ(spec.BlocksForBudget(block - 1), 0);
  EXPECT_EQ(spec.BlocksForBudget(block), 1);
  EXPECT_EQ(spec.BlocksForBudget(10 * block + block - 1), 10);
  // 64-bit budgets: 100 GiB of an 8B-class bf16 cache.
  KvCacheSpec big{.n_layers = 36,
                  .n_kv_heads = 8,
                  .head_dim = 128,
                  .block_size_tokens = 16,
                  .bytes_per_element = 2};
  EXPECT_EQ(big.BlocksForBudget(int64_t{100} << 30), (int64_t{100} << 30) / 2359296);
}

// ---------------------------------------------------------------- BlockPool

TEST(BlockPoolTest, AllocatesEveryBlockOnceLowestFirst) {
  BlockPool pool(5);
  EXPECT_EQ(pool.n_blocks(), 5);
  EXPECT_EQ(pool.n_free(), 5);
  EXPECT_EQ(pool.n_used(), 0);
  for (int32_t b = 0; b < 5; ++b) {
    std::optional<int32_t> got = pool.Allocate();
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(*got, b);
    EXPECT_EQ(pool.ref_count(b), 1);
    EXPECT_EQ(pool.n_used(), b + 1);
  }
  EXPECT_FALSE(pool.Allocate().has_value());
  EXPECT_EQ(pool.n_free(), 0);
  EXPECT_FALSE(pool.Allocate().has_value());  // failing twice changes nothing
  EXPECT_EQ(pool.n_used(), 5);
}

TEST(BlockPoolTest, ReleasedBlocksAreReusedLeastRecentFirst) {
  BlockPool pool(4);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(pool.Allocate().has_value());
  pool.Release(2);
  pool.Release(0);
  EXPECT_EQ(pool.n_free(), 2);
  EXPECT_EQ(pool.ref_count(2), 0);
  EXPECT_EQ(pool.FreeListOrder(), (std::vector<int32_t>{2, 0}));
  EXPECT_EQ(pool.Allocate(), std::optional<int32_t>(2));
  EXPECT_EQ(pool.Allocate(), std::optional<int32_t>(0));
  EXPECT_FALSE(pool.Allocate().has_value());
}

TEST(BlockPoolTest, EvictFirstGoesToTheHead) {
  BlockPool pool(4);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(pool.Allocate().has_value());
  pool.Release(1);                             // [1]
  pool.Release(3);                             // [1, 3]
  pool.Release(0, FreePosition::kEvictFirst);  // [0, 1, 3]
  pool.Release(2, FreePosition::kEvictLast);   // [0, 1, 3, 2]
  EXPECT_EQ(pool.FreeListOrder(), (std::vector<int32_t>{0, 1, 3, 2}));
  EXPECT_EQ(pool.Allocate(), std::optional<int32_t>(0));
  EXPECT_EQ(pool.Allocate(), std::optional<int32_t>(1));
  EXPECT_EQ(pool.Allocate(), std::optional<int32_t>(3));
  EXPECT_EQ(pool.Allocate(), std::optional<int32_t>(2));
}

TEST(BlockPoolTest, ReviveTakesABlockOutOfTheMiddleOfTheFreeList) {
  BlockPool pool(5);
  EXPECT_EQ(pool.FreeListOrder(), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  pool.Revive(2);  // free -> in use, in O(1)
  EXPECT_EQ(pool.ref_count(2), 1);
  EXPECT_FALSE(pool.is_free(2));
  EXPECT_EQ(pool.n_free(), 4);
  EXPECT_EQ(pool.FreeListOrder(), (std::vector<int32_t>{0, 1, 3, 4}));
  pool.Revive(2);  // in use: one more reference
  EXPECT_EQ(pool.ref_count(2), 2);
  pool.Revive(0);  // the head
  pool.Revive(4);  // the tail
  EXPECT_EQ(pool.FreeListOrder(), (std::vector<int32_t>{1, 3}));
  pool.Release(2);
  pool.Release(2);
  EXPECT_EQ(pool.FreeListOrder(), (std::vector<int32_t>{1, 3, 2}));
  EXPECT_EQ(pool.Allocate(), std::optional<int32_t>(1));
  EXPECT_EQ(pool.Allocate(), std::optional<int32_t>(3));
  EXPECT_EQ(pool.Allocate(), std::optional<int32_t>(2));
  EXPECT_FALSE(pool.Allocate().has_value());
  EXPECT_EQ(pool.n_used(), 5);
}

TEST(BlockPoolTest, RefCountsKeepSharedBlocksAlive) {
  BlockPool pool(2);
  int32_t b = *pool.Allocate();
  pool.AddRef(b);
  pool.AddRef(b);
  EXPECT_EQ(pool.ref_count(b), 3);
  pool.Release(b);
  pool.Release(b);
  EXPECT_EQ(pool.ref_count(b), 1);
  EXPECT_EQ(pool.n_free(), 1);  // still held
  pool.Release(b);
  EXPECT_EQ(pool.ref_count(b), 0);
  EXPECT_EQ(pool.n_free(), 2);
}

TEST(BlockPoolTest, EmptyPool) {
  BlockPool pool(0);
  EXPECT_EQ(pool.n_blocks(), 0);
  EXPECT_FALSE(pool.Allocate().has_value());
  BlockTable table(&pool, 16);
  EXPECT_TRUE(table.EnsureCapacity(0).ok());
  EXPECT_EQ(table.EnsureCapacity(1).code(), StatusCode::kResourceExhausted);
}

TEST(BlockPoolDeathTest, MisuseIsCaught) {
  BlockPool pool(2);
  int32_t b = *pool.Allocate();
  pool.Release(b);
  EXPECT_DEATH(pool.Release(b), "double free");
  EXPECT_DEATH(pool.AddRef(b), "ref_counts_");  // a free block cannot gain a reference
  EXPECT_DEATH(pool.Release(7), "block < n_blocks");
  EXPECT_DEATH(pool.ref_count(-1), "block >= 0");
  EXPECT_DEATH(BlockPool(-1), "");
}

// ---------------------------------------------------------------- BlockTable

TEST(BlockTableTest, CapacityGrowsByWholeBlocks) {
  BlockPool pool(8);
  BlockTable table(&pool, 16);
  EXPECT_EQ(table.BlocksNeeded(0), 0);
  EXPECT_EQ(table.BlocksNeeded(1), 1);
  EXPECT_EQ(table.BlocksNeeded(16), 1);
  EXPECT_EQ(table.BlocksNeeded(17), 2);
  ASSERT_TRUE(table.EnsureCapacity(0).ok());
  EXPECT_TRUE(table.blocks().empty());
  ASSERT_TRUE(table.EnsureCapacity(16).ok());
  EXPECT_EQ(table.blocks().size(), 1u);
  ASSERT_TRUE(table.EnsureCapacity(17).ok());
  EXPECT_EQ(table.blocks().size(), 2u);
  ASSERT_TRUE(table.EnsureCapacity(5).ok());  // never shrinks
  EXPECT_EQ(table.blocks().size(), 2u);
  EXPECT_EQ(pool.n_used(), 2);
  EXPECT_EQ(table.block_size_tokens(), 16);
}

TEST(BlockTableTest, CapacityErrorLeavesEverythingUnchanged) {
  BlockPool pool(4);
  BlockTable a(&pool, 16), b(&pool, 16);
  ASSERT_TRUE(a.EnsureCapacity(40).ok());  // 3 blocks
  const std::vector<int32_t> before = a.blocks();
  Status s = a.EnsureCapacity(16 * 5);  // needs 2 more, 1 free
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(s.message().empty());
  EXPECT_EQ(a.blocks(), before);
  EXPECT_EQ(pool.n_free(), 1);
  EXPECT_EQ(b.EnsureCapacity(17).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(b.blocks().empty());
  EXPECT_EQ(pool.n_free(), 1);
  ASSERT_TRUE(a.EnsureCapacity(64).ok());  // exactly the last block
  EXPECT_EQ(pool.n_free(), 0);
}

TEST(BlockTableTest, HugeRequestsFailInsteadOfWrapping) {
  // 2^36 tokens need 2^32 blocks: a count that does not fit in 32 bits must not wrap to 0.
  BlockPool pool(4);
  BlockTable table(&pool, 16);
  EXPECT_EQ(table.EnsureCapacity(int64_t{16} << 32).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(table.EnsureCapacity((int64_t{1} << 35) + 1).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(table.blocks().empty());
  EXPECT_EQ(pool.n_free(), 4);
}

TEST(BlockTableTest, SlotForMapsPositionsThroughTheTable) {
  BlockPool pool(6);
  // Rotate the free list so that the table's blocks are not 0, 1, 2.
  BlockTable other(&pool, 4);
  ASSERT_TRUE(other.EnsureCapacity(12).ok());  // blocks 0, 1, 2
  other.Clear();                               // free list now 3, 4, 5, 0, 1, 2
  BlockTable filler(&pool, 4);
  ASSERT_TRUE(filler.EnsureCapacity(4).ok());  // takes 3
  BlockTable table(&pool, 4);
  ASSERT_TRUE(table.EnsureCapacity(10).ok());  // 3 blocks: 4, 5, 0
  EXPECT_EQ(table.blocks(), (std::vector<int32_t>{4, 5, 0}));
  ASSERT_EQ(table.blocks().size(), 3u);
  for (int64_t pos = 0; pos < 12; ++pos) {
    const int32_t block = table.blocks()[static_cast<size_t>(pos / 4)];
    EXPECT_EQ(table.SlotFor(pos), block * 4 + pos % 4) << pos;
  }
  std::set<int32_t> slots;
  for (int64_t pos = 0; pos < 12; ++pos) slots.insert(table.SlotFor(pos));
  EXPECT_EQ(slots.size(), 12u);  // distinct
  for (int64_t pos = 0; pos < 4; ++pos) EXPECT_EQ(slots.count(filler.SlotFor(pos)), 0u);
}

TEST(BlockTableDeathTest, SlotForOutsideTheTableIsABug) {
  BlockPool pool(2);
  BlockTable table(&pool, 16);
  ASSERT_TRUE(table.EnsureCapacity(16).ok());
  EXPECT_DEATH(table.SlotFor(16), "idx < blocks_");
  EXPECT_DEATH(table.SlotFor(-1), "pos >= 0");
}

TEST(BlockTableTest, ClearAndDestructorReleaseBlocks) {
  BlockPool pool(8);
  {
    BlockTable table(&pool, 16);
    ASSERT_TRUE(table.EnsureCapacity(100).ok());  // 7 blocks
    EXPECT_EQ(pool.n_used(), 7);
    table.Clear();
    EXPECT_EQ(pool.n_used(), 0);
    EXPECT_TRUE(table.blocks().empty());
    ASSERT_TRUE(table.EnsureCapacity(20).ok());
    EXPECT_EQ(pool.n_used(), 2);
  }
  EXPECT_EQ(pool.n_used(), 0);
}

TEST(BlockTableTest, SharedBlocksOutliveTheTable) {
  BlockPool pool(4);
  int32_t shared = -1;
  {
    BlockTable table(&pool, 16);
    ASSERT_TRUE(table.EnsureCapacity(32).ok());
    shared = table.blocks()[0];
    pool.AddRef(shared);  // e.g. the prefix cache keeps it
  }
  EXPECT_EQ(pool.ref_count(shared), 1);
  EXPECT_EQ(pool.n_used(), 1);
  pool.Release(shared);
  EXPECT_EQ(pool.n_used(), 0);
}

TEST(BlockTableTest, MoveTransfersOwnership) {
  BlockPool pool(8);
  BlockTable a(&pool, 16);
  ASSERT_TRUE(a.EnsureCapacity(40).ok());
  const std::vector<int32_t> blocks = a.blocks();
  BlockTable b(std::move(a));
  EXPECT_EQ(b.blocks(), blocks);
  EXPECT_TRUE(a.blocks().empty());  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(pool.n_used(), 3);

  BlockTable c(&pool, 16);
  ASSERT_TRUE(c.EnsureCapacity(16).ok());
  EXPECT_EQ(pool.n_used(), 4);
  c = std::move(b);  // c's own block is released
  EXPECT_EQ(c.blocks(), blocks);
  EXPECT_EQ(pool.n_used(), 3);
  // The moved-from table is still usable.
  ASSERT_TRUE(b.EnsureCapacity(1).ok());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(pool.n_used(), 4);
  BlockTable& alias = c;
  c = std::move(alias);  // self-move keeps the blocks
  EXPECT_EQ(c.blocks(), blocks);
  EXPECT_EQ(pool.n_used(), 4);
}

// Thousands of random operations (fixed seed) checked against a model of who holds what.
TEST(BlockPoolTest, RandomOperationsKeepExactAccounting) {
  constexpr int32_t kBlocks = 48;
  constexpr int32_t kBlockSize = 4;
  constexpr size_t kTables = 6;
  BlockPool pool(kBlocks);
  std::vector<std::unique_ptr<BlockTable>> tables;
  for (size_t i = 0; i < kTables; ++i)
    tables.push_back(std::make_unique<BlockTable>(&pool, kBlockSize));
  std::vector<int32_t> extra_refs;  // references held outside tables (a prefix cache)
  std::mt19937 gen(20240607);
  int n_failed_allocations = 0;

  auto check = [&]() {
    std::map<int32_t, int32_t> expected_refs;
    std::set<int32_t> in_tables;
    for (const auto& t : tables) {
      for (int32_t b : t->blocks()) {
        ++expected_refs[b];
        ASSERT_TRUE(in_tables.insert(b).second) << "block " << b << " in two tables";
      }
    }
    for (int32_t b : extra_refs) ++expected_refs[b];
    ASSERT_EQ(pool.n_used(), static_cast<int32_t>(expected_refs.size()));
    const std::vector<int32_t> order = pool.FreeListOrder();
    ASSERT_EQ(static_cast<int32_t>(order.size()), pool.n_free());
    ASSERT_EQ(std::set<int32_t>(order.begin(), order.end()).size(), order.size());
    for (int32_t b : order) ASSERT_EQ(expected_refs.count(b), 0u) << "free block " << b << " held";
    for (int32_t b = 0; b < kBlocks; ++b) {
      auto it = expected_refs.find(b);
      ASSERT_EQ(pool.ref_count(b), it == expected_refs.end() ? 0 : it->second) << "block " << b;
    }
  };

  for (int op = 0; op < 6000; ++op) {
    BlockTable& t = *tables[gen() % kTables];
    switch (gen() % 8) {
      case 0:
      case 1:
      case 2: {  // grow
        const int64_t n_tokens = static_cast<int64_t>(gen() % 80);
        const std::vector<int32_t> before = t.blocks();
        const int32_t extra =
            std::max(0, t.BlocksNeeded(n_tokens) - static_cast<int32_t>(before.size()));
        const int32_t free_before = pool.n_free();
        Status s = t.EnsureCapacity(n_tokens);
        ASSERT_EQ(s.ok(), extra <= free_before);
        if (s.ok()) {
          ASSERT_EQ(static_cast<int64_t>(t.blocks().size()) * kBlockSize >= n_tokens, true);
          ASSERT_EQ(pool.n_free(), free_before - extra);
          ASSERT_TRUE(std::equal(before.begin(), before.end(), t.blocks().begin()));
        } else {
          ++n_failed_allocations;
          ASSERT_EQ(t.blocks(), before);
          ASSERT_EQ(pool.n_free(), free_before);
        }
        break;
      }
      case 3:
        t.Clear();
        break;
      case 4: {  // move one table into another slot (the target's blocks are released)
        const size_t from = gen() % kTables, to = gen() % kTables;
        if (gen() % 2 == 0) {
          *tables[to] = std::move(*tables[from]);
        } else {
          auto moved = std::make_unique<BlockTable>(std::move(*tables[from]));
          tables[to] = std::move(moved);  // destroys the old table at `to`
          if (from != to) tables[from] = std::make_unique<BlockTable>(&pool, kBlockSize);
        }
        break;
      }
      case 5:  // share a block
        if (!t.blocks().empty()) {
          const int32_t b = t.blocks()[gen() % t.blocks().size()];
          pool.AddRef(b);
          extra_refs.push_back(b);
        }
        break;
      case 6:
      case 7:  // drop a shared reference
        if (!extra_refs.empty()) {
          const size_t i = gen() % extra_refs.size();
          pool.Release(extra_refs[i]);
          extra_refs.erase(extra_refs.begin() + static_cast<std::ptrdiff_t>(i));
        }
        break;
    }
    if (op % 10 == 0) check();
    if (HasFatalFailure()) return;
  }
  check();
  EXPECT_GT(n_failed_allocations, 50);  // the pool ran dry often
  for (auto& t : tables) t->Clear();
  for (int32_t b : extra_refs) pool.Release(b);
  extra_refs.clear();
  check();
  EXPECT_EQ(pool.n_free(), kBlocks);
  for (int32_t b = 0; b < kBlocks; ++b) EXPECT_EQ(pool.ref_count(b), 0);
}

}  // namespace
}  // namespace kestrel
