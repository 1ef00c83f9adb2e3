#include "engine/cost_model.h"

#include <gtest/gtest.h>

#include <cmath>

namespace kvc::engine {
namespace {

// Passes generated from known coefficients are fitted back exactly.
TEST(CostModel, FitsThePassTimesItIsGiven) {
  CostModel m(16, {1.0, 2.0});
  const double c = 3.0, a = 0.5, b = 0.002;
  for (int i = 0; i < 40; ++i) {
    const size_t tokens = 1 + static_cast<size_t>(i % 5) * 16;
    const double first = (i * 37) % 900;
    double position_sum = 0;
    for (size_t t = 0; t < tokens; ++t) position_sum += first + static_cast<double>(t);
    m.observe_pass(tokens, position_sum, c + a * static_cast<double>(tokens) + b * position_sum);
  }
  const CostModelSnapshot s = m.snapshot();
  EXPECT_NEAR(s.pass_ms, c, 1e-6);
  EXPECT_NEAR(s.token_ms, a, 1e-6);
  EXPECT_NEAR(s.depth_ms, b, 1e-9);
  // A block's share: its tokens and the depth of each, not the pass's fixed cost.
  EXPECT_NEAR(m.recompute_ms(0), 16 * a + b * (16 * 15 / 2.0), 1e-6);
  EXPECT_NEAR(m.recompute_ms(1024), 16 * a + b * (16 * 1024 + 16 * 15 / 2.0), 1e-6);
  EXPECT_GT(m.recompute_ms(4096), m.recompute_ms(0));
}

TEST(CostModel, UnknownRecomputeIsDearAndAlikePassesStillFit) {
  CostModel m(16, {1.0, 2.0});
  EXPECT_TRUE(std::isinf(m.recompute_ms(0)));
  EXPECT_TRUE(m.worth_storing(Tier::kRedis, 0));
  for (int i = 0; i < 5; ++i) m.observe_pass(32, 32 * 15.5, 8.0);  // always the same pass
  EXPECT_GT(m.recompute_ms(0), 0);
  EXPECT_LT(m.recompute_ms(0), 8.0);
}

TEST(CostModel, LoadsAreMeasuredAndDecideStoreOrDrop) {
  // A block recomputes in 0.5 ms at depth 0 and 0.5 + 2 ms at depth 1000.
  CostModel m(10, {0.1, 5.0});
  for (int i = 0; i < 30; ++i) {
    const double first = (i * 53) % 2000;
    const double sum = 10 * first + 45;
    m.observe_pass(10, sum, 0.05 * 10 + 0.0002 * sum);
  }
  EXPECT_TRUE(m.worth_storing(Tier::kDisk, 0));    // 0.1 ms load < 0.5 ms
  EXPECT_FALSE(m.worth_storing(Tier::kRedis, 0));  // 5 ms round trip > 0.5 ms: drop
  EXPECT_TRUE(std::isinf(m.break_even_reuse(Tier::kRedis, 0)));
  m.observe_load(Tier::kRedis, 0.2);  // the first measurement replaces the prior
  EXPECT_DOUBLE_EQ(m.load_ms(Tier::kRedis), 0.2);
  EXPECT_TRUE(m.worth_storing(Tier::kRedis, 0));
  m.observe_load(Tier::kRedis, 1.2);  // then a running average
  EXPECT_NEAR(m.load_ms(Tier::kRedis), 0.4, 1e-12);
  EXPECT_NEAR(m.break_even_reuse(Tier::kDisk, 0), 0.1 / (m.recompute_ms(0) - 0.1), 1e-12);
  EXPECT_EQ(m.snapshot().loads[static_cast<size_t>(Tier::kRedis)], 2u);
}

// A model where a block of 10 tokens at depth 0 recomputes in 0.5 ms (0.509).
CostModel fitted(std::array<double, kTierCount> load_prior_ms) {
  CostModel m(10, load_prior_ms);
  for (int i = 0; i < 30; ++i) {
    const size_t tokens = 5 + static_cast<size_t>(i % 4) * 5;
    const double first = (i * 53) % 2000;
    double sum = 0;
    for (size_t t = 0; t < tokens; ++t) sum += first + static_cast<double>(t);
    m.observe_pass(tokens, sum, 0.05 * static_cast<double>(tokens) + 0.0002 * sum);
  }
  return m;
}

// Blocks are stored once the workload has shown it comes back for them, and dropped (with their
// own reason) while it does not: the expected reads must repay a write.
TEST(CostModel, BlocksAreStoredOnlyWhileTheWorkloadComesBackForThem) {
  CostModel m = fitted({0.1, 0.1});
  EXPECT_NEAR(m.recompute_ms(0), 0.509, 1e-6);
  m.observe_write(Tier::kDisk, 0.1);
  // No reuse seen yet: nothing is worth a write, but a block reused in the pool is (one read
  // saves 0.409 ms, more than the 0.1 ms write).
  EXPECT_DOUBLE_EQ(m.tier_reads_per_block(), 0.0);
  EXPECT_EQ(m.store_decision(Tier::kDisk, 0), TierDecision::kDroppedSeldomReused);
  EXPECT_TRUE(m.store_when_evicted(Tier::kDisk, 0));
  // The workload comes back: every block computed is wanted again once.
  for (int i = 0; i < 40; ++i) {
    m.observe_computed(1);
    m.observe_reuse(1);
  }
  EXPECT_GT(m.tier_reads_per_block(), 0.8);
  EXPECT_EQ(m.store_decision(Tier::kDisk, 0), TierDecision::kStored);
  // Then 400 blocks never wanted again: the estimate falls, and shallow blocks are dropped.
  for (int i = 0; i < 400; ++i) m.observe_computed(1);
  EXPECT_LT(m.tier_reads_per_block(), 0.1);
  EXPECT_EQ(m.store_decision(Tier::kDisk, 0), TierDecision::kDroppedSeldomReused);
  // Deep blocks save more per read, so they are worth storing at a lower reuse.
  EXPECT_EQ(m.store_decision(Tier::kDisk, 1500), TierDecision::kStored);
  // A dearer write (measured) needs more reads, also for a block reused in the pool.
  m.observe_write(Tier::kDisk, 5.0);
  EXPECT_DOUBLE_EQ(m.write_ms(Tier::kDisk), 5.0);
  EXPECT_EQ(m.store_decision(Tier::kDisk, 1500), TierDecision::kDroppedSeldomReused);
  EXPECT_FALSE(m.store_when_evicted(Tier::kDisk, 0));
  EXPECT_FALSE(m.store_when_evicted(Tier::kDisk, 1500));  // 3.4 ms saved < 5 ms
  m.observe_write(Tier::kDisk, -1);                       // no measurement: unchanged
  EXPECT_DOUBLE_EQ(m.write_ms(Tier::kDisk), 5.0);
  // When the workload reads each block three times, those reads of 3.4 ms repay it.
  for (int i = 0; i < 400; ++i) {
    m.observe_computed(1);
    m.observe_reuse(3);
  }
  EXPECT_GT(m.tier_reads_per_block(), 1.5);
  EXPECT_TRUE(m.store_when_evicted(Tier::kDisk, 1500));
  // Recompute cheaper than a load is the first reason, whatever the reuse.
  m.observe_load(Tier::kRedis, 3.0);
  EXPECT_EQ(m.store_decision(Tier::kRedis, 0), TierDecision::kDroppedCheap);
  EXPECT_EQ(tier_decision_name(TierDecision::kDroppedSeldomReused), "dropped_seldom_reused");
  EXPECT_EQ(tier_decision_name(TierDecision::kStoredWhenEvicted), "stored_when_evicted");
  EXPECT_DOUBLE_EQ(m.snapshot().tier_reads_per_block, m.tier_reads_per_block());
}

// Reuse is a recent estimate: what the workload did a few thousand blocks ago is forgotten.
TEST(CostModel, ReuseEstimateForgetsOldWorkloads) {
  CostModel m = fitted({0.1, 0.1});
  for (int i = 0; i < 500; ++i) {
    m.observe_computed(1);
    m.observe_reuse(2);
  }
  EXPECT_GT(m.tier_reads_per_block(), 1.5);
  m.observe_computed(5000);  // a long run of blocks never wanted again
  EXPECT_LT(m.tier_reads_per_block(), 0.01);
  // Before any pass is measured, recompute is unknown and every block is stored.
  CostModel blind(10, {0.1, 0.1});
  blind.observe_computed(5000);
  EXPECT_EQ(blind.store_decision(Tier::kDisk, 0), TierDecision::kStored);
}

TEST(CostModel, ValueGrowsWithReuseAndFallsWithIdleness) {
  kv::BlockFacts often{.hits = 10, .age_ms = 10'000, .idle_ms = 100};
  kv::BlockFacts once{.hits = 0, .age_ms = 10'000, .idle_ms = 100};
  kv::BlockFacts stale{.hits = 10, .age_ms = 10'000, .idle_ms = 9'000};
  EXPECT_GT(CostModel::reuse_per_second(often), CostModel::reuse_per_second(once));
  EXPECT_GT(CostModel::reuse_per_second(often), CostModel::reuse_per_second(stale));
  CostModel m(16, {1.0, 2.0});
  EXPECT_GT(m.pool_value(often, 10.0), m.pool_value(often, 1.0));  // dearer to get back
}

TEST(CostModel, DecisionsAreCountedPerTier) {
  CostModel m(16, {1.0, 2.0});
  m.count(Tier::kDisk, TierDecision::kStored);
  m.count(Tier::kDisk, TierDecision::kStored);
  m.count(Tier::kRedis, TierDecision::kDroppedCheap);
  EXPECT_EQ(m.decisions(Tier::kDisk, TierDecision::kStored), 2u);
  EXPECT_EQ(m.decisions(Tier::kRedis, TierDecision::kDroppedCheap), 1u);
  EXPECT_EQ(m.decisions(Tier::kRedis, TierDecision::kStored), 0u);
  EXPECT_EQ(tier_decision_name(TierDecision::kRecomputedFaster), "recomputed_faster");
}

}  // namespace
}  // namespace kvc::engine
