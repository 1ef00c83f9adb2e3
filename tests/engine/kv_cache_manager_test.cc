// The KV cache manager's admission figures, driven directly: what a waiting sequence would
// share and the room it would have.
#include "engine/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "engine/sequence.h"
#include "kv/cache_namespace.h"
#include "scratch_dir.h"

namespace kvc::engine {
namespace {

constexpr int kBlock = 4;

std::vector<int32_t> iota(size_t n, int32_t start = 10) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// Defect: the memo of a sequence's cached prefix was kept until the index changed, but its
// count of shared blocks no one holds changes when a holder of the prefix lets go (finishing or
// preempted) without any insert or eviction. The stale count made room_for count the blocks
// the sequence would share as free room: over-admission, then a preemption.
TEST(KvCacheManager, RoomForFollowsAHolderOfTheSharedPrefixLettingGo) {
  const kv::KvGeometry g{1, 1, 4, kBlock, DType::F32, DType::F32, 0};
  const size_t blocks = 16;
  double now = 1000.0;
  KvCacheManager kv(g, g.bytes_per_block() * blocks, KvCacheOptions{}, [&] { return now; });
  const kv::Hash256 ns = kv::namespace_hash({{}, DType::F32, DType::F32, kBlock, "a", "", ""});

  Sequence holder;
  holder.req.ns = ns;
  holder.tokens = iota(4 * kBlock + 1);  // four full blocks, then the token to sample from
  kv.attach(holder);
  ASSERT_TRUE(kv.grow(holder, 4 * kBlock));
  holder.written = 4 * kBlock;
  kv.seal(holder, false);

  Sequence waiting;
  waiting.req.ns = ns;
  waiting.tokens = iota(6 * kBlock + 1);  // the same four blocks, then two more
  EXPECT_EQ(kv.computed(waiting).shared_blocks, 4u);
  EXPECT_EQ(kv.computed(waiting).shared_unreferenced, 0u);
  EXPECT_EQ(kv.room_for(waiting), blocks - 4);

  kv.detach(holder);  // its four blocks stay cached, unreferenced
  EXPECT_EQ(kv.counts().cached, 4u);
  EXPECT_EQ(kv.computed(waiting).shared_unreferenced, 4u);
  // Sharing them takes them out of the evictable room: only the free blocks are left.
  EXPECT_EQ(kv.room_for(waiting), blocks - 4);
}

// Defect: a grow that failed part of the way (the full layers' blocks taken, the windowed
// layers' not) kept what it had taken, although its contract says nothing is allocated then;
// the victims chosen next were chosen for blocks the sequence did not need.
TEST(KvCacheManager, AGrowThatFailsTakesNothing) {
  kv::KvGeometry g{1, 1, 4, kBlock, DType::F32, DType::F32, 0};
  g.split_window = 2 * kBlock;  // a second group of layers, sliding over two blocks
  double now = 1000.0;
  KvCacheManager kv(g, g.bytes_per_block() * 10, KvCacheOptions{}, [&] { return now; });
  const kv::Hash256 ns = kv::namespace_hash({{}, DType::F32, DType::F32, kBlock, "a", "", ""});
  Sequence running;
  running.req.ns = ns;
  running.tokens = iota(3 * kBlock + 1);
  kv.attach(running);
  ASSERT_TRUE(kv.grow(running, 3 * kBlock));  // three full-layer blocks, three windowed
  const size_t held = kv.counts().referenced;
  Sequence other;
  other.req.ns = ns;
  other.tokens = iota(4 * kBlock + 1, 500);
  kv.attach(other);
  // Four full-layer blocks fit in what is left; the windowed layers' then do not.
  EXPECT_FALSE(kv.grow(other, 4 * kBlock));
  EXPECT_EQ(kv.counts().referenced, held);
  kv.detach(other);
  kv.detach(running);
}

// Defect: looking a waiting sequence up read its blocks from the lower tiers into the pool, even
// when it was not admitted then; evicted again before it ran, they were never read again (the
// sequence counted its tiers as searched) and were recomputed. Only admitting reads them now.
TEST(KvCacheManager, OnlyAdmissionReadsTheLowerTiers) {
  const kv::KvGeometry g{1, 1, 4, kBlock, DType::F32, DType::F32, 0};
  double now = 1000.0;
  KvCacheOptions options;
  options.tiers.disk_dir = (testing::scratch_dir() / "admission-reads").string();
  options.tiers.disk_max_bytes = 1 << 20;
  options.tiers.policy = TierPolicy::kKeepAll;
  KvCacheManager kv(g, g.bytes_per_block() * 16, options, [&] { return now; });
  const kv::Hash256 ns = kv::namespace_hash({{}, DType::F32, DType::F32, kBlock, "a", "", ""});

  Sequence first;
  first.req.ns = ns;
  first.tokens = iota(4 * kBlock + 1);
  kv.attach(first);
  ASSERT_TRUE(kv.grow(first, 4 * kBlock));
  first.written = 4 * kBlock;
  kv.seal(first, true);
  kv.detach(first);
  kv.drain_tiers();
  kv.flush();  // the pool forgets; the disk keeps four blocks
  ASSERT_EQ(kv.counts().cached, 0u);

  Sequence waiting;
  waiting.req.ns = ns;
  waiting.tokens = iota(4 * kBlock + 3);
  EXPECT_EQ(kv.computed(waiting).cached_tokens, 0u);  // in the pool: nothing
  kv.room_for(waiting);
  EXPECT_EQ(kv.tier_counts().disk_loaded_blocks, 0u);
  EXPECT_EQ(kv.counts().cached, 0u);

  const kv::PrefixMatch m = kv.attach(waiting);
  EXPECT_EQ(m.cached_tokens, 4u * kBlock);
  EXPECT_EQ(kv.tier_counts().disk_loaded_blocks, 4u);
  kv.detach(waiting);
}

}  // namespace
}  // namespace kvc::engine
