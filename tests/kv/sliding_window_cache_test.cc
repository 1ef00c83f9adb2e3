// The KV cache under a sliding window: a block table releases the blocks behind the window as
// holes, the prefix index evicts inner blocks leaving hollow nodes, and a lookup reuses the
// longest prefix whose window's blocks are all present, saying why it stopped short.
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

#include "base/error.h"
#include "kv/block_pool.h"
#include "kv/block_source.h"
#include "kv/block_table.h"
#include "kv/cache_namespace.h"
#include "kv/prefix_index.h"

namespace kvc::kv {
namespace {

constexpr int kBlock = 4;
constexpr int kWindow = 6;  // reads the blocks of the last 6 positions: at most 3 blocks

struct WindowFixture {
  double now = 1000.0;
  KvGeometry geometry;
  BlockPool pool;
  PrefixIndex index;
  Hash256 ns = namespace_hash({{}, DType::F32, DType::F32, kBlock, "a", "", ""});
  size_t hits_past_holes = 0;  // matches that reused blocks after hollow or released ones
  size_t evicted_stops = 0;    // matches cut short by an evicted block

  explicit WindowFixture(size_t blocks = 32, int window = kWindow)
      : geometry{1, 1, 4, kBlock, DType::F32, DType::F32, window},
        pool(geometry, geometry.bytes_per_block() * blocks),
        index(pool, {}, [this] { return now; }) {}

  // Value stored for a token slot: the prefix it ends, so a block of the wrong prefix shows.
  static float value_of(std::span<const int32_t> tokens, size_t pos) {
    float v = 0;
    for (size_t i = 0; i <= pos; ++i)
      v = std::fmod(v * 3.0f + static_cast<float>(tokens[i] + 1), 1e6f);
    return v;
  }
  float* slot(const BlockTable& t, size_t pos) {
    return reinterpret_cast<float*>(pool.data(t.block_of(pos)) +
                                    geometry.offset(0, 0, 0, t.slot_of(pos)));
  }
  // Runs a sequence as the engine does: match, then one token a step, releasing the blocks
  // behind the window before each step and indexing full blocks after it; checks that every
  // position a step reads holds its own prefix's value. Keeps the table when out is given.
  PrefixMatch run(const std::vector<int32_t>& tokens, BlockTable* out = nullptr) {
    BlockTable t(pool, &index);
    const PrefixMatch m = index.match(ns, tokens, tokens.size() - 1, t);
    EXPECT_EQ(t.first_held(), geometry.first_needed(m.cached_tokens) / kBlock);
    hits_past_holes += m.cached_tokens > 0 && t.first_held() > 0;
    evicted_stops += m.miss.kind == MissKind::kEvicted;
    for (size_t p = m.cached_tokens; p < tokens.size(); ++p) {
      t.release_before(geometry.first_needed(p));
      EXPECT_TRUE(t.reserve(p + 1));
      EXPECT_TRUE(t.ensure_writable(p));
      for (size_t k = geometry.first_needed(p); k < p; ++k) {
        EXPECT_EQ(*slot(t, k), value_of(tokens, k)) << "position " << k << " read at " << p;
      }
      *slot(t, p) = value_of(tokens, p);
      EXPECT_LE(t.held_blocks(), geometry.blocks_for_sequence(p + 1));
      index.insert(ns, tokens, p + 1, t, false);
      index.check_invariants();
    }
    index.insert(ns, tokens, tokens.size(), t, true);
    index.check_invariants();
    if (out != nullptr) *out = std::move(t);
    return m;
  }
};

std::vector<int32_t> iota(int n, int start = 10) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(SlidingWindowGeometry, ASequenceHoldsTheBlocksItsWindowTouches) {
  const KvGeometry g{1, 1, 4, 16, DType::F16, DType::F16, 4096};
  EXPECT_EQ(g.first_needed(4095), 0u);
  EXPECT_EQ(g.first_needed(4096), 1u);
  EXPECT_EQ(g.blocks_for_sequence(100), 7u);
  EXPECT_EQ(g.blocks_for_sequence(131072), 257u);  // ceil(4095 / 16) + 1
  // A 512-token prefill step reads the window before its first token through its last.
  EXPECT_EQ(g.blocks_for_sequence(131072, 512), 289u);  // ceil((4095 + 511) / 16) + 1
  KvGeometry bad = g;
  bad.window_tokens = -1;
  EXPECT_THROW(bad.validate(), Error);
}

TEST(SlidingWindowTable, ReleasedBlocksBecomeHolesThatKeepPositions) {
  WindowFixture f;
  BlockTable t(f.pool);
  ASSERT_TRUE(t.reserve(20));
  const BlockId third = t.blocks()[2];
  EXPECT_EQ(t.release_before(9), 2u);  // blocks 0 and 1 lie wholly before position 9
  EXPECT_EQ(t.release_before(9), 0u);
  EXPECT_EQ(t.first_held(), 2u);
  EXPECT_EQ(t.held_blocks(), 3u);
  EXPECT_EQ(t.capacity_tokens(), 20u);
  EXPECT_EQ(t.block_of(4), BlockTable::kNoBlock);
  EXPECT_EQ(t.block_of(9), third);
  EXPECT_EQ(f.pool.counts().referenced, 3u);
  EXPECT_THROW(t.ensure_writable(5), Error);
  EXPECT_THROW(t.append_hole(), Error);  // holes come before blocks
  {
    const BlockTable copy = t.fork();
    EXPECT_EQ(copy.first_held(), 2u);
    EXPECT_EQ(copy.block_of(9), third);
    EXPECT_EQ(f.pool.ref_count(third), 2u);
  }
  EXPECT_EQ(f.pool.ref_count(third), 1u);
  t.clear();
  EXPECT_EQ(f.pool.counts().free, f.pool.num_blocks());
}

TEST(SlidingWindowIndex, InnerBlocksBehindTheWindowAreEvictedAndThePathStillMatches) {
  WindowFixture f;
  BlockTable running(f.pool, &f.index);
  f.run(iota(20), &running);  // 5 full blocks; it holds the last 2, blocks 0-2 are cached
  EXPECT_EQ(running.first_held(), 3u);
  EXPECT_EQ(f.index.evict(10), 3u);  // inner blocks: a full-attention index could take none
  f.index.check_invariants();
  EXPECT_EQ(f.index.stats().nodes, 2u);
  running.clear();

  // The same prompt and more: its last window's blocks (3 and 4) are present.
  std::vector<int32_t> longer = iota(21);
  const PrefixMatch hit = f.run(longer);
  EXPECT_EQ(hit.cached_tokens, 20u);
  EXPECT_EQ(hit.shared_blocks, 2u);
  EXPECT_EQ(hit.miss.kind, MissKind::kNone);

  // A prefix of it whose window would read the evicted block 2: nothing before it is usable.
  f.now += 5000;
  const PrefixMatch explained = f.index.explain(f.ns, iota(17), 16);
  EXPECT_EQ(explained.cached_tokens, 0u);
  EXPECT_EQ(explained.miss.kind, MissKind::kEvicted);
  EXPECT_EQ(explained.miss.at_token, 0u);
  EXPECT_DOUBLE_EQ(explained.miss.evicted_at_ms, 1000.0);
  const PrefixMatch miss = f.run(iota(17));
  EXPECT_EQ(miss.cached_tokens, 0u);
  // Recomputing it gave the hollow blocks back: the prefix is whole again.
  EXPECT_EQ(f.index.explain(f.ns, iota(17), 16).cached_tokens, 16u);
  EXPECT_EQ(f.index.explain(f.ns, iota(17), 8).cached_tokens, 8u);
}

TEST(SlidingWindowIndex, WithoutAWindowOnlyLeavesAreEvicted) {
  WindowFixture f(32, 0);
  BlockTable running(f.pool, &f.index);
  f.run(iota(20), &running);
  EXPECT_EQ(running.first_held(), 0u);
  EXPECT_EQ(f.index.evict(10), 0u);  // every block is held or has a held child
}

TEST(SlidingWindowIndex, AMatchStopsWhereItsWindowWouldReadAnEvictedBlock) {
  WindowFixture f;
  f.run(iota(40));  // blocks 0-9, all cached once it ends
  EXPECT_EQ(f.index.explain(f.ns, iota(9), 8).cached_tokens, 8u);
  BlockTable early(f.pool, &f.index);
  f.index.match(f.ns, iota(9), 8, early);  // uses blocks 0 and 1
  early.clear();
  f.now = 2000;
  EXPECT_EQ(f.index.evict(3), 3u);  // the least recently used: blocks 2, 3 and 4
  f.index.check_invariants();

  const PrefixMatch whole = f.index.explain(f.ns, iota(41), 40);
  EXPECT_EQ(whole.cached_tokens, 40u);  // its window reads blocks 8 and 9 only
  EXPECT_EQ(whole.shared_blocks, 2u);
  // 22 tokens: the window of token 22 reads block 4; of token 8, blocks 0 and 1 only.
  const PrefixMatch cut = f.index.explain(f.ns, iota(23), 22);
  EXPECT_EQ(cut.cached_tokens, 8u);
  EXPECT_EQ(cut.miss.kind, MissKind::kEvicted);
  EXPECT_EQ(cut.miss.at_token, 8u);
  EXPECT_DOUBLE_EQ(cut.miss.evicted_at_ms, 2000.0);
  BlockTable t(f.pool, &f.index);
  const PrefixMatch taken = f.index.match(f.ns, iota(23), 22, t);
  EXPECT_EQ(taken.cached_tokens, 8u);
  EXPECT_EQ(t.first_held(), 0u);
  EXPECT_EQ(t.held_blocks(), 2u);
}

// A source with no block to give: the copy of a partly matched block fails.
class EmptySource : public BlockSource {
 public:
  std::optional<BlockId> take_block() override { return std::nullopt; }
};

// Without its copied block a match's window reaches one block further back; when that block is
// evicted the match is cut there, and the source of the copy that failed is released all the
// same (it once was released through the cut walk, which no longer held it: a null read).
TEST(SlidingWindowIndex, AFailedCopyWhoseWindowMeetsAnEvictedBlockReleasesItsSource) {
  WindowFixture f;
  f.run(iota(40));  // blocks 0-9, all cached once it ends
  BlockTable recent(f.pool, &f.index);
  std::vector<int32_t> query = iota(39);
  query.push_back(999);
  f.now = 1500;
  f.index.match(f.ns, query, 39, recent);  // uses blocks 8 and 9 and copies 3 tokens of 9
  recent.clear();
  f.now = 2000;
  ASSERT_EQ(f.index.evict(8), 8u);  // blocks 0-7: the least recently used
  f.index.check_invariants();
  ASSERT_EQ(f.index.explain(f.ns, query, 39).cached_tokens, 39u);  // 36 shared, 3 copied

  EmptySource empty;
  BlockTable t(f.pool, &empty);
  const PrefixMatch m = f.index.match(f.ns, query, 39, t);
  // Without the copy, position 36's window reads block 7, evicted: nothing before it is usable.
  EXPECT_EQ(m.cached_tokens, 0u);
  EXPECT_EQ(m.miss.kind, MissKind::kEvicted);
  EXPECT_EQ(t.held_blocks(), 0u);
  t.clear();
  f.index.check_invariants();
  EXPECT_EQ(f.pool.counts().referenced, 0u);  // the copy's source was released
}

// Under a quota, refilling a hollow node made room by evicting its namespace's oldest block; when
// that was the node's only descendant, the eviction took the hollow node out of the tree with it,
// and the refill wrote to freed memory. The node being refilled now stays.
TEST(SlidingWindowIndex, AQuotaNeverPrunesTheHollowNodeAnInsertRefills) {
  WindowFixture f;
  f.run(iota(12));                       // blocks 0-2, all cached once it ends
  ASSERT_EQ(f.index.evict(2), 2u);       // blocks 0 and 1: hollow, block 2 a cached leaf below them
  f.index.set_quota(f.ns, 1);            // full: a refill must evict block 2 first
  const PrefixMatch m = f.run(iota(9));  // recomputes blocks 0 and 1
  EXPECT_EQ(m.cached_tokens, 0u);
  f.index.check_invariants();
  EXPECT_LE(f.index.namespace_stats(f.ns).blocks, 1u);
  EXPECT_EQ(f.index.explain(f.ns, iota(5), 4).cached_tokens, 4u);  // block 0, refilled
}

TEST(SlidingWindowIndex, APinKeepsTheBlocksTheWindowAtItsEndReads) {
  WindowFixture f;
  f.run(iota(40));
  const PinLease lease = f.index.pin(f.ns, iota(40), 60000, 100);
  EXPECT_EQ(lease.tokens, 40u);
  EXPECT_EQ(f.index.namespace_stats(f.ns).pinned_blocks, 2u);  // blocks 8 and 9
  EXPECT_EQ(f.index.evict(100), 8u);
  EXPECT_EQ(f.index.explain(f.ns, iota(41), 40).cached_tokens, 40u);
  EXPECT_TRUE(f.index.unpin(lease.id));
  EXPECT_EQ(f.index.namespace_stats(f.ns).pinned_blocks, 0u);
  EXPECT_EQ(f.index.pin(f.ns, iota(40), 60000, 1).tokens, 40u);  // the last block only
  EXPECT_EQ(f.index.namespace_stats(f.ns).pinned_blocks, 1u);
  f.index.check_invariants();
}

// Random prefixes of a few long sequences under memory pressure: every
// position a step reads holds its own prefix's value, a sequence never holds more than its
// window's blocks, and the index and pool agree after every step.
TEST(SlidingWindowIndex, RandomWorkloadsReadOnlyTheirOwnPrefixes) {
  for (int window : {1, 3, 6, 9}) {
    SCOPED_TRACE(window);
    WindowFixture f(24, window);
    std::mt19937 rng(static_cast<uint32_t>(window));
    // Four long conversations; a request takes a prefix of one and a few tokens of its own.
    std::vector<std::vector<int32_t>> bases(4, std::vector<int32_t>(40));
    for (auto& base : bases) {
      for (auto& t : base) t = static_cast<int32_t>(rng() % 3);
    }
    for (int i = 0; i < 300; ++i) {
      const auto& base = bases[rng() % bases.size()];
      std::vector<int32_t> tokens(base.begin(), base.begin() + 2 + rng() % 38);
      for (size_t extra = rng() % 4; extra > 0; --extra) {
        tokens.push_back(static_cast<int32_t>(rng() % 3));
      }
      f.run(tokens);
      if (rng() % 4 == 0) f.index.evict(rng() % 6);
      if (rng() % 50 == 0) f.index.flush();
      f.now += 1;
    }
    if (window > 1) {
      EXPECT_GT(f.hits_past_holes, 10u);
      EXPECT_GT(f.evicted_stops, 10u);
    }
    f.index.flush();
    f.index.check_invariants();
    EXPECT_EQ(f.pool.counts().free, f.pool.num_blocks());
  }
}

}  // namespace
}  // namespace kvc::kv
