#include "kv/redis_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "base/error.h"
#include "dns_test_servers.h"
#include "kv/tier_fixtures.h"
#include "redis_server.h"

namespace kvc::kv {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

using namespace tier_fixtures;

RedisStoreOptions options_for(const testing::RedisServer& redis) {
  RedisStoreOptions o;
  o.address = parse_redis_url(redis.url());
  o.timeout_ms = 200;
  o.backoff_initial_ms = 100;
  o.backoff_max_ms = 400;
  return o;
}

#define REQUIRE_REDIS(redis)                                                        \
  if (!testing::redis_server_available()) GTEST_SKIP() << "redis-server not found"; \
  ASSERT_TRUE((redis).running()) << "redis-server did not start"

TEST(RedisUrl, ParsesEveryPart) {
  RedisAddress a = parse_redis_url("redis://cache.local:6380/2");
  EXPECT_EQ(a.host, "cache.local");
  EXPECT_EQ(a.port, 6380);
  EXPECT_EQ(a.db, 2);
  EXPECT_EQ(a.password, "");
  a = parse_redis_url("redis://:s3cret@127.0.0.1:7000");
  EXPECT_EQ(a.password, "s3cret");
  EXPECT_EQ(a.port, 7000);
  a = parse_redis_url("redis://localhost");
  EXPECT_EQ(a.port, 6379);
  EXPECT_EQ(a.db, 0);
  auto error = [](const char* url) {
    try {
      parse_redis_url(url);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  a = parse_redis_url("redis://[::1]:6381/3");
  EXPECT_EQ(a.host, "::1");
  EXPECT_EQ(a.port, 6381);
  EXPECT_EQ(a.db, 3);
  a = parse_redis_url("redis://:pw@[fe80::1%eth0]");
  EXPECT_EQ(a.host, "fe80::1%eth0");
  EXPECT_EQ(a.port, 6379);
  EXPECT_EQ(a.password, "pw");
  EXPECT_THAT(error("redis://[::1"), HasSubstr("'[' without ']'"));
  EXPECT_THAT(error("redis://[::1]x:1"), HasSubstr("text after ']'"));
  EXPECT_THAT(error("http://x:1"), HasSubstr("expected redis://"));
  EXPECT_THAT(error("redis://x:99999"), HasSubstr("out of range"));
  EXPECT_THAT(error("redis://x:abc"), HasSubstr("port 'abc'"));
  EXPECT_THAT(error("redis://:1"), HasSubstr("no host"));
  EXPECT_THAT(error("redis://x:1/db"), HasSubstr("database 'db'"));
}

TEST(RedisStore, RoundTripsBlocksUnderKeysThatRevealNothing) {
  testing::RedisServer redis;
  REQUIRE_REDIS(redis);
  RedisStore store(TierCodec(identity()), options_for(redis));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(store.put(ns_of(1), hash_of(i), 4, payload(i)));
  std::vector<uint8_t> out(payload(0).size());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(store.get(ns_of(1), hash_of(i), out));
    EXPECT_EQ(out, payload(i));
  }
  EXPECT_FALSE(store.get(ns_of(1), hash_of(9), out));
  const std::vector<Hash256> chain = {hash_of(0), hash_of(1), hash_of(9), hash_of(2)};
  EXPECT_EQ(store.present_prefix(ns_of(1), chain), 2u);
  EXPECT_EQ(store.present_prefix(ns_of(2), chain), 0u);  // another namespace holds nothing
  const RedisStoreStats st = store.stats();
  EXPECT_EQ(st.writes, 3u);
  EXPECT_EQ(st.hits, 3u);
  EXPECT_EQ(st.misses, 1u);
  EXPECT_EQ(st.errors, 0u);
  EXPECT_TRUE(st.up);
  EXPECT_THAT(RedisStore::key(ns_of(1), hash_of(0)),
              ::testing::MatchesRegex("kvcache:v1:[0-9a-f]{64}:[0-9a-f]{64}"));
  // Values expire.
  redisContext* c = redis.connect();
  auto* ttl = static_cast<redisReply*>(
      redisCommand(c, "TTL %s", RedisStore::key(ns_of(1), hash_of(0)).c_str()));
  EXPECT_GT(ttl->integer, 3600);
  freeReplyObject(ttl);
  redisFree(c);
  EXPECT_EQ(store.clear(), 3u);
  EXPECT_FALSE(store.get(ns_of(1), hash_of(0), out));
}

TEST(RedisStore, RefusesADamagedValueAndDeletesIt) {
  testing::RedisServer redis;
  REQUIRE_REDIS(redis);
  RedisStore store(TierCodec(identity()), options_for(redis));
  ASSERT_TRUE(store.put(ns_of(1), hash_of(1), 4, payload(1)));
  const std::string key = RedisStore::key(ns_of(1), hash_of(1));
  redisContext* c = redis.connect();
  // Flip one payload byte in place.
  auto* r = static_cast<redisReply*>(redisCommand(c, "SETRANGE %s %d %b", key.c_str(),
                                                  static_cast<int>(kTierHeaderBytes + 3), "\x01",
                                                  size_t{1}));
  freeReplyObject(r);
  std::vector<uint8_t> out(payload(1).size());
  EXPECT_FALSE(store.get(ns_of(1), hash_of(1), out));
  EXPECT_EQ(store.stats().corrupt, 1u);
  r = static_cast<redisReply*>(redisCommand(c, "EXISTS %s", key.c_str()));
  EXPECT_EQ(r->integer, 0);
  freeReplyObject(r);
  // A value that is not a block at all.
  r = static_cast<redisReply*>(redisCommand(c, "SET %s garbage", key.c_str()));
  freeReplyObject(r);
  EXPECT_FALSE(store.get(ns_of(1), hash_of(1), out));
  EXPECT_EQ(store.stats().corrupt, 2u);
  redisFree(c);
  // Another model's reader refuses the block.
  ASSERT_TRUE(store.put(ns_of(1), hash_of(2), 4, payload(2)));
  TierIdentity other = identity();
  other.model_fingerprint.fill(4);
  RedisStore theirs(TierCodec(other), options_for(redis));
  EXPECT_FALSE(theirs.get(ns_of(1), hash_of(2), out));
  EXPECT_EQ(theirs.stats().hits, 0u);
}

TEST(RedisStore, ARedisThatIsDownFailsFastAndBacksOff) {
  int port = 0;
  {
    testing::RedisServer gone;  // a port that nothing listens on once it is stopped
    port = gone.port();
  }
  RedisStoreOptions o;
  o.address.port = port;
  o.timeout_ms = 100;
  o.backoff_initial_ms = 300;
  RedisStore store(TierCodec(identity()), o);
  std::vector<uint8_t> out(payload(0).size());
  const auto t0 = Clock::now();
  EXPECT_FALSE(store.put(ns_of(1), hash_of(1), 4, payload(1)));
  EXPECT_FALSE(store.get(ns_of(1), hash_of(1), out));
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(store.get(ns_of(1), hash_of(1), out));
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  EXPECT_LT(ms, 250) << "a down Redis must not hold callers";
  const RedisStoreStats st = store.stats();
  EXPECT_EQ(st.errors, 2u);     // one failed connect per connection
  EXPECT_EQ(st.skipped, 100u);  // then nothing is tried until the backoff passes
  EXPECT_FALSE(st.up);
}

TEST(RedisStore, ReachesRedisByHostName) {
  testing::RedisServer redis;
  REQUIRE_REDIS(redis);
  RedisStoreOptions o = options_for(redis);
  o.address.host = "localhost";  // the hosts file's; ::1 first is refused, then 127.0.0.1
  o.timeout_ms = 1000;
  RedisStore store(TierCodec(identity()), o);
  ASSERT_TRUE(store.put(ns_of(1), hash_of(1), 4, payload(1)));
  std::vector<uint8_t> out(payload(1).size());
  ASSERT_TRUE(store.get(ns_of(1), hash_of(1), out));
  EXPECT_EQ(out, payload(1));
}

TEST(RedisStore, ADnsServerThatNeverAnswersHoldsCallersOneTimeout) {
  testing::SilentDnsServer dns;
  ASSERT_TRUE(dns.bound());
  RedisStoreOptions o;
  o.address.host = "redis.kvcache-test.example";
  o.dns_servers = dns.servers();
  o.timeout_ms = 100;
  o.backoff_initial_ms = 10000;
  RedisStore store(TierCodec(identity()), o);
  std::vector<uint8_t> out(payload(0).size());
  const auto t0 = Clock::now();
  EXPECT_FALSE(store.get(ns_of(1), hash_of(1), out));
  for (int i = 0; i < 50; ++i) EXPECT_FALSE(store.get(ns_of(1), hash_of(1), out));
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  EXPECT_LT(ms, 600) << "a name lookup with no answer must not hold the step loop";
  const RedisStoreStats st = store.stats();
  EXPECT_EQ(st.errors, 1u);
  EXPECT_EQ(st.skipped, 50u);
}

TEST(RedisStore, RecoversAfterRedisIsKilledAndRestarted) {
  testing::RedisServer redis;
  REQUIRE_REDIS(redis);
  RedisStore store(TierCodec(identity()), options_for(redis));
  ASSERT_TRUE(store.put(ns_of(1), hash_of(1), 4, payload(1)));
  redis.kill();
  std::vector<uint8_t> out(payload(1).size());
  EXPECT_FALSE(store.get(ns_of(1), hash_of(1), out));
  EXPECT_FALSE(store.put(ns_of(1), hash_of(2), 4, payload(2)));
  EXPECT_GE(store.stats().errors, 2u);
  ASSERT_TRUE(redis.restart());
  // Within the backoff (at most 400 ms here) the store is back; the restarted Redis is empty.
  bool back = false;
  for (int i = 0; i < 100 && !back; ++i) {
    back = store.put(ns_of(1), hash_of(3), 4, payload(3));
    if (!back) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(back);
  EXPECT_FALSE(store.get(ns_of(1), hash_of(1), out));
  bool read = false;
  for (int i = 0; i < 100 && !read; ++i) {
    read = store.get(ns_of(1), hash_of(3), out);
    if (!read) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(read);
  EXPECT_EQ(out, payload(3));
}

TEST(RedisStore, MaxmemoryEvictionIsAMissNotAnError) {
  testing::RedisServer redis({"--maxmemory", "3mb", "--maxmemory-policy", "allkeys-lru"});
  REQUIRE_REDIS(redis);
  RedisStore store(TierCodec(identity()), options_for(redis));
  // 6,000 blocks of 704 bytes (and key overhead): far more than 3 MB.
  constexpr int kBlocks = 6000;
  for (int i = 0; i < kBlocks; ++i) {
    ASSERT_TRUE(store.put(ns_of(1), hash_of(i), 4, payload(i)));
  }
  std::vector<uint8_t> out(payload(0).size());
  size_t hits = 0;
  for (int i = 0; i < kBlocks; ++i) {
    if (store.get(ns_of(1), hash_of(i), out)) {
      ++hits;
      EXPECT_EQ(out, payload(i));
    }
  }
  const RedisStoreStats st = store.stats();
  EXPECT_GT(hits, 0u);
  EXPECT_LT(hits, size_t{kBlocks});
  EXPECT_EQ(st.misses, kBlocks - hits);
  EXPECT_EQ(st.errors, 0u);
  EXPECT_EQ(st.corrupt, 0u);
}

}  // namespace
}  // namespace kvc::kv
