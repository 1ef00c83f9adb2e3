// The KV cache manager's admission figures, driven directly: what a waiting sequence would
// share and the room it would have.
#include "engine/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "engine/sequence.h"
#include "kv/cache_namespace.h"

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

}  // namespace
}  // namespace kvc::engine
