// The engine on a model whose every layer slides (Mistral style): a sequence holds only the
// blocks its window touches, as `kvcache plan` says, generations longer than the pool complete,
// and cache hits, batches, chunks and preemptions still change no bit of any answer against a
// reference that keeps every block and applies the window's mask.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine_fixture.h"
#include "kv/memory_plan.h"
#include "reference_generator.h"
#include "scratch_dir.h"

namespace kvc::engine {
namespace {

using kvc::testing::GenerationOptions;
using kvc::testing::Generator;

constexpr int kWindow = 40;
constexpr int kBlockTokens = 16;

// A synthetic model with a 40-token window: every layer of a llama (Mistral style) file, the
// even layers of a gemma2 one.
std::string windowed_model_path(const std::string& arch = "llama") {
  static std::map<std::string, std::string> paths;
  auto& path = paths[arch];
  if (path.empty()) {
    model::SyntheticOptions o;
    o.arch = arch;
    o.sliding_window = kWindow;
    path = (testing::scratch_dir() / (arch + "-window-40.gguf")).string();
    model::write_synthetic_model(o, path);
  }
  return path;
}

// Blocks of 16 tokens; 32 for quantised keys (grouped per channel across 32 tokens).
int block_tokens(DType kv) {
  return block_elements(kv) > 1 ? 32 : kBlockTokens;
}

EngineOptions windowed_options(const model::LlamaModel& model, size_t pool_blocks,
                               DType kv = DType::F16) {
  EngineOptions o;
  o.threads = 2;
  o.block_tokens = block_tokens(kv);
  o.kv_k_dtype = o.kv_v_dtype = kv;
  o.max_batch_tokens = 32;
  o.max_running = 4;
  const kv::KvGeometry g = model.config().kv_cache_geometry(kv, kv, block_tokens(kv));
  o.kv_memory_bytes = g.bytes_per_block() * pool_blocks;
  return o;
}

// Greedy tokens and each step's logits of a solo run that keeps every block.
struct Reference {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

Reference solo_run(const model::LlamaModel& model, const std::vector<int32_t>& prompt,
                   int max_tokens, DType kv = DType::F16) {
  const kv::KvGeometry g = model.config().kv_geometry(kv, kv, block_tokens(kv));
  kv::BlockPool pool(g, g.bytes_per_block() * g.blocks_for_sequence(prompt.size() + max_tokens));
  ThreadPool threads(1);
  Generator solo(model, pool, threads);
  GenerationOptions go;
  go.max_tokens = max_tokens;
  go.sampling.temperature = 0.0f;
  go.stop_at_eos = false;
  Reference r;
  go.on_logits = [&](std::span<const float> l) { r.logits.emplace_back(l.begin(), l.end()); };
  solo.generate(prompt, go, [&](int32_t t) {
    r.tokens.push_back(t);
    return true;
  });
  return r;
}

void expect_same_answer(const Outcome& got, const Reference& want, const std::string& what) {
  ASSERT_EQ(got.error, "") << what;
  EXPECT_EQ(got.tokens, want.tokens) << what;
  ASSERT_EQ(got.logits.size(), want.logits.size()) << what;
  for (size_t k = 0; k < want.logits.size(); ++k) {
    ASSERT_EQ(0, std::memcmp(got.logits[k].data(), want.logits[k].data(),
                             want.logits[k].size() * sizeof(float)))
        << what << ": step " << k;
  }
}

// A greedy request of a random prompt through the engine, checked against a solo run.
Outcome expect_solo_answer(Engine& engine, const model::LlamaModel& model, uint64_t seed,
                           size_t prompt_tokens, int max_tokens, const std::string& what) {
  model::Rng rng(seed);
  const auto prompt = random_prompt(rng, model.config().n_vocab, prompt_tokens);
  Request r = greedy(prompt, max_tokens);
  r.record_logits = true;
  Outcome out = complete(engine, r);
  expect_same_answer(out, solo_run(model, prompt, max_tokens), what);
  return out;
}

// What `kvcache plan` says one request of context tokens takes in the engine's pool.
kv::RequestFigures planned(const kv::KvGeometry& g, uint64_t context) {
  kv::PlanOptions po;
  po.k_dtype = g.k_dtype;
  po.v_dtype = g.v_dtype;
  po.block_tokens = g.block_tokens;
  po.contexts = {context};
  return kv::plan_memory(kv::AttentionGeometry::from_kv_geometry(g), po).requests.front();
}

TEST(EngineWindow, AGenerationLongerThanThePoolHoldsOnlyItsWindowAsPlanned) {
  Loaded m(windowed_model_path());
  ASSERT_EQ(m.model->config().kv_window(), kWindow);
  // 8 blocks of 16 tokens: 128 tokens, less than the 260 this request reaches.
  Engine engine(*m.model, *m.tokenizer, windowed_options(*m.model, 8));
  EXPECT_EQ(engine.geometry().window_tokens, kWindow);
  const Outcome out = expect_solo_answer(engine, *m.model, 5, 60, 200, "a 260-token generation");
  EXPECT_EQ(out.stats.preemptions, 0);

  // Its last step wrote position 258 and read positions 219..258: blocks 13 to 16, the most a
  // 40-token window over 16-token blocks can touch (ceil(39 / 16) + 1) and what the plan says.
  const kv::RequestFigures plan = planned(engine.geometry(), 260);
  ASSERT_TRUE(plan.blocks.has_value());
  EXPECT_EQ(*plan.blocks, 4u);
  EXPECT_EQ(out.stats.kv_blocks, *plan.blocks);
  EXPECT_EQ(plan.allocated_bytes, out.stats.kv_blocks * engine.geometry().bytes_per_block());

  const EngineStats s = engine.stats();
  EXPECT_EQ(s.blocks.referenced, 0u);
  EXPECT_EQ(s.blocks.free + s.blocks.cached + s.blocks.pinned, s.blocks.total);
  engine.flush_cache();
  EXPECT_EQ(engine.stats().blocks.free, engine.num_blocks());
}

TEST(EngineWindow, APoolTooSmallForAWholeChunksReachRunsShorterChunks) {
  Loaded m(windowed_model_path());
  EngineOptions o = windowed_options(*m.model, 6);  // a decode reads 4 blocks at most
  o.max_batch_tokens = 512;                         // a 150-token chunk would reach over 12 blocks
  Engine engine(*m.model, *m.tokenizer, o);
  expect_solo_answer(engine, *m.model, 7, 150, 30, "a prompt prefilled in short chunks");
  // A request the pool cannot hold even one token at a time is refused at once.
  const kv::KvGeometry& g = engine.geometry();
  EXPECT_EQ(g.blocks_for_sequence(100000), 4u);
  o.kv_memory_bytes = g.bytes_per_block() * 3;
  Engine tiny(*m.model, *m.tokenizer, o);
  try {
    complete(tiny, greedy(std::vector<int32_t>(150, 5), 30));
    FAIL() << "a request needing 4 blocks was accepted by a 3-block pool";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.kind(), RequestErrorKind::kTooLarge) << e.what();
  }
}

// Eight requests, most sharing a 100-token prompt, in a pool too small for all at once: every
// answer is bit-identical to a solo run that keeps every block.
void expect_pressure_changes_no_bit(const std::string& path, size_t pool_blocks,
                                    DType kv = DType::F16) {
  Loaded m(path);
  const int n_vocab = m.model->config().n_vocab;
  Engine engine(*m.model, *m.tokenizer, windowed_options(*m.model, pool_blocks, kv));
  model::Rng rng(11);
  const auto shared = random_prompt(rng, n_vocab, 100);
  std::vector<Request> requests;
  for (int i = 0; i < 8; ++i) {
    auto p = i % 3 == 2 ? random_prompt(rng, n_vocab, 70 + i) : shared;
    const auto tail = random_prompt(rng, n_vocab, 2 + i % 4);
    p.insert(p.end(), tail.begin() + 1, tail.end());
    Request r = greedy(p, 60);
    r.record_logits = true;
    r.ns = engine.namespace_for("");
    requests.push_back(r);
  }
  std::vector<Outcome> outcomes;
  for (auto& h : engine.submit_all(requests)) outcomes.push_back(collect(*h));
  size_t longest_hit = 0;
  int preemptions = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    expect_same_answer(outcomes[i], solo_run(*m.model, requests[i].prompt, 60, kv),
                       "request " + std::to_string(i));
    longest_hit = std::max(longest_hit, outcomes[i].stats.cached_tokens);
    preemptions += outcomes[i].stats.preemptions;
  }
  // A hit longer than the window reads only its last blocks: those before are holes.
  EXPECT_GT(longest_hit, static_cast<size_t>(2 * kWindow));
  EXPECT_GT(preemptions, 0) << "the pool was meant to be too small for all at once";

  // The shared prompt again, after the pool has moved on: whatever part of it is still
  // usable is reused, and the answer is the same.
  Request again = requests.front();
  const Outcome repeat = complete(engine, again);
  expect_same_answer(repeat, solo_run(*m.model, again.prompt, 60, kv), "the repeat");
  if (repeat.stats.cached_tokens + 1 < again.prompt.size()) {
    EXPECT_NE(repeat.stats.miss.kind, kv::MissKind::kNone);
  }
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.blocks.referenced, 0u);
  engine.flush_cache();
  EXPECT_EQ(engine.stats().blocks.free, engine.num_blocks());
}

TEST(EngineWindow, HitsThroughEvictedBlocksAndBatchesUnderPressureChangeNoBit) {
  // 14 blocks: four sequences of 6 blocks each at their widest cannot all run at once.
  expect_pressure_changes_no_bit(windowed_model_path(), 14);
}

TEST(EngineWindow, Gemma2HitsAndBatchesUnderPressureChangeNoBit) {
  // Each sequence: up to 11 full-layer blocks and 6 windowed-layer ones.
  expect_pressure_changes_no_bit(windowed_model_path("gemma2"), 40);
  // Quantised keys, held as f16 in each group's open-key blocks until a block is full.
  expect_pressure_changes_no_bit(windowed_model_path("gemma2"), 26, DType::Q8_0);
  expect_pressure_changes_no_bit(windowed_model_path(), 14, DType::Q8_0);
}

// Gemma 2: the windowed layers' blocks are split from the full layers' and slide, as the plan
// says, so a long generation holds about half of what keeping every layer would.
TEST(EngineWindow, Gemma2HoldsEveryTokenOfItsFullLayersAndTheWindowOfTheOthers) {
  Loaded m(windowed_model_path("gemma2"));
  const model::LlamaConfig& c = m.model->config();
  ASSERT_EQ(c.kv_split_window(), kWindow);
  Engine engine(*m.model, *m.tokenizer, windowed_options(*m.model, 24));
  const kv::KvGeometry& g = engine.geometry();
  EXPECT_EQ(g.split_window, kWindow);
  EXPECT_EQ(g.n_layers, c.n_layers / 2);
  const Outcome out =
      expect_solo_answer(engine, *m.model, 5, 60, 200, "a 260-token gemma2 generation");
  const kv::RequestFigures plan = planned(g, 260);
  // 17 blocks of the full layers (259 tokens written) and 4 of the windowed ones.
  EXPECT_EQ(*plan.blocks, 17u + 4u);
  EXPECT_EQ(out.stats.kv_blocks, *plan.blocks);
  const kv::KvGeometry whole = c.kv_geometry(DType::F16, DType::F16, kBlockTokens);
  EXPECT_EQ(plan.allocated_bytes * 34,
            whole.blocks_for_sequence(260) * whole.bytes_per_block() * 21);
  engine.flush_cache();
  EXPECT_EQ(engine.stats().blocks.free, engine.num_blocks());
}

// Preemptions stay bounded under a window, where a protected request's whole output cannot
// be taken ahead (its blocks behind the window go back as it runs): its peak is kept free for
// it instead, so that no request is preempted more than max_preemptions + 1 times.
void expect_preemptions_bounded(const std::string& path, size_t pool_blocks) {
  Loaded m(path);
  const int n_vocab = m.model->config().n_vocab;
  EngineOptions o = windowed_options(*m.model, pool_blocks);
  o.max_preemptions = 1;
  o.max_running = 6;
  Engine engine(*m.model, *m.tokenizer, o);
  model::Rng rng(5);
  std::vector<Request> requests;
  for (int i = 0; i < 12; ++i) {
    Request r = greedy(random_prompt(rng, n_vocab, 20 + 7 * (i % 5)), 90);
    r.record_logits = i < 2;
    r.ns = engine.namespace_for("");
    requests.push_back(r);
  }
  std::vector<Outcome> outcomes;
  for (auto& h : engine.submit_all(requests)) outcomes.push_back(collect(*h));
  int preemptions = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(outcomes[i].error, "") << "request " << i;
    EXPECT_EQ(outcomes[i].stats.generated_tokens, 90u) << "request " << i;
    EXPECT_LE(outcomes[i].stats.preemptions, o.max_preemptions + 1) << "request " << i;
    preemptions += outcomes[i].stats.preemptions;
  }
  for (size_t i = 0; i < 2; ++i) {
    expect_same_answer(outcomes[i], solo_run(*m.model, requests[i].prompt, 90),
                       "request " + std::to_string(i));
  }
  EXPECT_GT(preemptions, 0) << "the pool was meant to be too small for all at once";
  EXPECT_EQ(engine.stats().blocks.referenced, 0u);
  engine.flush_cache();
  EXPECT_EQ(engine.stats().blocks.free, engine.num_blocks()) << "a block outlived the tree";
}

// Pools of 9 and 10 blocks preempted a protected request a third time.
TEST(EngineWindow, PreemptionsStayBoundedUnderPressure) {
  for (size_t blocks = 6; blocks <= 16; ++blocks) {
    SCOPED_TRACE(blocks);
    expect_preemptions_bounded(windowed_model_path(), blocks);
  }
}

// Gemma 2's windowed layers were not seen as sliding here: a protected request was grown for its
// whole output ahead, which a pool of 17 blocks could not give, and the engine waited forever.
// At 16, a request recomputing what the window had cut found its full layers' older blocks
// above its own in the tree, where nothing could evict them, and failed for want of room.
TEST(EngineWindow, Gemma2PreemptionsStayBoundedUnderPressure) {
  for (size_t blocks : {16, 17, 18, 20, 24, 28}) {
    SCOPED_TRACE(blocks);
    expect_preemptions_bounded(windowed_model_path("gemma2"), blocks);
  }
}

TEST(EngineWindow, TiersAreRefusedWithAClearError) {
  Loaded m(windowed_model_path());
  EngineOptions o = windowed_options(*m.model, 8);
  o.kv_tiers.disk_dir = (testing::scratch_dir() / "window-tier").string();
  try {
    Engine engine(*m.model, *m.tokenizer, o);
    FAIL() << "a disk tier was accepted for a sliding-window model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sliding-window"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvc::engine
