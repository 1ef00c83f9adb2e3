#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <random>

#include "base/error.h"
#include "kv/block_table.h"

namespace kvc::kv {
namespace {

KvGeometry small_geometry(DType t = DType::F32) {
  return KvGeometry{5, 4, 8, 16, t, t};
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
  EXPECT_EQ(g.grouping(0), KvGrouping::kHead);
  EXPECT_EQ(g.run(0, 0, 0).stride, 8u * 4);
  EXPECT_EQ(g.run(0, 0, 1).offset, 16u * 8 * 4);
  EXPECT_EQ(g.run(0, 1, 0).offset, 4u * 16 * 8 * 4);
  EXPECT_EQ(g.run(1, 0, 0).offset, 2u * 4 * 16 * 8 * 4);
  EXPECT_EQ(g.run(4, 1, 3).offset + 16 * 8 * 4, g.bytes_per_block());
  EXPECT_EQ(small_geometry(DType::F16).bytes_per_token(), 640u);
}

// stories260K's heads of 8 values: a q8_0 group holds the 4 KV heads of one token and layer.
TEST(KvGeometry, HeadsShorterThanAGroupShareOnePerToken) {
  KvGeometry g = small_geometry(DType::Q8_0);
  g.validate();
  EXPECT_EQ(g.grouping(0), KvGrouping::kToken);
  EXPECT_EQ(g.token_bytes(0), 34u);
  EXPECT_EQ(g.bytes_per_token(), 5u * 2 * 34);  // 340 B against f16's 640
  // [layer][K|V][token][kv_head * head_dim]: head 3 is elements 24..31 of the token's group.
  EXPECT_EQ(g.run(0, 0, 3).offset, 0u);
  EXPECT_EQ(g.run(0, 0, 3).first, 24);
  EXPECT_EQ(g.run(0, 0, 3).stride, 34u);
  EXPECT_EQ(g.run(0, 1, 0).offset, 16u * 34);
  g.v_dtype = DType::Q4_0;
  EXPECT_EQ(g.bytes_per_token(), 5u * (34 + 18));
  EXPECT_EQ(g.run(1, 0, 0).offset, 16u * (34 + 18));
  EXPECT_EQ(g.run(4, 1, 0).offset + 16 * 18, g.bytes_per_block());
  // Keys f16 (per head), values q8_0 (per token) in one block.
  g.k_dtype = DType::F16;
  EXPECT_EQ(g.grouping(0), KvGrouping::kHead);
  EXPECT_EQ(g.run(0, 1, 0).offset, 16u * 4 * 8 * 2);
}

TEST(KvGeometry, GroupsAlongTheHeadWhenItHoldsWholeGroups) {
  const KvGeometry g{2, 3, 64, 16, DType::Q4_0, DType::Q8_0};
  g.validate();
  EXPECT_EQ(g.grouping(0), KvGrouping::kHead);
  EXPECT_EQ(g.run(0, 0, 1).offset, 2u * 18 * 16);
  EXPECT_EQ(g.run(0, 1, 0).offset, 3u * 2 * 18 * 16);
  EXPECT_EQ(g.bytes_per_token(), 2u * 3 * (2 * 18 + 2 * 34));
}

TEST(KvGeometry, RejectsBadShapes) {
  KvGeometry g = small_geometry();
  g.block_tokens = 0;
  EXPECT_THROW(g.validate(), Error);
  g = small_geometry(DType::BF16);
  EXPECT_THROW(g.validate(), Error);
  // 2 KV heads of 8: 16 values per token fill no group; 48 is neither a multiple nor a divisor.
  for (const auto& [heads, dim] : {std::pair{2, 8}, std::pair{4, 48}, std::pair{3, 12}}) {
    g = KvGeometry{1, heads, dim, 16, DType::F16, DType::Q4_0};
    try {
      g.validate();
      ADD_FAILURE() << heads << " heads of " << dim;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("values q4_0 groups 32 values"), std::string::npos)
          << e.what();
    }
  }
}

// Copying a partial block's tokens copies exactly their bytes in either grouping.
TEST(BlockPool, CopyTokensCopiesOnlyThoseTokens) {
  for (DType t : {DType::F16, DType::Q8_0, DType::Q4_0}) {
    const KvGeometry g = small_geometry(t);
    BlockPool pool(g, g.bytes_per_block() * 2);
    const BlockId a = *pool.allocate(), b = *pool.allocate();
    for (size_t i = 0; i < g.bytes_per_block(); ++i) {
      pool.data(a)[i] = static_cast<uint8_t>(i % 255 + 1);
      pool.data(b)[i] = 0;
    }
    pool.copy_tokens(a, b, 5);
    size_t copied = 0;
    for (size_t i = 0; i < g.bytes_per_block(); ++i) copied += pool.data(b)[i] != 0;
    EXPECT_EQ(copied, 5 * g.bytes_per_token()) << dtype_name(t);
    for (int l = 0; l < g.n_layers; ++l) {
      for (int kind = 0; kind < 2; ++kind) {
        for (int h = 0; h < g.n_kv_heads; ++h) {
          const KvRun r = g.run(l, kind, h);
          EXPECT_EQ(pool.data(b)[r.offset + 4 * r.stride], pool.data(a)[r.offset + 4 * r.stride]);
          EXPECT_EQ(pool.data(b)[r.offset + 5 * r.stride], 0);
        }
      }
    }
  }
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
