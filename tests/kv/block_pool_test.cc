#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <tuple>

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

// stories260K's heads of 8 values: a q8_0 value group holds the 4 KV heads of one token and
// layer; quantised keys are a channel-grouped slab per head (35 bytes per channel at 8 bits).
TEST(KvGeometry, HeadsShorterThanAGroupShareOnePerToken) {
  KvGeometry g{5, 4, 8, 32, DType::Q8_0, DType::Q8_0};
  g.validate();
  EXPECT_EQ(g.grouping(0), KvGrouping::kChannel);
  EXPECT_EQ(g.grouping(1), KvGrouping::kToken);
  EXPECT_TRUE(g.keys_by_channel());
  EXPECT_EQ(g.slab_bytes(0), 4u * 8 * 35);
  EXPECT_EQ(g.token_bytes(0), 35u);
  EXPECT_EQ(g.token_bytes(1), 34u);
  EXPECT_EQ(g.bytes_per_token(), 5u * (35 + 34));  // 345 B against f16's 640
  EXPECT_EQ(g.bytes_per_block(), 5u * (4 * 8 * 35 + 32 * 34));
  // [layer][K slab per head | V [token][kv_head * head_dim]]
  EXPECT_EQ(g.run(0, 0, 3).offset, 3u * 8 * 35);
  EXPECT_EQ(g.run(0, 0, 3).stride, 0u);
  EXPECT_EQ(g.run(0, 1, 3).offset, 4u * 8 * 35);
  EXPECT_EQ(g.run(0, 1, 3).first, 24);
  EXPECT_EQ(g.run(0, 1, 3).stride, 34u);
  g.k_dtype = g.v_dtype = DType::Q4_0;
  EXPECT_EQ(g.bytes_per_token(), 5u * (19 + 18));  // 185 B
  EXPECT_EQ(g.run(1, 0, 0).offset, 4u * 8 * 19 + 32 * 18);
  EXPECT_EQ(g.run(4, 1, 0).offset + 32 * 18, g.bytes_per_block());
  // One layer's f16 keys of a block are 2 KiB: the open keys of 5 layers take 3 blocks of 5,920.
  EXPECT_EQ(g.open_layer_bytes(), 4u * 32 * 8 * 2);
  EXPECT_EQ(g.open_key_blocks(), 3u);
  EXPECT_EQ(g.open_key_block_of(4), 2u);
  EXPECT_EQ(g.open_key_offset(3), 2048u);
  EXPECT_EQ(g.blocks_for_sequence(33), 5u);
  // Keys f16 (per head), values q8_0 (per token) in one block; no open keys.
  g = KvGeometry{5, 4, 8, 16, DType::F16, DType::Q8_0};
  g.validate();
  EXPECT_EQ(g.grouping(0), KvGrouping::kHead);
  EXPECT_EQ(g.run(0, 1, 0).offset, 16u * 4 * 8 * 2);
  EXPECT_EQ(g.open_key_blocks(), 0u);
}

TEST(KvGeometry, GroupsAlongTheHeadWhenItHoldsWholeGroups) {
  const KvGeometry g{2, 3, 64, 32, DType::Q4_0, DType::Q8_0};
  g.validate();
  EXPECT_EQ(g.grouping(0), KvGrouping::kChannel);
  EXPECT_EQ(g.grouping(1), KvGrouping::kHead);
  EXPECT_EQ(g.run(0, 0, 1).offset, 64u * 19);
  EXPECT_EQ(g.run(0, 1, 0).offset, 3u * 64 * 19);
  EXPECT_EQ(g.run(0, 1, 1).offset, 3u * 64 * 19 + 2 * 34 * 32);
  EXPECT_EQ(g.bytes_per_token(), 2u * 3 * (38 + 2 * 34));
}

TEST(KvGeometry, QuantisedKeysNeedBlocksOfTheirGroupAndHeadsOfEights) {
  for (const auto& [block, dim, what] :
       {std::tuple{16, 8, "a block of 32 tokens; the block size is 16 (use --block-tokens 32)"},
        std::tuple{64, 8, "the block size is 64"}, std::tuple{32, 12, "a multiple of 8, got 12"}}) {
    const KvGeometry g{2, 4, dim, block, DType::Q8_0, DType::F16};
    try {
      g.validate();
      ADD_FAILURE() << block << " tokens, heads of " << dim;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
  // One layer of one head of q4_0: a block (608 B) is smaller than its f16 keys (1 KiB).
  const KvGeometry tiny{1, 1, 16, 32, DType::Q4_0, DType::Q4_0};
  EXPECT_THROW(tiny.validate(), Error);
  EXPECT_EQ(block_tokens_for(DType::Q8_0, 0), 32);
  EXPECT_EQ(block_tokens_for(DType::F16, 0), 16);
  EXPECT_EQ(block_tokens_for(DType::F16, 64), 64);
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

// Copying a partial block's tokens copies exactly their bytes in either value grouping; keys
// grouped per channel are not in a partial block (they are in its sequence's open keys), and
// are copied whole with a whole block.
// Two blocks of pool: the first filled with non-zero bytes, the second with zeros.
std::pair<BlockId, BlockId> filled_and_empty(BlockPool& pool) {
  const BlockId a = *pool.allocate(), b = *pool.allocate();
  for (size_t i = 0; i < pool.geometry().bytes_per_block(); ++i) {
    pool.data(a)[i] = static_cast<uint8_t>(i % 255 + 1);
    pool.data(b)[i] = 0;
  }
  return {a, b};
}

TEST(BlockPool, CopyTokensCopiesOnlyThoseTokens) {
  for (DType t : {DType::F16, DType::Q8_0, DType::Q4_0}) {
    const KvGeometry g{5, 4, 8, 16, DType::F16, t};
    BlockPool pool(g, g.bytes_per_block() * 2);
    const auto [a, b] = filled_and_empty(pool);
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
  const KvGeometry g{5, 4, 8, 32, DType::Q8_0, DType::Q8_0};
  BlockPool pool(g, g.bytes_per_block() * 2);
  const auto [a, b] = filled_and_empty(pool);
  pool.copy_tokens(a, b, 5);
  EXPECT_EQ(pool.data(b)[g.run(0, 0, 0).offset], 0);  // no keys yet
  EXPECT_EQ(pool.data(b)[g.run(0, 1, 0).offset + 4 * 34],
            pool.data(a)[g.run(0, 1, 0).offset + 4 * 34]);
  pool.copy_tokens(a, b, 32);
  EXPECT_EQ(std::memcmp(pool.data(a), pool.data(b), g.bytes_per_block()), 0);
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
