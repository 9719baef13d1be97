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

}  // namespace
}  // namespace kestrel
