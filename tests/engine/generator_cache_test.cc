// DESIGN.md's first invariant with the prefix cache on: whatever was shared, copied, evicted
// or forked, every request's logits and greedy tokens are bit-identical to running it alone
// with the cache off.
#include <gtest/gtest.h>

#include <cstring>

#include "kv/cache_namespace.h"
#include "model/model_fingerprint.h"
#include "model/sampler.h"
#include "reference_generator.h"
#include "test_models.h"

namespace kvc::engine {
namespace {

using kvc::testing::CacheContext;
using kvc::testing::GenerationOptions;
using kvc::testing::GenerationStats;
using kvc::testing::Generator;

struct Trace {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  GenerationStats stats;
};

Trace run(Generator& g, const std::vector<int32_t>& prompt, const CacheContext& cache, int n) {
  Trace t;
  GenerationOptions o;
  o.max_tokens = n;
  o.sampling.temperature = 0.0f;
  o.stop_at_eos = false;
  o.prefill_chunk = 7;
  o.on_logits = [&](std::span<const float> l) { t.logits.emplace_back(l.begin(), l.end()); };
  t.stats = g.generate(
      prompt, o,
      [&](int32_t id) {
        t.tokens.push_back(id);
        return true;
      },
      cache);
  return t;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

std::string model_path() {
  const std::string stories = testing::stories_model_path();
  return stories.empty() ? testing::synthetic_model_path("tiny", DType::F32) : stories;
}

void expect_shared_workload_bit_identical(DType k_dtype, DType v_dtype) {
  SCOPED_TRACE(::testing::Message() << "KV " << dtype_name(k_dtype) << "/" << dtype_name(v_dtype));
  const auto model = model::LlamaModel::load(model_path());
  const int n_vocab = model->config().n_vocab;
  // Blocks of 8 tokens, or the 32 quantised keys are grouped in (preambles scaled alike).
  const int block = kv::block_tokens_for(k_dtype, block_elements(k_dtype) > 1 ? 0 : 8);
  const size_t scale = static_cast<size_t>(block) / 8;
  const kv::KvGeometry g = model->config().kv_geometry(k_dtype, v_dtype, block);
  // Small enough that the workload evicts: about four sequences' worth of blocks.
  const size_t blocks = 40 / scale + (scale > 1 ? 2 : 0);
  kv::BlockPool cached_pool(g, g.bytes_per_block() * blocks);
  kv::BlockPool plain_pool(g, g.bytes_per_block() * blocks);
  kv::PrefixIndex index(cached_pool);
  ThreadPool threads(2);
  Generator cached(*model, cached_pool, threads), plain(*model, plain_pool, threads);
  kv::NamespaceKey key{
      model::model_fingerprint(model->file()), k_dtype, v_dtype, block, "", "", ""};
  const CacheContext tenant_a{&index, kv::namespace_hash(key)};
  key.tenant_salt = "b";
  const CacheContext tenant_b{&index, kv::namespace_hash(key)};

  model::Rng rng(2024);
  const auto random_tokens = [&](size_t n) {
    std::vector<int32_t> v;
    for (size_t i = 0; i < n; ++i)
      v.push_back(3 + static_cast<int32_t>(rng.next() % (n_vocab - 3)));
    return v;
  };
  std::vector<std::vector<int32_t>> preambles = {
      random_tokens(37 * scale), random_tokens(50 * scale), random_tokens(16 * scale)};
  size_t hits = 0;
  for (int request = 0; request < 40; ++request) {
    std::vector<int32_t> prompt = {1};
    const auto& pre = preambles[rng.next() % preambles.size()];
    const size_t keep = rng.next() % (pre.size() + 1);  // a prefix of a preamble, cut anywhere
    prompt.insert(prompt.end(), pre.begin(), pre.begin() + keep);
    const auto tail = random_tokens(1 + rng.next() % 12);
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    const CacheContext& ctx = rng.next() % 4 == 0 ? tenant_b : tenant_a;
    const Trace with = run(cached, prompt, ctx, 6);
    const Trace without = run(plain, prompt, {}, 6);
    ASSERT_EQ(with.tokens, without.tokens) << "request " << request;
    ASSERT_EQ(with.logits.size(), without.logits.size());
    for (size_t i = 0; i < with.logits.size(); ++i) {
      ASSERT_TRUE(same_bits(with.logits[i], without.logits[i]))
          << "request " << request << " step " << i << " cached " << with.stats.cached_tokens;
    }
    hits += with.stats.cached_tokens;
    index.check_invariants();
    EXPECT_EQ(plain_pool.counts().free, plain_pool.num_blocks());
  }
  EXPECT_GT(hits, 200u);                        // the workload really shared prefixes
  EXPECT_GT(index.stats().evicted_blocks, 0u);  // and really evicted
  index.flush();
  EXPECT_EQ(cached_pool.counts().free, cached_pool.num_blocks());  // nothing leaked
}

// Prefixes cut anywhere (partial blocks copied byte for byte) under eviction, with f16 and
// with quantised keys and values: quantised once (keys when their block is full), a hit reads
// the same bytes, and a partly matching block is recomputed rather than copied.
TEST(GeneratorCache, RandomSharedWorkloadUnderEvictionIsBitIdenticalToNoCache) {
  expect_shared_workload_bit_identical(DType::F16, DType::F16);
  expect_shared_workload_bit_identical(DType::Q8_0, DType::Q8_0);
  expect_shared_workload_bit_identical(DType::Q4_0, DType::Q8_0);
}

// Two samples forked from one prompt share its blocks; each continuation's logits equal the
// same sequence run alone.
TEST(GeneratorCache, ForkedSamplesMatchTheirSoloRuns) {
  const auto model = model::LlamaModel::load(model_path());
  const kv::KvGeometry g = model->config().kv_geometry(DType::F16, DType::F16, 16);
  kv::BlockPool pool(g, g.bytes_per_block() * 32);
  ThreadPool threads(2);
  model::ForwardScratch scratch;
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298};
  kv::BlockTable a(pool);
  ASSERT_TRUE(a.reserve(prompt.size()));
  std::vector<model::BatchRow> rows;
  for (size_t i = 0; i < prompt.size(); ++i) {
    rows.push_back({prompt[i], static_cast<int32_t>(i), &a, false});
  }
  model->forward(threads, pool, rows, scratch);
  kv::BlockTable b = a.fork();
  const auto step = [&](kv::BlockTable& t, int32_t token, size_t pos) {
    EXPECT_TRUE(t.reserve(pos + 1) && t.ensure_writable(pos));
    const model::BatchRow row{token, static_cast<int32_t>(pos), &t, true};
    auto l = model->forward(threads, pool, {&row, 1}, scratch);
    return std::vector<float>(l.begin(), l.end());
  };
  const auto la = step(a, 315, prompt.size());
  const auto lb = step(b, 13, prompt.size());
  EXPECT_NE(a.blocks().back(), b.blocks().back());  // the shared partial block was copied
  Generator solo(*model, pool, threads);
  auto pa = prompt, pb = prompt;
  pa.push_back(315);
  pb.push_back(13);
  EXPECT_TRUE(same_bits(la, solo.prompt_logits(pa, 64)));
  EXPECT_TRUE(same_bits(lb, solo.prompt_logits(pb, 64)));
}

TEST(GeneratorCache, MissReasonsReachTheCaller) {
  const auto model = model::LlamaModel::load(testing::synthetic_model_path("tiny", DType::F32));
  const kv::KvGeometry g = model->config().kv_geometry(DType::F16, DType::F16, 16);
  kv::BlockPool pool(g, g.bytes_per_block() * 32);
  kv::PrefixIndex index(pool);
  ThreadPool threads(1);
  Generator gen(*model, pool, threads);
  const CacheContext ctx{&index, kv::namespace_hash({})};
  std::vector<int32_t> prompt(40);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = 3 + static_cast<int32_t>(i);
  EXPECT_EQ(run(gen, prompt, ctx, 2).stats.miss.kind, kv::MissKind::kCold);
  const Trace again = run(gen, prompt, ctx, 2);
  EXPECT_EQ(again.stats.cached_tokens, 39u);
  EXPECT_EQ(again.stats.miss.kind, kv::MissKind::kNone);
  prompt[20] = 500;
  const Trace diverged = run(gen, prompt, ctx, 2);
  EXPECT_EQ(diverged.stats.cached_tokens, 20u);
  EXPECT_EQ(diverged.stats.miss.to_string(0), "diverged@20");
  EXPECT_EQ(run(gen, prompt, {}, 2).stats.miss.kind, kv::MissKind::kDisabled);
}

}  // namespace
}  // namespace kvc::engine
