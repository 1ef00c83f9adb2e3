// The lower KV tiers over HTTP: two server instances on one Redis share computed prefixes, the
// answer says which tier a hit came from, /metrics shows each tier, a flush can clear them, and
// a Redis that is down costs only recomputation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "redis_server.h"
#include "scratch_dir.h"
#include "server/server_fixture.h"

namespace kvc::server::testing {
namespace {

engine::EngineOptions tiered(const std::string& redis_url, const std::string& disk) {
  engine::EngineOptions eo = TestServer::default_engine();
  eo.block_tokens = 16;
  eo.kv_tiers.redis_url = redis_url;
  eo.kv_tiers.redis_timeout_ms = 200;
  eo.kv_tiers.disk_dir = disk;
  eo.kv_tiers.policy = engine::TierPolicy::kKeepAll;
  return eo;
}

json completion(const std::vector<int32_t>& prompt) {
  return {{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}};
}

TEST(HttpTiers, ASecondInstanceAnswersFromRedisWithTheSameText) {
  if (!kvc::testing::redis_server_available()) GTEST_SKIP() << "redis-server not found";
  kvc::testing::RedisServer redis;
  ASSERT_TRUE(redis.running());
  const auto prompt = ids(80, 3);
  const std::string disk = (kvc::testing::scratch_dir() / "http-tiers").string();
  TestServer first(tiny_model(), tiered(redis.url(), ""));
  const Reply a = post(first, "/v1/completions", completion(prompt));
  ASSERT_EQ(a.status, 200) << a.text;
  first.engine->drain_tiers();
  TestServer second(tiny_model(), tiered(redis.url(), disk));
  const Reply b = post(second, "/v1/completions", completion(prompt));
  ASSERT_EQ(b.status, 200) << b.text;
  EXPECT_EQ(b.body["choices"][0]["text"], a.body["choices"][0]["text"]);
  EXPECT_EQ(b.body["kvcache"]["cached_tokens"], 64);
  EXPECT_EQ(b.body["kvcache"]["redis_tokens"], 64);
  EXPECT_EQ(b.body["kvcache"]["disk_tokens"], 0);
  EXPECT_EQ(b.body["usage"]["prompt_tokens_details"]["cached_tokens"], 64);

  second.engine->drain_tiers();
  const Reply m = get(second, "/metrics");
  std::vector<std::string> errors;
  const auto families = parse_prometheus(m.text, errors);
  EXPECT_TRUE(errors.empty()) << ::testing::PrintToString(errors);
  EXPECT_EQ(prom_value(families, "kvcache_tier_hits_total", {{"tier", "redis"}}), 4);
  EXPECT_GE(prom_value(families, "kvcache_tier_stored_blocks_total", {{"tier", "disk"}}), 4);
  EXPECT_EQ(prom_value(families, "kvcache_tier_errors_total", {{"tier", "redis"}, {"kind", "io"}}),
            0);
  // The cost model's figures: decisions (every block stored, under keep-all), load times.
  EXPECT_EQ(prom_value(families, "kvcache_tier_decisions_total",
                       {{"tier", "redis"}, {"decision", "loaded"}}),
            4);
  EXPECT_EQ(prom_value(families, "kvcache_tier_decisions_total",
                       {{"tier", "redis"}, {"decision", "dropped_recompute_cheaper"}}),
            0);
  EXPECT_EQ(prom_value(families, "kvcache_tier_decisions_total",
                       {{"tier", "redis"}, {"decision", "dropped_seldom_reused"}}),
            0);
  EXPECT_EQ(prom_value(families, "kvcache_tier_redis_load_seconds_count", {}), 4);
  EXPECT_GT(prom_value(families, "kvcache_tier_cost_ms", {{"op", "load"}, {"tier", "redis"}}), 0);
  EXPECT_GT(prom_value(families, "kvcache_tier_cost_ms", {{"op", "write"}, {"tier", "redis"}}), 0);
  EXPECT_GT(prom_value(families, "kvcache_tier_reads_per_block", {}), 0);
  EXPECT_GE(prom_value(families, "kvcache_tier_cost_ms", {{"op", "recompute"}, {"depth", "4096"}}),
            prom_value(families, "kvcache_tier_cost_ms", {{"op", "recompute"}, {"depth", "0"}}));

  const Reply flushed = post(second, "/v1/cache/flush", json{{"tiers", true}});
  ASSERT_EQ(flushed.status, 200) << flushed.text;
  EXPECT_GE(flushed.body["flushed_tier_blocks"].get<int>(), 8);  // disk and Redis copies
  const Reply cold = post(second, "/v1/completions", completion(prompt));
  EXPECT_EQ(cold.body["kvcache"]["cached_tokens"], 0);
  EXPECT_EQ(post(second, "/v1/cache/flush", json{{"tiers", "yes"}}).status, 400);
}

TEST(HttpTiers, ARedisThatIsDownCostsOnlyRecomputation) {
  if (!kvc::testing::redis_server_available()) GTEST_SKIP() << "redis-server not found";
  kvc::testing::RedisServer redis;
  ASSERT_TRUE(redis.running());
  TestServer s(tiny_model(), tiered(redis.url(), ""));
  redis.kill();
  for (int i = 0; i < 5; ++i) {
    const Reply r = post(s, "/v1/completions", completion(ids(60, 10 + i)));
    EXPECT_EQ(r.status, 200) << r.text;
  }
  EXPECT_EQ(get(s, "/health").status, 200);
  s.engine->drain_tiers();
  std::vector<std::string> errors;
  const auto families = parse_prometheus(get(s, "/metrics").text, errors);
  const double io =
      prom_value(families, "kvcache_tier_errors_total", {{"tier", "redis"}, {"kind", "io"}});
  const double dropped =
      prom_value(families, "kvcache_tier_errors_total", {{"tier", "redis"}, {"kind", "dropped"}});
  EXPECT_GT(io + dropped, 0);
}

}  // namespace
}  // namespace kvc::server::testing
