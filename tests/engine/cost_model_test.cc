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
