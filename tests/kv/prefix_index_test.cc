// The prefix index, one behaviour at a time: sharing, partial reuse, each miss reason,
// namespaces, eviction order, pins, quotas and copy-on-write.
#include "kv/prefix_index.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "base/error.h"
#include "kv/cache_namespace.h"

namespace kvc::kv {
namespace {

constexpr int kBlock = 4;

struct Fixture {
  double now = 1000.0;
  KvGeometry geometry{1, 1, 4, kBlock, DType::F32, DType::F32};
  BlockPool pool;
  PrefixIndex index;
  Hash256 ns_a = namespace_hash({{}, DType::F32, DType::F32, kBlock, "a", "", ""});
  Hash256 ns_b = namespace_hash({{}, DType::F32, DType::F32, kBlock, "b", "", ""});

  explicit Fixture(size_t blocks = 16, PrefixIndexOptions o = {})
      : pool(geometry, geometry.bytes_per_block() * blocks),
        index(pool, o, [this] { return now; }) {}

  // Value stored for a token slot: the prefix it ends, so copies can be checked.
  static float value_of(std::span<const int32_t> prefix) {
    float v = 0;
    for (int32_t t : prefix) v = v * 3.0f + static_cast<float>(t + 1);
    return v;
  }
  float* slot(BlockTable& t, size_t pos) {
    return reinterpret_cast<float*>(pool.data(t.block_of(pos)) +
                                    geometry.offset(0, 0, 0, t.slot_of(pos)));
  }
  // Runs a whole sequence: match, write the rest, index it, release. Returns the match.
  PrefixMatch run(const Hash256& ns, const std::vector<int32_t>& tokens, bool keep = false,
                  BlockTable* out = nullptr) {
    BlockTable t(pool, &index);  // allocation evicts the index's LRU blocks
    const PrefixMatch m = index.match(ns, tokens, tokens.size() - 1, t);
    EXPECT_TRUE(t.reserve(tokens.size()));
    for (size_t p = 0; p < m.cached_tokens; ++p) {
      EXPECT_EQ(*slot(t, p), value_of({tokens.data(), p + 1})) << "cached slot " << p;
    }
    for (size_t p = m.cached_tokens; p < tokens.size(); ++p) {
      EXPECT_TRUE(t.ensure_writable(p));
      *slot(t, p) = value_of({tokens.data(), p + 1});
    }
    index.insert(ns, tokens, tokens.size(), t, !keep);
    index.check_invariants();
    if (keep && out != nullptr) *out = std::move(t);
    return m;
  }
};

std::vector<int32_t> seq(std::initializer_list<int32_t> ids) {
  return ids;
}
std::vector<int32_t> iota(int n, int start = 10) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(PrefixIndex, SecondRequestSharesFullBlocksAndCopiesThePartOfOne) {
  Fixture f;
  EXPECT_EQ(f.run(f.ns_a, iota(11)).miss.kind, MissKind::kCold);
  // Same 11 tokens: 10 are served (the last is recomputed for its logits): 2 shared blocks
  // and 2 tokens copied out of the cached partial block.
  const PrefixMatch m = f.run(f.ns_a, iota(11));
  EXPECT_EQ(m.cached_tokens, 10u);
  EXPECT_EQ(m.shared_blocks, 2u);
  EXPECT_EQ(m.copied_tokens, 2u);
  EXPECT_EQ(m.miss.kind, MissKind::kNone);
  EXPECT_EQ(f.index.stats().hit_tokens, 10u);
  // The last shared block's chained hash, as a tier lookup would compute it from the start.
  const auto tokens = iota(11);
  const Hash256 first = chain_hash(f.ns_a, Hash256{}, std::span(tokens).subspan(0, 4));
  EXPECT_EQ(m.last_shared_hash, chain_hash(f.ns_a, first, std::span(tokens).subspan(4, 4)));
  EXPECT_EQ(f.index.explain(f.ns_a, tokens, 10).last_shared_hash, m.last_shared_hash);
  EXPECT_EQ(f.index.explain(f.ns_b, tokens, 10).last_shared_hash, Hash256{});
}

// A sequence that computed blocks the tree already holds unreferenced (it started before they
// were indexed, or a window cut its cached prefix) indexes its own copies in their place and the
// old ones are freed: kept, they stayed above its blocks as inner nodes no eviction could take.
TEST(PrefixIndex, ARecomputedCopyReplacesAnUnreferencedBlockOfTheSameTokens) {
  Fixture f;
  const auto tokens = iota(12);
  BlockTable first(f.pool, &f.index), second(f.pool, &f.index);
  ASSERT_TRUE(first.reserve(8));
  ASSERT_TRUE(second.reserve(12));
  f.index.insert(f.ns_a, tokens, 8, first, false);
  const BlockId old0 = first.blocks()[0], old1 = first.blocks()[1];
  first.clear();  // two cached, unreferenced blocks
  EXPECT_EQ(f.pool.counts().cached, 2u);
  f.index.insert(f.ns_a, tokens, 12, second, false);
  f.index.check_invariants();
  EXPECT_EQ(f.pool.state(old0), BlockState::kFree);
  EXPECT_EQ(f.pool.state(old1), BlockState::kFree);
  EXPECT_EQ(f.pool.counts().cached, 0u);
  EXPECT_EQ(f.index.stats().nodes, 3u);
  second.clear();
  EXPECT_EQ(f.pool.counts().cached, 3u);
  // The chain is whole: a later request shares all three blocks, the second sequence's.
  BlockTable third(f.pool, &f.index);
  const std::vector<int32_t> longer = iota(13);
  EXPECT_EQ(f.index.match(f.ns_a, longer, 12, third).shared_blocks, 3u);
  EXPECT_EQ(f.index.evict(3), 0u);  // all held now
}

TEST(PrefixIndex, ABlockStillHeldIsNotReplaced) {
  Fixture f;
  const auto tokens = iota(8);
  BlockTable first(f.pool, &f.index), second(f.pool, &f.index);
  ASSERT_TRUE(first.reserve(8));
  ASSERT_TRUE(second.reserve(8));
  f.index.insert(f.ns_a, tokens, 8, first, false);
  f.index.insert(f.ns_a, tokens, 8, second, false);
  f.index.check_invariants();
  EXPECT_EQ(f.index.stats().nodes, 2u);
  second.clear();  // its copies were never indexed: they go back to the free list
  EXPECT_EQ(f.pool.counts().cached, 0u);
  EXPECT_EQ(f.pool.counts().free, 14u);
  first.clear();
  EXPECT_EQ(f.pool.counts().cached, 2u);
}

TEST(PrefixIndex, DivergedReportsTheFirstDifferentToken) {
  Fixture f;
  f.run(f.ns_a, iota(12));
  auto other = iota(12);
  other[6] = 99;
  const PrefixMatch m = f.run(f.ns_a, other);
  EXPECT_EQ(m.cached_tokens, 6u);  // block 0 shared, 2 tokens of block 1 copied
  EXPECT_EQ(m.miss.kind, MissKind::kDiverged);
  EXPECT_EQ(m.miss.at_token, 6u);
  EXPECT_EQ(m.miss.to_string(f.now), "diverged@6");
}

TEST(PrefixIndex, ColdInANewNamespaceAndNeverAcrossNamespaces) {
  Fixture f;
  f.run(f.ns_a, iota(12));
  const PrefixMatch m = f.run(f.ns_b, iota(12));
  EXPECT_EQ(m.cached_tokens, 0u);
  EXPECT_EQ(m.miss.kind, MissKind::kCold);
  EXPECT_EQ(f.index.namespace_stats(f.ns_b).hit_tokens, 0u);
  EXPECT_EQ(f.index.namespace_stats(f.ns_a).blocks, 3u);
  EXPECT_EQ(f.index.namespace_stats(f.ns_b).blocks, 3u);
}

TEST(PrefixIndex, ExtendingACachedSequenceIsColdPastItsEnd) {
  Fixture f;
  f.run(f.ns_a, iota(8));
  const PrefixMatch m = f.run(f.ns_a, iota(14));
  EXPECT_EQ(m.cached_tokens, 8u);
  EXPECT_EQ(m.miss.kind, MissKind::kCold);
  EXPECT_EQ(m.miss.at_token, 8u);
}

TEST(PrefixIndex, EvictedSaysWhen) {
  Fixture f(6);
  f.run(f.ns_a, iota(12));  // 3 blocks cached
  f.now += 5000;
  f.run(f.ns_a, iota(16, 100));  // 4 more blocks: needs 1 eviction (LRU leaf: block 2)
  f.now += 2500;
  EXPECT_GE(f.index.stats().evicted_blocks, 1u);
  const PrefixMatch m = f.index.explain(f.ns_a, iota(12), 11);
  EXPECT_EQ(m.cached_tokens, 8u);
  EXPECT_EQ(m.miss.kind, MissKind::kEvicted);
  EXPECT_EQ(m.miss.to_string(f.now), "evicted@2.5s-ago");
}

// A block's owner note outlives the block: the ledger of evicted blocks returns it with the
// reason, and a block still cached (or never seen) is not in the ledger.
TEST(PrefixIndex, TheLedgerKeepsAnEvictedBlocksTag) {
  Fixture f(4);
  const std::vector<int32_t> first = iota(8);
  BlockTable t(f.pool, &f.index);
  const PrefixMatch m = f.index.match(f.ns_a, first, first.size() - 1, t);
  EXPECT_EQ(m.cached_tokens, 0u);
  ASSERT_TRUE(t.reserve(first.size()));
  for (size_t p = 0; p < first.size(); ++p) ASSERT_TRUE(t.ensure_writable(p));
  const std::vector<IndexedBlock> added = f.index.insert(f.ns_a, first, first.size(), t, true);
  ASSERT_EQ(added.size(), 2u);
  f.index.tag_block(added[0].block, 0x21);
  f.index.tag_block(added[1].block, 0x03);
  EXPECT_FALSE(f.index.evicted(added[0].hash));  // still cached
  t = BlockTable(f.pool, &f.index);
  f.now += 1000;
  f.run(f.ns_a, iota(16, 200));  // needs all 4 blocks: both earlier ones are evicted
  for (size_t i = 0; i < added.size(); ++i) {
    const std::optional<EvictedBlock> gone = f.index.evicted(added[i].hash);
    ASSERT_TRUE(gone) << i;
    EXPECT_EQ(gone->kind, MissKind::kEvicted);
    EXPECT_EQ(gone->tag, i == 0 ? 0x21 : 0x03);
    EXPECT_DOUBLE_EQ(gone->at_ms, f.now);
  }
  EXPECT_FALSE(f.index.evicted(Hash256{}));  // never seen
}

// The eviction hook sees each block evicted to make room, with its data still in the pool and
// its facts, and the note it returns is what the ledger keeps; a flush does not call it.
TEST(PrefixIndex, TheEvictionHookSeesTheBlockBeforeItIsReused) {
  std::vector<LeavingBlock> seen;
  std::vector<float> first_values;
  Fixture* fixture = nullptr;
  PrefixIndexOptions o;
  o.on_evict = [&](const LeavingBlock& b) {
    seen.push_back(b);
    first_values.push_back(*reinterpret_cast<const float*>(fixture->pool.data(b.block)));
    return static_cast<uint8_t>(b.tag + 1);
  };
  Fixture f(4, o);
  fixture = &f;
  f.run(f.ns_a, iota(8));  // 2 blocks
  f.now += 100;
  f.run(f.ns_a, iota(8));  // a hit on both
  f.now += 100;
  f.run(f.ns_a, iota(16, 200));  // needs all 4 blocks: both earlier ones are evicted
  ASSERT_EQ(seen.size(), 2u);
  std::vector<size_t> depths;
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].ns, f.ns_a);
    EXPECT_EQ(seen[i].facts.hits, 1u);
    EXPECT_DOUBLE_EQ(seen[i].facts.idle_ms, 100);
    depths.push_back(seen[i].facts.depth_tokens);
    const auto gone = f.index.evicted(seen[i].facts.hash);
    ASSERT_TRUE(gone);
    EXPECT_EQ(gone->tag, 1);
    // The block's first slot still holds what the sequence wrote there.
    const std::vector<int32_t> prefix = iota(static_cast<int>(seen[i].facts.depth_tokens) + 1);
    EXPECT_EQ(first_values[i], Fixture::value_of(prefix));
  }
  EXPECT_THAT(depths, ::testing::UnorderedElementsAre(0u, 4u));
  f.index.flush();
  EXPECT_EQ(seen.size(), 2u);
}

TEST(PrefixIndex, PartialBlockWhenCopyingIsOff) {
  PrefixIndexOptions o;
  o.partial_reuse = false;
  Fixture f(16, o);
  f.run(f.ns_a, iota(12));
  auto other = iota(12);
  other[6] = 99;
  const PrefixMatch m = f.run(f.ns_a, other);
  EXPECT_EQ(m.cached_tokens, 4u);
  EXPECT_EQ(m.miss.kind, MissKind::kPartialBlock);
  EXPECT_EQ(m.miss.at_token, 4u);
}

// Keys grouped per channel are quantised with the other tokens of their block, and a partly
// filled block holds none yet: such blocks are neither indexed nor copied, whatever the
// options say, and a match stops at the last whole block with the reason partial_block.
TEST(PrefixIndex, KeysGroupedPerChannelReuseOnlyWholeBlocks) {
  const KvGeometry g{2, 4, 8, 32, DType::Q8_0, DType::Q8_0};
  BlockPool pool(g, g.bytes_per_block() * 8);
  PrefixIndex index(pool, PrefixIndexOptions{});  // partial_reuse on by default
  const Hash256 ns = namespace_hash({{}, DType::Q8_0, DType::Q8_0, 32, "", "", ""});
  const std::vector<int32_t> tokens = iota(50);
  {
    BlockTable t(pool, &index);
    ASSERT_TRUE(t.reserve(tokens.size()));
    EXPECT_EQ(t.open_key_blocks().size(), g.open_key_blocks());
    const std::vector<IndexedBlock> added = index.insert(ns, tokens, tokens.size(), t, true);
    EXPECT_EQ(added.size(), 1u);  // the whole block only, not the 18 tokens after it
  }
  BlockTable t(pool, &index);
  const PrefixMatch m = index.match(ns, tokens, tokens.size() - 1, t);
  EXPECT_EQ(m.cached_tokens, 32u);
  EXPECT_EQ(m.copied_tokens, 0u);
  EXPECT_EQ(m.miss.kind, MissKind::kCold);
  auto longer = iota(40);
  BlockTable u(pool, &index);
  index.flush();
  {
    BlockTable v(pool, &index);
    ASSERT_TRUE(v.reserve(64));
    index.insert(ns, iota(64), 64, v, true);
  }
  longer[36] = 7;  // diverges inside the second block
  const PrefixMatch p = index.match(ns, longer, longer.size() - 1, u);
  EXPECT_EQ(p.cached_tokens, 32u);
  EXPECT_EQ(p.copied_tokens, 0u);
  EXPECT_EQ(p.miss.kind, MissKind::kPartialBlock);
  EXPECT_EQ(p.miss.at_token, 32u);
}

TEST(PrefixIndex, QuotaCapsANamespaceAndIsTheReason) {
  Fixture f;
  f.index.set_quota(f.ns_a, 2);
  f.run(f.ns_a, iota(16));  // blocks 0 and 1 cached; 2 and 3 refused
  EXPECT_EQ(f.index.namespace_stats(f.ns_a).blocks, 2u);
  const PrefixMatch m = f.index.explain(f.ns_a, iota(16), 15);
  EXPECT_EQ(m.cached_tokens, 8u);
  EXPECT_EQ(m.miss.kind, MissKind::kQuota);
  f.run(f.ns_b, iota(16));  // another namespace is not limited
  EXPECT_EQ(f.index.namespace_stats(f.ns_b).blocks, 4u);
}

TEST(PrefixIndex, DisabledSharesNothingAndFreesEverything) {
  PrefixIndexOptions o;
  o.enabled = false;
  Fixture f(16, o);
  f.run(f.ns_a, iota(12));
  const PrefixMatch m = f.run(f.ns_a, iota(12));
  EXPECT_EQ(m.cached_tokens, 0u);
  EXPECT_EQ(m.miss.kind, MissKind::kDisabled);
  EXPECT_EQ(f.pool.counts().free, f.pool.num_blocks());
}

TEST(PrefixIndex, EvictsOnlyWhenAllocationNeedsItLeavesFirstLeastRecentFirst) {
  Fixture f(8);
  f.run(f.ns_a, iota(8, 10));                     // A: 2 blocks
  f.run(f.ns_a, iota(8, 50));                     // B: 2 blocks
  f.run(f.ns_a, iota(8, 90));                     // C: 2 blocks
  EXPECT_EQ(f.index.stats().evicted_blocks, 0u);  // 6 of 8 blocks used: nothing evicted
  f.run(f.ns_a, iota(8, 10));                     // touch A: now B is the least recently used
  f.run(f.ns_a, iota(16, 200));  // 4 blocks: 2 free, so 2 evictions: B's leaf, then B's root
  EXPECT_EQ(f.index.stats().evicted_blocks, 2u);
  EXPECT_EQ(f.index.explain(f.ns_a, iota(8, 50), 8).cached_tokens, 0u);
  EXPECT_EQ(f.index.explain(f.ns_a, iota(8, 10), 8).cached_tokens, 8u);
  EXPECT_EQ(f.index.explain(f.ns_a, iota(8, 90), 8).cached_tokens, 8u);
}

// With a value function, eviction takes the least valuable of the oldest evictable blocks,
// whatever their recency; the facts it is given are the block's depth, hits and times.
TEST(PrefixIndex, AValueFunctionChoosesTheVictimAmongTheOldest) {
  std::vector<BlockFacts> seen;
  PrefixIndexOptions o;
  o.value_sample = 4;
  o.block_value = [&](const BlockFacts& b) {
    seen.push_back(b);
    return static_cast<double>(b.hits);  // the least reused goes first
  };
  Fixture f(6, o);
  f.run(f.ns_a, iota(8, 10));  // A: 2 blocks, then reused twice
  f.run(f.ns_a, iota(8, 50));  // B: 2 blocks, never reused
  f.now += 100;
  f.run(f.ns_a, iota(8, 10));
  f.run(f.ns_a, iota(8, 10));
  f.run(f.ns_a, iota(8, 200));  // 2 blocks: 2 free, so no eviction yet
  EXPECT_EQ(f.index.stats().evicted_blocks, 0u);
  f.run(f.ns_a, iota(4, 300));  // 1 block: one eviction, of a leaf that was never reused
  EXPECT_EQ(f.index.stats().evicted_blocks, 1u);
  EXPECT_EQ(f.index.explain(f.ns_a, iota(8, 10), 8).cached_tokens, 8u);  // A, the oldest, kept
  ASSERT_FALSE(seen.empty());
  bool saw_a = false;
  for (const BlockFacts& b : seen) {
    if (b.hits == 2) {
      saw_a = true;
      EXPECT_EQ(b.depth_tokens, 4u);  // A's leaf, the second block
      EXPECT_DOUBLE_EQ(b.idle_ms, 0);
      EXPECT_DOUBLE_EQ(b.age_ms, 100);
    }
  }
  EXPECT_TRUE(saw_a);
  f.index.check_invariants();
}

TEST(PrefixIndex, ReferencedBlocksAreNeverEvicted) {
  Fixture f(4);
  BlockTable held(f.pool);
  f.run(f.ns_a, iota(8), true, &held);  // 2 blocks, still referenced
  EXPECT_EQ(f.index.evict(10), 0u);
  BlockTable t(f.pool, &f.index);
  EXPECT_TRUE(t.reserve(8));
  EXPECT_FALSE(t.reserve(12));  // pool exhausted, nothing evictable
  t.clear();
  held.clear();
  EXPECT_EQ(f.index.evict(10), 2u);
  EXPECT_EQ(f.pool.counts().free, 4u);
}

TEST(PrefixIndex, PinsHoldUntilTheirTimeToLive) {
  Fixture f(4);
  f.run(f.ns_a, iota(8));
  EXPECT_EQ(f.index.pin(f.ns_a, iota(8), 1000).tokens, 8u);
  EXPECT_EQ(f.index.evict(10), 0u);
  f.now += 1001;
  EXPECT_EQ(f.index.evict(10), 2u);
  f.run(f.ns_a, iota(8));
  const PinLease lease = f.index.pin(f.ns_a, iota(8), 1e9);
  EXPECT_TRUE(f.index.unpin(lease.id));
  EXPECT_FALSE(f.index.unpin(lease.id));
  EXPECT_EQ(f.index.evict(10), 2u);
  EXPECT_THROW(f.index.pin(f.ns_a, iota(8), 0), Error);
}

// A session ending must not remove an admin's longer pin of the same blocks.
TEST(PrefixIndex, PinsCompose) {
  Fixture f(4);
  f.run(f.ns_a, iota(8));
  const PinLease admin = f.index.pin(f.ns_a, iota(8), 3600e3);
  const PinLease session = f.index.pin(f.ns_a, iota(4), 60e3);
  EXPECT_EQ(session.tokens, 4u);
  EXPECT_NE(admin.id, session.id);
  EXPECT_EQ(f.index.pinned_unreferenced_blocks(), 2u);
  EXPECT_TRUE(f.index.unpin(session.id));
  EXPECT_EQ(f.index.evict(10), 0u);  // the admin's pin still holds both blocks
  EXPECT_EQ(f.index.namespace_stats(f.ns_a).pinned_blocks, 2u);
  f.now += 61e3;  // the shorter lease would have expired; the longer one holds
  EXPECT_EQ(f.index.evict(10), 0u);
  f.now += 3600e3;
  EXPECT_EQ(f.index.expire_pins(), 1u);
  EXPECT_EQ(f.index.pin_count(), 0u);
  EXPECT_EQ(f.index.evict(10), 2u);
}

TEST(PrefixIndex, PinCoversAtMostMaxBlocks) {
  Fixture f(4);
  f.run(f.ns_a, iota(12));
  const PinLease lease = f.index.pin(f.ns_a, iota(12), 1e9, 1);
  EXPECT_EQ(lease.tokens, 4u);
  EXPECT_EQ(f.index.pinned_unreferenced_blocks(), 1u);
  EXPECT_EQ(f.index.pin(f.ns_b, iota(12), 1e9).id, 0u);  // nothing cached there: no lease
}

// Every distinct salt used to leave a namespace behind forever.
TEST(PrefixIndex, EmptyNamespacesAreDropped) {
  Fixture f(4);
  for (int i = 0; i < 50; ++i) {
    const Hash256 ns =
        namespace_hash({{}, DType::F32, DType::F32, kBlock, "salt" + std::to_string(i), "", ""});
    BlockTable t(f.pool, &f.index);
    f.index.match(ns, iota(8, i), 7, t);
    f.index.insert(ns, iota(8, i), 0, t, true);  // cancelled before writing: nothing cached
  }
  EXPECT_EQ(f.index.stats().namespaces, 0u);
  f.run(f.ns_a, iota(8));
  f.run(f.ns_b, iota(8, 100));
  EXPECT_EQ(f.index.stats().namespaces, 2u);
  f.run(f.ns_a, iota(16, 200));  // needs every block: b's blocks are evicted
  EXPECT_EQ(f.index.stats().namespaces, 1u);
  f.index.flush();
  EXPECT_EQ(f.index.stats().namespaces, 0u);
}

TEST(PrefixIndex, FlushDropsEverythingUnreferencedIncludingPins) {
  Fixture f;
  f.run(f.ns_a, iota(12));
  f.run(f.ns_b, iota(7));
  f.index.pin(f.ns_a, iota(12), 1e9);
  EXPECT_EQ(f.index.flush(), 5u);
  EXPECT_EQ(f.pool.counts().free, f.pool.num_blocks());
  EXPECT_EQ(f.index.stats().nodes, 0u);
  f.index.check_invariants();
}

TEST(PrefixIndex, ForkSharesThenCopiesOnFirstWrite) {
  Fixture f;
  BlockTable a(f.pool);
  ASSERT_TRUE(a.reserve(6));
  for (size_t p = 0; p < 6; ++p) *f.slot(a, p) = static_cast<float>(p);
  BlockTable b = a.fork();
  EXPECT_EQ(f.pool.ref_count(a.blocks()[1]), 2u);
  ASSERT_TRUE(b.ensure_writable(6));  // block 1 holds slots 4, 5: copied before writing 6
  EXPECT_NE(a.blocks()[1], b.blocks()[1]);
  EXPECT_EQ(a.blocks()[0], b.blocks()[0]);
  *f.slot(b, 6) = 60.0f;
  *f.slot(b, 4) = -1.0f;
  EXPECT_EQ(*f.slot(a, 4), 4.0f);     // the original is untouched
  EXPECT_EQ(*f.slot(b, 5), 5.0f);     // the copy kept the shared tokens
  ASSERT_TRUE(a.ensure_writable(6));  // a is now the only holder: no copy
  EXPECT_EQ(f.pool.ref_count(a.blocks()[1]), 1u);
}

TEST(PrefixIndex, IndexedBlocksAreImmutable) {
  Fixture f;
  BlockTable held(f.pool);
  f.run(f.ns_a, iota(6), true, &held);  // block 0 indexed and still held
  const BlockId indexed = held.blocks()[0];
  ASSERT_TRUE(held.ensure_writable(3));  // writing into an indexed block copies it
  EXPECT_NE(held.blocks()[0], indexed);
}

TEST(PrefixIndex, ContentHashesChainNamespaceParentAndTokens) {
  const Hash256 ns = namespace_hash({});
  const Hash256 zero{};
  const auto a = chain_hash(ns, zero, seq({1, 2, 3, 4}));
  EXPECT_NE(a, chain_hash(ns, zero, seq({1, 2, 3, 5})));
  EXPECT_NE(a, chain_hash(namespace_hash({{}, DType::F32, DType::F16, 16, "", "", ""}), zero,
                          seq({1, 2, 3, 4})));
  EXPECT_NE(chain_hash(ns, a, seq({5})), chain_hash(ns, zero, seq({5})));
  EXPECT_EQ(a, chain_hash(ns, zero, seq({1, 2, 3, 4})));
  // Every identity field changes the namespace.
  NamespaceKey k;
  const Hash256 base = namespace_hash(k);
  k.block_tokens = 32;
  EXPECT_NE(namespace_hash(k), base);
  k = {};
  k.adapter = "lora";
  EXPECT_NE(namespace_hash(k), base);
  k = {};
  k.arithmetic = "avx2/2";
  EXPECT_NE(namespace_hash(k), base);
  k = {};
  k.model_fingerprint[0] = 1;
  EXPECT_NE(namespace_hash(k), base);
  // Keys and values are told apart: q8_0 keys with f16 values is not the other way round.
  k = {};
  k.k_dtype = DType::Q8_0;
  const Hash256 q8_keys = namespace_hash(k);
  EXPECT_NE(q8_keys, base);
  k = {};
  k.v_dtype = DType::Q8_0;
  EXPECT_NE(namespace_hash(k), base);
  EXPECT_NE(namespace_hash(k), q8_keys);
  EXPECT_EQ(to_hex(base).size(), 64u);
}

TEST(PrefixIndex, IndexMemoryPerBlockIsSmall) {
  Fixture f(64);
  for (int i = 0; i < 8; ++i) f.run(f.ns_a, iota(16, 100 * i));
  const size_t per_block = f.index.index_bytes() / f.index.stats().nodes;
  EXPECT_LT(per_block, 1024u);
}

}  // namespace
}  // namespace kvc::kv
