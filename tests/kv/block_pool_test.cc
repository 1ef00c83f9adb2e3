#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <random>

#include "base/error.h"
#include "kv/block_table.h"

namespace kvc::kv {
namespace {

KvGeometry small_geometry(DType t = DType::F32) {
  return KvGeometry{5, 4, 8, 16, t};
}

void expect_balanced(const BlockPool& pool) {
  const PoolCounts c = pool.counts();
  EXPECT_EQ(c.free + c.cached + c.referenced, c.total);
}

TEST(KvGeometry, BytesFollowTheLayout) {
  const KvGeometry g = small_geometry();
  EXPECT_EQ(g.bytes_per_token(), 5u * 2 * 4 * 8 * 4);  // stories260K: 1280 B/token in f32
  EXPECT_EQ(g.bytes_per_block(), 1280u * 16);
  EXPECT_EQ(g.blocks_for_tokens(0), 0u);
  EXPECT_EQ(g.blocks_for_tokens(17), 2u);
  // [layer][K|V][kv_head][token][head_dim]
  EXPECT_EQ(g.offset(0, 0, 0, 1), 8u * 4);
  EXPECT_EQ(g.offset(0, 0, 1, 0), 16u * 8 * 4);
  EXPECT_EQ(g.offset(0, 1, 0, 0), 4u * 16 * 8 * 4);
  EXPECT_EQ(g.offset(1, 0, 0, 0), 2u * 4 * 16 * 8 * 4);
  EXPECT_EQ(g.offset(4, 1, 3, 15) + 8 * 4, g.bytes_per_block());
  EXPECT_EQ(small_geometry(DType::F16).bytes_per_token(), 640u);
}

TEST(KvGeometry, RejectsBadShapes) {
  KvGeometry g = small_geometry();
  g.block_tokens = 0;
  EXPECT_THROW(g.validate(), Error);
  g = small_geometry(DType::Q8_0);
  EXPECT_THROW(g.validate(), Error);
}

TEST(BlockPool, SizesArenaToWholeBlocks) {
  const KvGeometry g = small_geometry();
  BlockPool pool(g, g.bytes_per_block() * 10 + 100);
  EXPECT_EQ(pool.num_blocks(), 10u);
  EXPECT_EQ(pool.arena_bytes(), g.bytes_per_block() * 10);
  EXPECT_THROW(BlockPool(g, g.bytes_per_block() - 1), Error);
}

TEST(BlockPool, AllocatesUntilExhaustedAndRecycles) {
  const KvGeometry g = small_geometry();
  BlockPool pool(g, g.bytes_per_block() * 4);
  std::vector<BlockId> got;
  while (auto id = pool.allocate()) got.push_back(*id);
  EXPECT_EQ(got.size(), 4u);
  EXPECT_EQ(pool.counts().free, 0u);
  expect_balanced(pool);
  pool.retain(got[0]);
  pool.release(got[0]);
  EXPECT_EQ(pool.state(got[0]), BlockState::kReferenced);
  pool.release(got[0]);
  EXPECT_EQ(pool.state(got[0]), BlockState::kFree);
  pool.set_cacheable(got[1], true);
  pool.release(got[1]);
  EXPECT_EQ(pool.state(got[1]), BlockState::kCached);
  EXPECT_EQ(pool.counts().cached, 1u);
  pool.retain(got[1]);  // a cache hit takes the block back
  EXPECT_EQ(pool.state(got[1]), BlockState::kReferenced);
  pool.release(got[1]);
  pool.free_cached(got[1]);
  expect_balanced(pool);
  EXPECT_EQ(pool.counts().free, 2u);
  EXPECT_THROW(pool.release(got[0]), Error);
  EXPECT_THROW(pool.retain(got[0]), Error);
  EXPECT_THROW(pool.state(99), Error);
}

TEST(BlockPool, BlocksDoNotOverlap) {
  const KvGeometry g = small_geometry();
  BlockPool pool(g, g.bytes_per_block() * 3);
  const BlockId a = *pool.allocate(), b = *pool.allocate();
  EXPECT_EQ(static_cast<size_t>(std::abs(pool.data(a) - pool.data(b))), g.bytes_per_block());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pool.data(a)) % 64, 0u);
}

TEST(BlockTable, ReservesWholeBlocksAndRollsBackOnFailure) {
  const KvGeometry g = small_geometry();
  BlockPool pool(g, g.bytes_per_block() * 5);
  {
    BlockTable t(pool);
    EXPECT_TRUE(t.reserve(33));
    EXPECT_EQ(t.blocks().size(), 3u);
    EXPECT_EQ(t.capacity_tokens(), 48u);
    EXPECT_EQ(t.slot_of(33), 1);
    EXPECT_EQ(t.block_of(33), t.blocks()[2]);
    BlockTable other(pool);
    EXPECT_FALSE(other.reserve(48));  // needs 3, only 2 free: nothing kept
    EXPECT_EQ(other.blocks().size(), 0u);
    EXPECT_EQ(pool.counts().free, 2u);
    BlockTable moved = std::move(t);
    EXPECT_EQ(moved.blocks().size(), 3u);
    expect_balanced(pool);
  }
  EXPECT_EQ(pool.counts().free, 5u);  // every table released its blocks
}

// Random reserve/clear sequences keep the accounting invariant at every step.
TEST(BlockTable, RandomWorkloadNeverLeaks) {
  const KvGeometry g = small_geometry();
  BlockPool pool(g, g.bytes_per_block() * 40);
  std::mt19937 rng(11);
  std::vector<BlockTable> tables;
  for (int i = 0; i < 8; ++i) tables.emplace_back(pool);
  for (int step = 0; step < 5000; ++step) {
    BlockTable& t = tables[rng() % tables.size()];
    if (rng() % 4 == 0) {
      t.clear();
    } else {
      t.reserve(t.capacity_tokens() + rng() % 40);
    }
    expect_balanced(pool);
    size_t held = 0;
    for (const auto& tab : tables) held += tab.blocks().size();
    ASSERT_EQ(held, pool.counts().referenced);
  }
  for (auto& t : tables) t.clear();
  EXPECT_EQ(pool.counts().free, pool.num_blocks());
}

}  // namespace
}  // namespace kvc::kv
