// The disk tier through the engine: blocks stored behind the step loop come back bit-identical,
// survive a restart, are refused when damaged or foreign, and stay within their namespace.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "engine/engine_fixture.h"
#include "kv/disk_store.h"
#include "redis_server.h"
#include "scratch_dir.h"

namespace kvc::engine {
namespace {

namespace fs = std::filesystem;

fs::path tier_dir(const std::string& name) {
  return kvc::testing::scratch_dir() / fmt::format("tier-{}", name);
}

EngineOptions tiered(const fs::path& dir) {
  EngineOptions o;
  o.threads = 1;
  o.block_tokens = 16;
  o.kv_tiers.disk_dir = dir.string();
  o.kv_tiers.disk_max_bytes = 64 << 20;
  // These tests are of the mechanism: every block stored, every hit loaded. The cost model's
  // decisions have tests of their own below.
  o.kv_tiers.policy = TierPolicy::kKeepAll;
  return o;
}

Request recorded(std::vector<int32_t> prompt, const kv::Hash256& ns) {
  Request r = greedy(std::move(prompt), 6);
  r.record_logits = true;
  r.ns = ns;
  return r;
}

std::vector<int32_t> prompt_of(const Loaded& m, size_t n, uint64_t seed) {
  model::Rng rng(seed);
  return random_prompt(rng, m.model->config().n_vocab, n);
}

// A cold run's logits: an engine without a prefix cache or tiers.
Completion cold_run(const Loaded& m, const std::vector<int32_t>& prompt) {
  EngineOptions o;
  o.threads = 1;
  o.block_tokens = 16;
  o.prefix_cache = false;
  Engine e(*m.model, *m.tokenizer, o);
  return complete(e, recorded(prompt, kv::Hash256{}));
}

size_t block_files(const fs::path& dir) {
  return kv::DiskStore::stored_blocks(dir).size();
}

TEST(EngineTiers, BlocksLoadedFromDiskGiveBitIdenticalLogits) {
  Loaded m(model_path());
  const auto prompt = prompt_of(m, 100, 1);
  const Completion cold = cold_run(m, prompt);
  const fs::path dir = tier_dir("identical");
  Engine e(*m.model, *m.tokenizer, tiered(dir));
  const kv::Hash256 ns = e.namespace_for("tenant", "");
  const Completion first = complete(e, recorded(prompt, ns));
  e.drain_tiers();
  EXPECT_EQ(e.stats().tiers.disk_store.writes, 6u);  // 100 prompt + 5 written outputs: 6 blocks
  EXPECT_EQ(block_files(dir), 6u);
  e.flush_cache();  // the pool forgets; the disk keeps
  const Completion again = complete(e, recorded(prompt, ns));
  EXPECT_EQ(again.stats.cached_tokens, 96u);
  EXPECT_EQ(again.stats.disk_tokens, 96u);
  ASSERT_EQ(again.logits.size(), cold.logits.size());
  for (size_t i = 0; i < cold.logits.size(); ++i) {
    EXPECT_EQ(again.logits[i], cold.logits[i]) << "step " << i;
    EXPECT_EQ(first.logits[i], cold.logits[i]) << "step " << i;
  }
  EXPECT_EQ(again.tokens, cold.tokens);
  EXPECT_EQ(e.stats().tiers.disk_loaded_blocks, 6u);
  // Each request's lookup counts once in the hit statistics (taking the in-pool prefix to
  // extend it from the disk once counted the second request's prompt twice).
  EXPECT_EQ(e.stats().cache.queried_tokens, 2 * prompt.size());
  EXPECT_EQ(e.stats().cache.hit_tokens, 96u);
}

// lz4 and zstd, each with encryption: still bit-identical. Prints the compression ratio measured
// on stories260K's own keys and values (random data would not compress at all).
TEST(EngineTiers, CompressedAndEncryptedBlocksGiveBitIdenticalLogits) {
  Loaded m(model_path());
  const auto prompt = prompt_of(m, 100, 4);
  const Completion cold = cold_run(m, prompt);
  for (const kv::TierCompression c : {kv::TierCompression::kLz4, kv::TierCompression::kZstd}) {
    SCOPED_TRACE(std::string(kv::tier_compression_name(c)));
    EngineOptions o = tiered(tier_dir(fmt::format("packed-{}", kv::tier_compression_name(c))));
    o.kv_tiers.disk_compression = c;
    o.kv_tiers.key.emplace();
    o.kv_tiers.key->fill(0x5c);
    Engine e(*m.model, *m.tokenizer, o);
    const kv::Hash256 ns = e.namespace_for("tenant", "");
    complete(e, recorded(prompt, ns));
    e.drain_tiers();
    e.flush_cache();
    const Completion again = complete(e, recorded(prompt, ns));
    EXPECT_EQ(again.stats.disk_tokens, 96u);
    EXPECT_EQ(again.logits, cold.logits);
    const kv::DiskStoreStats st = e.stats().tiers.disk_store;
    ASSERT_EQ(st.writes, 6u);
    const double raw =
        6.0 * static_cast<double>(kv::kTierHeaderBytes + e.geometry().bytes_per_block());
    std::printf("[ measured ] %s on stories260K KV (%s): %.3f of the raw bytes\n",
                std::string(kv::tier_compression_name(c)).c_str(),
                std::string(dtype_name(e.geometry().k_dtype)).c_str(),
                static_cast<double>(st.bytes_written) / raw);
  }
}

TEST(EngineTiers, AWarmRestartFindsTheBlocksAgain) {
  Loaded m(model_path());
  const auto prompt = prompt_of(m, 70, 2);
  const Completion cold = cold_run(m, prompt);
  const fs::path dir = tier_dir("restart");
  kv::Hash256 ns{};
  {
    Engine e(*m.model, *m.tokenizer, tiered(dir));
    ns = e.namespace_for("tenant", "");
    complete(e, recorded(prompt, ns));
  }  // the engine finishes its queued writes as it goes
  Engine e(*m.model, *m.tokenizer, tiered(dir));
  EXPECT_EQ(e.stats().tiers.disk_store.found_at_open, 4u);
  const Completion again = complete(e, recorded(prompt, ns));
  EXPECT_EQ(again.stats.cached_tokens, 64u);
  EXPECT_EQ(again.stats.disk_tokens, 64u);
  EXPECT_EQ(again.logits, cold.logits);
}

TEST(EngineTiers, ADamagedBlockIsRecomputedAndCounted) {
  Loaded m(model_path());
  const auto prompt = prompt_of(m, 70, 3);
  const Completion cold = cold_run(m, prompt);
  const fs::path dir = tier_dir("damaged");
  Engine e(*m.model, *m.tokenizer, tiered(dir));
  const kv::Hash256 ns = e.namespace_for("tenant", "");
  complete(e, recorded(prompt, ns));
  e.drain_tiers();
  e.flush_cache();
  // Flip one payload byte of the prompt's second block.
  const auto block = std::vector<int32_t>(prompt.begin(), prompt.begin() + 16);
  kv::Hash256 h = kv::chain_hash(ns, kv::Hash256{}, block);
  h = kv::chain_hash(ns, h, std::span(prompt).subspan(16, 16));
  std::optional<kv::DiskBlockLocation> where;
  for (const kv::StoredDiskBlock& b : kv::DiskStore::stored_blocks(dir)) {
    if (b.hash == h) where = b.location;
  }
  ASSERT_TRUE(where);
  {
    std::fstream f(where->file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(where->offset + kv::kTierHeaderBytes + 5));
    f.put('\x7f');
  }
  const Completion again = complete(e, recorded(prompt, ns));
  EXPECT_EQ(again.stats.disk_tokens, 16u);  // the first block only: the chain breaks after it
  EXPECT_EQ(again.logits, cold.logits);
  EXPECT_EQ(e.stats().tiers.disk_store.corrupt, 1u);
  // The recomputed block was stored again, whole, and serves the next request.
  e.drain_tiers();
  e.flush_cache();
  EXPECT_EQ(complete(e, recorded(prompt, ns)).stats.disk_tokens, 64u);
  EXPECT_EQ(e.stats().tiers.disk_store.corrupt, 1u);
}

TEST(EngineTiers, TiersKeepNamespacesApart) {
  Loaded m(model_path());
  const auto prompt = prompt_of(m, 70, 4);
  const fs::path dir = tier_dir("tenants");
  Engine e(*m.model, *m.tokenizer, tiered(dir));
  complete(e, recorded(prompt, e.namespace_for("alice", "")));
  e.drain_tiers();
  e.flush_cache();
  const Completion bob = complete(e, recorded(prompt, e.namespace_for("bob", "")));
  EXPECT_EQ(bob.stats.cached_tokens, 0u);
  EXPECT_EQ(bob.stats.disk_tokens, 0u);
  EXPECT_EQ(bob.stats.miss.kind, kv::MissKind::kCold);
}

TEST(EngineTiers, FlushingTheTiersDeletesOnlyBlockFiles) {
  Loaded m(model_path());
  const fs::path dir = tier_dir("flush");
  fs::create_directories(dir);
  std::ofstream(dir / "keep.txt") << "not a block";
  Engine e(*m.model, *m.tokenizer, tiered(dir));
  complete(e, recorded(prompt_of(m, 70, 5), e.namespace_for("t", "")));
  e.drain_tiers();
  EXPECT_EQ(block_files(dir), 4u);
  EXPECT_EQ(e.flush_tiers(), 4u);
  EXPECT_EQ(block_files(dir), 0u);
  EXPECT_TRUE(fs::exists(dir / "keep.txt"));
}

EngineOptions with_redis(const kvc::testing::RedisServer& redis) {
  EngineOptions o;
  o.threads = 1;
  o.block_tokens = 16;
  o.kv_tiers.redis_url = redis.url();
  o.kv_tiers.redis_timeout_ms = 200;
  o.kv_tiers.policy = TierPolicy::kKeepAll;
  return o;
}

TEST(EngineTiers, ASecondInstanceHitsWhatTheFirstComputedThroughRedis) {
  if (!kvc::testing::redis_server_available()) GTEST_SKIP() << "redis-server not found";
  kvc::testing::RedisServer redis;
  ASSERT_TRUE(redis.running());
  Loaded m(model_path());
  const auto prompt = prompt_of(m, 70, 6);
  const Completion cold = cold_run(m, prompt);
  Engine first(*m.model, *m.tokenizer, with_redis(redis));
  const kv::Hash256 ns = first.namespace_for("tenant", "");
  complete(first, recorded(prompt, ns));
  first.drain_tiers();
  EXPECT_EQ(first.stats().tiers.redis_store.writes, 4u);
  // Another instance (its own pool and a disk tier) on the same Redis.
  EngineOptions o = with_redis(redis);
  o.kv_tiers.disk_dir = tier_dir("second-instance").string();
  Engine second(*m.model, *m.tokenizer, o);
  const Completion hit = complete(second, recorded(prompt, ns));
  EXPECT_EQ(hit.stats.cached_tokens, 64u);
  EXPECT_EQ(hit.stats.redis_tokens, 64u);
  EXPECT_EQ(hit.logits, cold.logits);
  // What came from Redis is kept on the local disk too.
  second.drain_tiers();
  second.flush_cache();
  const Completion local = complete(second, recorded(prompt, ns));
  EXPECT_EQ(local.stats.disk_tokens, 64u);
  EXPECT_EQ(local.stats.redis_tokens, 0u);
  // Another tenant gets nothing through Redis.
  const Completion other = complete(second, recorded(prompt, second.namespace_for("other", "")));
  EXPECT_EQ(other.stats.cached_tokens, 0u);
  EXPECT_EQ(other.stats.redis_tokens, 0u);
}

TEST(EngineTiers, RequestsKeepTheirAnswersWhileRedisIsDownAndAfterItReturns) {
  if (!kvc::testing::redis_server_available()) GTEST_SKIP() << "redis-server not found";
  kvc::testing::RedisServer redis;
  ASSERT_TRUE(redis.running());
  Loaded m(model_path());
  EngineOptions o = with_redis(redis);
  Engine e(*m.model, *m.tokenizer, o);
  const kv::Hash256 ns = e.namespace_for("tenant", "");
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(prompt_of(m, 50, 10 + i));
  complete(e, recorded(prompts[0], ns));
  redis.kill();
  for (int i = 1; i < 4; ++i) {
    const Completion c = complete(e, recorded(prompts[i], ns));
    EXPECT_TRUE(c.error.empty()) << c.error;
    EXPECT_EQ(c.logits, cold_run(m, prompts[i]).logits);
  }
  e.drain_tiers();
  EXPECT_GT(e.stats().tiers.redis_store.errors + e.stats().tiers.redis_store.skipped, 0u);
  ASSERT_TRUE(redis.restart());
  // After the backoff the tier is used again.
  bool stored = false;
  for (int i = 0; i < 50 && !stored; ++i) {
    const uint64_t before = e.stats().tiers.redis_store.writes;
    complete(e, recorded(prompt_of(m, 40, 100 + i), ns));
    e.drain_tiers();
    stored = e.stats().tiers.redis_store.writes > before;
    if (!stored) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(stored);
}

}  // namespace
}  // namespace kvc::engine

namespace kvc::engine {
namespace {

// Under the cost model, whatever the timings: every sealed block is either stored or dropped
// for each tier, only stored blocks are written, every tier hit is either loaded or recomputed,
// and the answers stay bit-identical to a cold run.
TEST(EngineTiers, TheCostModelsDecisionsAddUpAndNeverChangeAnAnswer) {
  Loaded m(model_path());
  kvc::testing::RedisServer redis;
  if (!kvc::testing::redis_server_available()) GTEST_SKIP() << "redis-server not found";
  EngineOptions o = with_redis(redis);
  o.kv_tiers.policy = TierPolicy::kCostModel;
  o.kv_tiers.disk_dir = tier_dir("cost-model").string();
  Engine e(*m.model, *m.tokenizer, o);
  EXPECT_GT(e.stats().tiers.cost.passes, 0u);  // calibrated at start-up
  const kv::Hash256 ns = e.namespace_for("tenant", "");
  std::vector<std::vector<int32_t>> prompts;
  for (uint64_t i = 0; i < 4; ++i) prompts.push_back(prompt_of(m, 40 + 30 * i, 20 + i));
  for (const auto& p : prompts) complete(e, recorded(p, ns));
  e.drain_tiers();
  const auto n = [](const TierCounts& t, Tier tier, TierDecision d) {
    return t.decisions[static_cast<size_t>(tier)][static_cast<size_t>(d)];
  };
  const TierCounts first = e.stats().tiers;
  // Prompts of 40..130 tokens and 5 written outputs: 2+4+6+8 = 20 full blocks sealed.
  for (const Tier tier : {Tier::kDisk, Tier::kRedis}) {
    EXPECT_EQ(n(first, tier, TierDecision::kStored) + n(first, tier, TierDecision::kDroppedCheap) +
                  n(first, tier, TierDecision::kDroppedSeldomReused),
              20u)
        << tier_name(tier);
  }
  e.flush_cache();
  for (const auto& p : prompts) {
    const Completion again = complete(e, recorded(p, ns));
    EXPECT_EQ(again.logits, cold_run(m, p).logits);
    if (!again.stats.tier_note.empty()) {
      EXPECT_THAT(again.stats.tier_note, ::testing::AnyOf(::testing::HasSubstr("ms to recompute"),
                                                          ::testing::HasSubstr("left the pool")));
    }
  }
  e.drain_tiers();
  const TierCounts t = e.stats().tiers;
  EXPECT_EQ(t.disk_store.writes, n(t, Tier::kDisk, TierDecision::kStored));
  EXPECT_EQ(t.redis_store.writes, n(t, Tier::kRedis, TierDecision::kStored));
  EXPECT_EQ(t.disk_loaded_blocks, n(t, Tier::kDisk, TierDecision::kLoaded));
  EXPECT_EQ(t.redis_loaded_blocks, n(t, Tier::kRedis, TierDecision::kLoaded));
  std::printf(
      "[ measured ] recompute of a 16-token block at depth 0: %.4f ms; load: disk %.4f ms, "
      "redis %.4f ms; disk stored %llu dropped %llu, redis stored %llu dropped %llu\n",
      e.stats().tiers.cost.token_ms * 16, t.cost.load_ms[0], t.cost.load_ms[1],
      static_cast<unsigned long long>(n(t, Tier::kDisk, TierDecision::kStored)),
      static_cast<unsigned long long>(n(t, Tier::kDisk, TierDecision::kDroppedCheap)),
      static_cast<unsigned long long>(n(t, Tier::kRedis, TierDecision::kStored)),
      static_cast<unsigned long long>(n(t, Tier::kRedis, TierDecision::kDroppedCheap)));
}

// The reuse the cost model weighs is the workload's: prompts never seen again lower the expected
// reads per block, prompts that come back after their blocks left the pool raise it, and a
// returning prompt whose blocks no tier kept is told why, in the terms of the decision counted.
TEST(EngineTiers, ReuseIsLearntFromTheWorkloadAndAMissSaysWhyNoTierKeptTheBlock) {
  Loaded m(model_path());
  EngineOptions o = tiered(tier_dir("reuse"));
  o.kv_tiers.policy = TierPolicy::kCostModel;
  Engine e(*m.model, *m.tokenizer, o);
  const kv::Hash256 ns = e.namespace_for("tenant", "");
  const double prior = e.stats().tiers.cost.tier_reads_per_block;
  EXPECT_DOUBLE_EQ(prior, 0.0);
  std::vector<std::vector<int32_t>> prompts;
  for (uint64_t i = 0; i < 12; ++i) prompts.push_back(prompt_of(m, 66, 300 + i));
  for (const auto& p : prompts) complete(e, recorded(p, ns));  // none comes back
  const double unique = e.stats().tiers.cost.tier_reads_per_block;
  EXPECT_DOUBLE_EQ(unique, 0.0);  // no reuse seen, none assumed
  e.drain_tiers();
  e.flush_cache();  // every block leaves the pool
  size_t notes = 0;
  for (const auto& p : prompts) {
    const Completion again = complete(e, recorded(p, ns));
    EXPECT_EQ(again.logits, cold_run(m, p).logits);
    if (again.stats.disk_tokens > 0) continue;  // the disk tier kept its first block
    ++notes;
    // Either the tier holds it and recomputing was faster, or the tier never kept it.
    EXPECT_THAT(again.stats.tier_note,
                ::testing::AnyOf(::testing::HasSubstr("held by the disk tier"),
                                 ::testing::StartsWith("the block at token 0 left the pool and was "
                                                       "recomputed; not kept in the disk tier: ")));
  }
  const TierCounts t = e.stats().tiers;
  EXPECT_GT(t.cost.tier_reads_per_block, unique);  // 12 prompts came back
  const auto n = [&](TierDecision d) {
    return t.decisions[static_cast<size_t>(Tier::kDisk)][static_cast<size_t>(d)];
  };
  EXPECT_EQ(t.disk_writes.offered, n(TierDecision::kStored));  // only stored blocks are written
  if (notes > 0) {
    EXPECT_GT(n(TierDecision::kDroppedCheap) + n(TierDecision::kDroppedSeldomReused), 0u);
  }
  std::printf(
      "[ measured ] reads per block: prior %.3f, after unique prompts %.3f, after returns %.3f; "
      "disk stored %llu, dropped cheap %llu, dropped seldom reused %llu; %zu misses explained\n",
      prior, unique, t.cost.tier_reads_per_block,
      static_cast<unsigned long long>(n(TierDecision::kStored)),
      static_cast<unsigned long long>(n(TierDecision::kDroppedCheap)),
      static_cast<unsigned long long>(n(TierDecision::kDroppedSeldomReused)), notes);
}

// A block the pool reuses is kept in the disk tier by the time the pool evicts it, even when the
// cost model dropped it when it was computed (the workload had shown no reuse): on a model
// whose blocks recompute in milliseconds, a single read repays a write many times.
TEST(EngineTiers, AReusedBlockIsInTheDiskTierOnceThePoolEvictsIt) {
  Loaded m(testing::synthetic_model_path("110m", DType::Q8_0, 2));
  EngineOptions o = tiered(tier_dir("when-evicted"));
  o.kv_tiers.policy = TierPolicy::kCostModel;
  const auto g = m.model->config().kv_geometry(o.kv_k_dtype, o.kv_v_dtype, o.block_tokens);
  o.kv_memory_bytes = 40 * g.bytes_per_block();
  Engine e(*m.model, *m.tokenizer, o);
  const kv::Hash256 ns = e.namespace_for("tenant", "");
  const auto unique = [&](uint64_t seed) { return prompt_of(m, 66, seed); };
  // Blocks never wanted again: the model expects no reads, and drops what it computes.
  for (uint64_t i = 0; i < 4; ++i) complete(e, recorded(prompt_of(m, 258, 500 + i), ns));
  const std::vector<int32_t> reused = unique(1);
  complete(e, recorded(reused, ns));
  const Completion hit = complete(e, recorded(reused, ns));
  EXPECT_GE(hit.stats.cached_tokens, 64u);  // reused in the pool
  // Newer prompts, each reused too, push it out of the pool.
  for (uint64_t i = 0; i < 8; ++i) {
    for (int twice = 0; twice < 2; ++twice) complete(e, recorded(unique(600 + i), ns));
  }
  e.drain_tiers();
  const Completion back = complete(e, recorded(reused, ns));
  // Whatever the pool still holds of it, the rest comes from the disk.
  EXPECT_GE(back.stats.cached_tokens, 64u) << back.stats.tier_note;
  EXPECT_GT(back.stats.disk_tokens, 0u);
  EXPECT_EQ(back.logits, cold_run(m, reused).logits);
  const TierCounts t = e.stats().tiers;
  const auto n = [&](TierDecision d) {
    return t.decisions[static_cast<size_t>(Tier::kDisk)][static_cast<size_t>(d)];
  };
  EXPECT_EQ(t.disk_writes.offered, n(TierDecision::kStored) + n(TierDecision::kStoredWhenEvicted));
  // The reused prompt's blocks were dropped when computed (no reuse seen yet): those loaded
  // from the disk were stored as the pool evicted them.
  EXPECT_GE(n(TierDecision::kStoredWhenEvicted), back.stats.disk_tokens / 16);
  std::printf(
      "[ measured ] disk: stored when computed %llu, dropped as seldom reused %llu, stored when "
      "evicted %llu; reads per block %.3f, write %.3f ms, recompute at depth 0 %.3f ms\n",
      static_cast<unsigned long long>(n(TierDecision::kStored)),
      static_cast<unsigned long long>(n(TierDecision::kDroppedSeldomReused)),
      static_cast<unsigned long long>(n(TierDecision::kStoredWhenEvicted)),
      t.cost.tier_reads_per_block, t.cost.write_ms[0], t.cost.token_ms * 16);
}

// At shutdown, blocks still in the pool that the cost model dropped when they were computed but
// that have been reused since are written, so that a restart finds them on the disk.
TEST(EngineTiers, AWarmRestartUnderTheCostModelFindsTheReusedBlocks) {
  Loaded m(testing::synthetic_model_path("110m", DType::Q8_0, 2));
  EngineOptions o = tiered(tier_dir("cost-restart"));
  o.kv_tiers.policy = TierPolicy::kCostModel;
  const std::vector<int32_t> reused = prompt_of(m, 66, 1);
  std::vector<int32_t> once = prompt_of(m, 66, 2);
  once[0] = 5;  // not even a token in common (a partial copy of a block reuses it too)
  {
    Engine e(*m.model, *m.tokenizer, o);
    const kv::Hash256 ns = e.namespace_for("tenant", "");
    complete(e, recorded(once, ns));
    complete(e, recorded(reused, ns));
    EXPECT_GE(complete(e, recorded(reused, ns)).stats.cached_tokens, 64u);
    e.drain_tiers();
    const TierCounts t = e.stats().tiers;
    const auto& d = t.decisions[static_cast<size_t>(Tier::kDisk)];
    // Nothing was reused when they were computed: nothing was written then.
    EXPECT_EQ(d[static_cast<size_t>(TierDecision::kStored)], 0u);
    EXPECT_EQ(block_files(tier_dir("cost-restart")), 0u);
  }
  // The reused prompt's 4 blocks were written at shutdown; the other prompt's were not.
  EXPECT_EQ(block_files(tier_dir("cost-restart")), 4u);
  Engine again(*m.model, *m.tokenizer, o);
  const kv::Hash256 ns = again.namespace_for("tenant", "");
  const Completion back = complete(again, recorded(reused, ns));
  EXPECT_EQ(back.stats.disk_tokens, 64u) << back.stats.tier_note;
  EXPECT_EQ(back.logits, cold_run(m, reused).logits);
  EXPECT_EQ(complete(again, recorded(once, ns)).stats.disk_tokens, 0u);
}

}  // namespace
}  // namespace kvc::engine
