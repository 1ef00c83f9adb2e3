#include "kv/memory_plan.h"

#include "base/byte_size.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "base/error.h"
#include "kv/block_pool.h"

namespace kvc::kv {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t KiB = 1024;
constexpr uint64_t MiB = 1024 * KiB;
constexpr uint64_t GiB = 1024 * MiB;

MemoryPlan plan(const AttentionGeometry& g, DType dtype, std::vector<uint64_t> contexts = {},
                int block_tokens = 0) {
  PlanOptions o;
  o.k_dtype = o.v_dtype = dtype;
  o.block_tokens = block_tokens_for(dtype, block_tokens);
  o.contexts = std::move(contexts);
  return plan_memory(g, o);
}

TEST(MemoryPlan, PublishedPerTokenFiguresAtF16AndBf16) {
  for (DType t : {DType::F16, DType::BF16}) {
    // Llama-3-8B: 32 layers, 8 KV heads x 128.
    const MemoryPlan llama8 = plan(AttentionGeometry::uniform(32, 8, 128), t, {131072});
    EXPECT_EQ(llama8.bytes_per_token, 128 * KiB);
    EXPECT_EQ(llama8.requests[0].allocated_bytes, 16 * GiB);
    EXPECT_EQ(llama8.requests[0].exact_bytes, 16 * GiB);
    EXPECT_EQ(plan(AttentionGeometry::uniform(80, 8, 128), t).bytes_per_token, 320 * KiB);
    EXPECT_EQ(plan(AttentionGeometry::uniform(28, 4, 128), t).bytes_per_token, 56 * KiB);
    EXPECT_EQ(plan(AttentionGeometry::uniform(22, 4, 64), t).bytes_per_token, 22 * KiB);
    EXPECT_EQ(plan(AttentionGeometry::uniform(24, 2, 64), t).bytes_per_token, 12 * KiB);
    // DeepSeek-V3 MLA: 61 x (512 + 64) x 2 B, no factor of 2 for K and V.
    const MemoryPlan dsv3 = plan(AttentionGeometry::mla(61, 512 + 64), t);
    EXPECT_EQ(dsv3.bytes_per_token, 70272u);
    EXPECT_NEAR(dsv3.bytes_per_token / 1024.0, 68.6, 0.05);
    EXPECT_FALSE(dsv3.pool_layout);
  }
}

TEST(MemoryPlan, QuantisedDtypesPayTheirScales) {
  const auto g = AttentionGeometry::uniform(32, 8, 128);
  EXPECT_EQ(plan(g, DType::F32).bytes_per_token, 256 * KiB);
  // Keys per channel: 35 bytes per 32 tokens at 8 bits, 19 at 4; values 34 / 18 per 32.
  EXPECT_EQ(plan(g, DType::Q8_0).bytes_per_token, 32u * 8 * (128 * 35 / 32 + 128 / 32 * 34));
  EXPECT_EQ(plan(g, DType::Q4_0).bytes_per_token, 32u * 8 * (128 * 19 / 32 + 128 / 32 * 18));
  // stories260K: the pool groups the 4 KV heads of 8 values of a token, one scale per 32.
  const auto tiny = AttentionGeometry::uniform(5, 4, 8);
  EXPECT_TRUE(tiny.pool_geometry(DType::Q8_0, DType::Q4_0, 32).has_value());
  EXPECT_EQ(plan(tiny, DType::Q8_0).bytes_per_token, 5u * (35 + 34));
  // A running request also holds its last block's keys as f16: 5 layers of 2 KiB, one block.
  const MemoryPlan one = plan(tiny, DType::Q8_0, {33});
  EXPECT_EQ(*one.requests[0].blocks, 2u + 1);
  EXPECT_EQ(one.requests[0].allocated_bytes, 3u * one.bytes_per_block);
  // Where no grouping fits the pool, a value row shorter than a group still takes a whole one.
  const auto odd = AttentionGeometry::uniform(5, 2, 8);
  EXPECT_FALSE(odd.pool_geometry(DType::Q8_0, DType::Q8_0, 32).has_value());
  EXPECT_EQ(plan(odd, DType::Q8_0).bytes_per_token, 5u * 2 * (9 + 34));
  EXPECT_EQ(plan(AttentionGeometry::mla(61, 576), DType::Q8_0).bytes_per_token, 61u * 18 * 34);
  // The block size must be the key group's.
  EXPECT_THROW(plan(tiny, DType::Q8_0, {}, 16), Error);
}

TEST(MemoryPlan, PerLayerCostEqualsKvGeometry) {
  for (DType t : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0}) {
    for (int head_dim : {32, 64, 128}) {
      const auto g = AttentionGeometry::uniform(7, 3, head_dim);
      const auto pool = g.pool_geometry(t, DType::Q4_0, block_tokens_for(t, 0));
      ASSERT_TRUE(pool.has_value());
      EXPECT_EQ(7 * layer_token_bytes(g.layers[0], t, DType::Q4_0), pool->bytes_per_token());
    }
  }
  // The pool stores no bf16: such a plan is costed per layer.
  EXPECT_FALSE(AttentionGeometry::uniform(7, 3, 64).pool_geometry(DType::BF16, DType::F16, 16));
}

TEST(MemoryPlan, BlockRoundingWaste) {
  // 1 layer, 1 head x 4, f32: 32 B/token, 512 B per 16-token block.
  const MemoryPlan p = plan(AttentionGeometry::uniform(1, 1, 4), DType::F32, {16, 17, 32});
  EXPECT_TRUE(p.pool_layout);
  EXPECT_EQ(p.bytes_per_block, 512u);
  EXPECT_EQ(p.requests[0].waste_bytes, 0u);
  EXPECT_EQ(p.requests[1].exact_bytes, 17u * 32);
  EXPECT_EQ(p.requests[1].allocated_bytes, 1024u);
  EXPECT_EQ(p.requests[1].waste_bytes, 1024u - 17 * 32);
  EXPECT_EQ(*p.requests[1].blocks, 2u);
  EXPECT_EQ(p.requests[2].waste_bytes, 0u);
}

struct PoolCase {
  int layers, kv_heads, head_dim, block_tokens;
  DType dtype;
  DType v_dtype;
  uint64_t budget, weights;
};

// The plan is the truth: the pool built from the plan's budget allocates exactly the plan's
// bytes, and holds exactly max_concurrency requests of each context.
TEST(MemoryPlan, EqualsWhatTheBlockPoolAllocates) {
  const PoolCase cases[] = {
      {5, 4, 8, 16, DType::F32, DType::F32, 16 * MiB, 0},         // stories260K
      {5, 4, 8, 16, DType::F16, DType::F16, 3 * MiB + 123, MiB},  // weights out of the budget
      {2, 1, 64, 32, DType::F16, DType::F16, 5 * MiB + 7, 0},     // MQA
      {4, 8, 32, 1, DType::F32, DType::F32, 2 * MiB + 4095, 0},   // one-token blocks
      {3, 2, 16, 7, DType::F16, DType::F16, 1 * MiB + 1, 4097},   // odd block size
      {6, 6, 48, 64, DType::F16, DType::F16, 10 * MiB, 3 * MiB},  // MHA, big blocks
      {22, 4, 64, 16, DType::F16, DType::F16, 12 * MiB, 0},       // TinyLlama geometry
      {5, 4, 8, 32, DType::Q8_0, DType::Q8_0, 16 * MiB, 0},       // stories260K, per token
      {5, 4, 8, 32, DType::Q4_0, DType::F16, 3 * MiB + 5, 0},     // mixed K and V
      {22, 4, 64, 32, DType::Q8_0, DType::Q4_0, 12 * MiB, 0},     // per head
      {3, 2, 16, 16, DType::F32, DType::Q4_0, MiB + 3, 0},        // 2 heads of 16 per group
  };
  for (const PoolCase& c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << c.layers << "x" << c.kv_heads << "x" << c.head_dim << " block "
                 << c.block_tokens << " " << dtype_name(c.dtype) << "/" << dtype_name(c.v_dtype));
    PlanOptions o;
    o.k_dtype = c.dtype;
    o.v_dtype = c.v_dtype;
    o.block_tokens = c.block_tokens;
    o.contexts = {1, 100, 1000, 4097};
    o.concurrencies = {1, 3};
    o.weights_bytes = c.weights;
    o.budget_bytes = c.budget;
    const MemoryPlan p =
        plan_memory(AttentionGeometry::uniform(c.layers, c.kv_heads, c.head_dim), o);
    ASSERT_TRUE(p.pool_layout);

    const KvGeometry g{c.layers, c.kv_heads, c.head_dim, c.block_tokens, c.dtype, c.v_dtype};
    ASSERT_EQ(*p.kv_budget_bytes, c.budget - c.weights);
    BlockPool pool(g, *p.kv_budget_bytes);
    EXPECT_EQ(pool.arena_bytes(), *p.pool_bytes);
    EXPECT_EQ(pool.num_blocks(), *p.pool_blocks);
    EXPECT_EQ(p.bytes_per_block, g.bytes_per_block());
    EXPECT_EQ(p.bytes_per_token, g.bytes_per_token());
    // The pool rebuilt from the plan's own pool_bytes is the same pool.
    EXPECT_EQ(BlockPool(g, *p.pool_bytes).arena_bytes(), *p.pool_bytes);

    for (const RequestFigures& r : p.requests) {
      EXPECT_EQ(*r.blocks, g.blocks_for_sequence(r.context));
      EXPECT_EQ(r.allocated_bytes, *r.blocks * g.bytes_per_block());
      // Fill the pool with max_concurrency requests; one more must not fit.
      BlockPool fresh(g, *p.kv_budget_bytes);
      for (uint64_t i = 0; i < *r.max_concurrency * *r.blocks; ++i) {
        ASSERT_TRUE(fresh.allocate().has_value());
      }
      uint64_t spare = 0;
      while (fresh.allocate()) ++spare;
      EXPECT_LT(spare, *r.blocks);
    }
    for (const ConcurrencyFigures& l : p.limits) {
      const uint64_t per_request = g.blocks_for_sequence(*l.max_context);
      EXPECT_LE(per_request * l.concurrency, pool.num_blocks());
      EXPECT_GT(g.blocks_for_sequence(*l.max_context + 1) * l.concurrency, pool.num_blocks());
    }
  }
}

TEST(MemoryPlan, SlidingWindowLayersAreCappedPerLayerOutsideThePool) {
  // Layers of two shapes: no pool layout, each layer costed as a paged cache would hold it.
  AttentionGeometry g = AttentionGeometry::uniform(2, 8, 128);
  g.layers[1].window = 4096;
  g.layers[1].kv_heads = 4;
  EXPECT_FALSE(g.pool_geometry(DType::F16, DType::F16, 16).has_value());
  const MemoryPlan p = plan(g, DType::F16, {1000, 131072});
  const uint64_t full = 2 * 8 * 128 * 2, windowed = full / 2;
  EXPECT_EQ(p.bytes_per_token, full + windowed);
  EXPECT_EQ(p.requests[0].exact_bytes, 1000 * (full + windowed));
  EXPECT_EQ(p.requests[0].allocated_bytes, 1008 * (full + windowed));
  EXPECT_EQ(p.requests[1].exact_bytes, 131072 * full + 4096 * windowed);
  // A 4096-token window sliding over 16-token blocks straddles up to 257 of them.
  EXPECT_EQ(p.requests[1].allocated_bytes, 131072 * full + 257 * 16 * windowed);
  EXPECT_FALSE(p.requests[1].blocks.has_value());
}

TEST(MemoryPlan, OneWindowOnEveryLayerIsThePoolsWindow) {
  AttentionGeometry g = AttentionGeometry::uniform(2, 8, 128);
  for (auto& layer : g.layers) layer.window = 4096;
  const auto pool = g.pool_geometry(DType::F16, DType::F16, 16);
  ASSERT_TRUE(pool.has_value());
  EXPECT_EQ(pool->window_tokens, 4096);
  const MemoryPlan p = plan(g, DType::F16, {1000, 131072});
  ASSERT_TRUE(p.pool_layout);
  const uint64_t block = 2 * 2 * 8 * 128 * 2 * 16;
  EXPECT_EQ(p.requests[0].allocated_bytes, 63 * block);
  EXPECT_EQ(*p.requests[1].blocks, 257u);
  EXPECT_EQ(p.requests[1].allocated_bytes, 257 * block);
  EXPECT_EQ(p.requests[1].exact_bytes, 4096 * block / 16);
  EXPECT_EQ(*p.requests[1].blocks, pool->blocks_for_sequence(131072));
}

TEST(MemoryPlan, WindowedLayersAmongFullOnesHaveBlocksOfTheirOwn) {
  AttentionGeometry g = AttentionGeometry::uniform(2, 8, 128);
  g.layers[1].window = 4096;  // Gemma 2's interleaving
  const auto pool = g.pool_geometry(DType::F16, DType::F16, 16);
  ASSERT_TRUE(pool.has_value());
  EXPECT_EQ(pool->n_layers, 1);
  EXPECT_EQ(pool->window_tokens, 0);
  EXPECT_EQ(pool->split_window, 4096);
  const MemoryPlan p = plan(g, DType::F16, {1000, 131072});
  const uint64_t block = 2 * 8 * 128 * 2 * 16;  // one layer's K and V of 16 tokens
  EXPECT_EQ(p.bytes_per_block, block);
  EXPECT_EQ(p.bytes_per_token, 2 * block / 16);
  EXPECT_EQ(*p.requests[0].blocks, 63u + 63u);
  EXPECT_EQ(*p.requests[1].blocks, 131072u / 16 + 257u);
  EXPECT_EQ(*p.requests[1].blocks, pool->blocks_for_sequence(131072));
  EXPECT_EQ(p.requests[1].allocated_bytes, (131072 / 16 + 257) * block);
  EXPECT_EQ(p.requests[1].exact_bytes, (131072 + 4096) * block / 16);
  // Three layers, two windowed: groups of two layers, the full one padded.
  g.layers.push_back(g.layers[1]);
  const auto padded = g.pool_geometry(DType::F16, DType::F16, 16);
  ASSERT_TRUE(padded.has_value());
  EXPECT_EQ(padded->n_layers, 2);
  const MemoryPlan q = plan(g, DType::F16, {131072});
  EXPECT_EQ(q.requests[0].allocated_bytes, (131072 / 16 + 257) * 2 * block);
  EXPECT_EQ(q.requests[0].exact_bytes, (131072 + 2 * 4096) * block / 16);
}

TEST(MemoryPlan, LayersOfDifferentWindowsAreAllKeptInFullAsThePoolKeepsThem) {
  AttentionGeometry g = AttentionGeometry::uniform(3, 8, 128);
  g.layers[1].window = 4096;
  g.layers[2].window = 1024;
  const auto pool = g.pool_geometry(DType::F16, DType::F16, 16);
  ASSERT_TRUE(pool.has_value());
  EXPECT_EQ(pool->window_tokens, 0);
  EXPECT_EQ(pool->split_window, 0);
  const MemoryPlan p = plan(g, DType::F16, {131072});
  EXPECT_EQ(*p.requests[0].blocks, 131072u / 16);
  EXPECT_EQ(p.requests[0].allocated_bytes, 131072 * pool->bytes_per_token());
}

TEST(MemoryPlan, LimitsMatchABruteForceSearch) {
  AttentionGeometry g = AttentionGeometry::uniform(6, 2, 64);
  for (size_t i = 0; i < g.layers.size(); i += 2) g.layers[i].window = 100;
  PlanOptions o;
  o.block_tokens = 16;
  o.concurrencies = {1, 3, 7};
  o.budget_bytes = 20 * MiB;
  o.budget_includes_weights = false;
  const MemoryPlan p = plan_memory(g, o);
  for (const auto& l : p.limits) {
    ASSERT_TRUE(l.max_context.has_value());
    PlanOptions probe = o;
    probe.contexts = {*l.max_context, *l.max_context + 1};
    probe.concurrencies = {l.concurrency};
    const MemoryPlan q = plan_memory(g, probe);
    EXPECT_TRUE(*q.cells[0].fits) << l.concurrency;
    EXPECT_FALSE(*q.cells[1].fits) << l.concurrency;
  }
}

TEST(MemoryPlan, AllWindowedLayersFitAnyContext) {
  AttentionGeometry g = AttentionGeometry::uniform(4, 2, 64);
  for (auto& layer : g.layers) layer.window = 4096;
  PlanOptions o;
  o.concurrencies = {1, 100000};
  o.budget_bytes = GiB;
  o.budget_includes_weights = false;
  const MemoryPlan p = plan_memory(g, o);
  EXPECT_FALSE(p.limits[0].max_context.has_value());  // unbounded
  ASSERT_TRUE(p.limits[1].max_context.has_value());
  EXPECT_LT(*p.limits[1].max_context, 4096u);
}

TEST(MemoryPlan, TotalsAddWeights) {
  PlanOptions o;
  o.contexts = {8192};
  o.concurrencies = {1, 8};
  o.weights_bytes = 16060522496;
  o.budget_bytes = 24 * GiB;
  const MemoryPlan p = plan_memory(AttentionGeometry::uniform(32, 8, 128), o);
  EXPECT_EQ(*p.kv_budget_bytes, 24 * GiB - 16060522496);
  EXPECT_EQ(*p.pool_blocks, 4629u);
  EXPECT_EQ(*p.pool_tokens, 4629u * 16);
  EXPECT_EQ(*p.requests[0].max_concurrency, 9u);
  EXPECT_EQ(p.cells[1].kv_bytes, 8 * GiB);
  EXPECT_EQ(p.cells[1].total_bytes, 8 * GiB + 16060522496);
  EXPECT_TRUE(*p.cells[1].fits);
  EXPECT_EQ(*p.limits[1].max_context, 4629u / 8 * 16);
}

TEST(MemoryPlan, BadInputIsNamed) {
  const auto g = AttentionGeometry::uniform(32, 8, 128);
  PlanOptions o;
  o.weights_bytes = 16 * GiB;
  o.budget_bytes = 8 * GiB;
  try {
    plan_memory(g, o);
    FAIL() << "budget below weights accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("8589934592 B"));
    EXPECT_THAT(e.what(), HasSubstr("17179869184 B"));
    EXPECT_THAT(e.what(), HasSubstr("smaller than the weights"));
  }
  o.budget_includes_weights = false;
  EXPECT_NO_THROW(plan_memory(g, o));

  PlanOptions zero;
  zero.block_tokens = 0;
  EXPECT_THROW(plan_memory(g, zero), Error);
  zero.block_tokens = 16;
  zero.contexts = {0};
  EXPECT_THROW(plan_memory(g, zero), Error);
  zero.contexts = {1};
  zero.concurrencies = {0};
  EXPECT_THROW(plan_memory(g, zero), Error);
  EXPECT_THROW(plan_memory(AttentionGeometry{}, PlanOptions{}), Error);
  EXPECT_THROW(plan_memory(AttentionGeometry::uniform(2, 0, 64), PlanOptions{}), Error);
}

TEST(MemoryPlan, FormatBytes) {
  EXPECT_EQ(kvc::format_bytes(0), "0 B");
  EXPECT_EQ(kvc::format_bytes(1023), "1023 B");
  EXPECT_EQ(kvc::format_bytes(1024), "1.0 KiB");
  EXPECT_EQ(kvc::format_bytes(131072), "128.0 KiB");
  EXPECT_EQ(kvc::format_bytes(16773120), "16.0 MiB");
  EXPECT_EQ(kvc::format_bytes(1048575), "1.0 MiB");
  EXPECT_EQ(kvc::format_bytes(16 * GiB), "16.0 GiB");
}

TEST(StartupSummary, StatesThePoolAsThePlanDoes) {
  // stories260K at f32: 5 layers x 2 x 4 heads x 8 x 4 B = 1280 B/token.
  const KvGeometry g{5, 4, 8, 16, DType::F32, DType::F32};
  const std::string summary = startup_summary(g, 16 * MiB, 4096);
  EXPECT_EQ(summary,
            "KV cache: f32, 16-token blocks, 1280 B/token, 20480 B/block, 819 blocks = 16773120 B "
            "(16.0 MiB), holds 13104 tokens\n"
            "KV cache: a 4096-token request takes 256 blocks = 5242880 B (5.0 MiB); 3 such "
            "requests fit at once");
  const BlockPool pool(g, 16 * MiB);
  EXPECT_EQ(startup_summary(g, pool.arena_bytes(), 4096), summary);
  EXPECT_EQ(startup_summary(g, 16 * MiB, 0).find('\n'), std::string::npos);
  EXPECT_THROW(startup_summary(KvGeometry{5, 2, 8, 16, DType::Q8_0, DType::Q8_0}, MiB, 0), Error);
}

}  // namespace
}  // namespace kvc::kv
