// The forward pass: the golden run of stories260K, and DESIGN.md's first invariant in its
// first form: logits are bit-identical whether keys and values come from the cache or are
// recomputed, whatever the prefill chunking, the batch company and the thread count.
#include "model/llama_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "base/error.h"
#include "base/kernels.h"
#include "model/gguf_writer.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "reference_generator.h"
#include "test_models.h"

namespace kvc::model {
namespace {

using ::testing::HasSubstr;

// llama2.c's greedy continuation of BOS for stories260K (shared/models/PROVENANCE.md).
const std::vector<int32_t> kReferenceIds = {
    403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338,
    401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385,
    328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266, 267,
    337, 335, 312, 432, 398, 312, 286, 267, 414, 270, 333, 415, 426, 13,  438, 310};

const char kReferenceText[] =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
    "park. One day, she saw a big, red ball. She wanted to play with it, but it was too high.";

struct Rig {
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<kv::BlockPool> pool;
  std::unique_ptr<ThreadPool> threads;
  ForwardScratch scratch;

  Rig(const std::string& path, int n_threads, DType kv_dtype = DType::F32, int block = 0,
      std::optional<DType> v_dtype = std::nullopt) {
    model = LlamaModel::load(path);
    const kv::KvGeometry g =
        model->config().kv_geometry(kv_dtype, v_dtype.value_or(kv_dtype), block);
    pool = std::make_unique<kv::BlockPool>(g, g.bytes_per_block() * 96);
    threads = std::make_unique<ThreadPool>(n_threads);
  }

  // Logits of the last token after running tokens through a fresh sequence in one batch:
  // the no-cache reference, recomputing every key and value.
  std::vector<float> recompute(std::span<const int32_t> tokens) {
    kv::BlockTable table(*pool);
    EXPECT_TRUE(table.reserve(tokens.size()));
    std::vector<BatchRow> rows;
    for (size_t i = 0; i < tokens.size(); ++i) {
      rows.push_back({tokens[i], static_cast<int32_t>(i), &table, i + 1 == tokens.size()});
    }
    auto logits = model->forward(*threads, *pool, rows, scratch);
    return {logits.begin(), logits.end()};
  }
};

std::vector<int32_t> greedy(Rig& rig, std::vector<int32_t> prompt, int n) {
  testing::Generator gen(*rig.model, *rig.pool, *rig.threads);
  testing::GenerationOptions o;
  o.max_tokens = n;
  o.sampling.temperature = 0.0f;
  o.stop_at_eos = false;
  std::vector<int32_t> out;
  gen.generate(prompt, o, [&](int32_t t) {
    out.push_back(t);
    return true;
  });
  return out;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(LlamaModel, GoldenStories260KGreedyRun) {
  KVC_REQUIRE_STORIES(path);
  Rig rig(path, 2);
  const auto file = gguf::File::open(path);
  const Tokenizer tok = Tokenizer::from_gguf(*file);
  const std::vector<int32_t> prompt = tok.encode("Once upon a time", true);
  ASSERT_EQ(prompt, (std::vector<int32_t>{1, 403, 407, 261, 378}));
  const std::vector<int32_t> got = greedy(rig, prompt, 48);
  const std::vector<int32_t> want(kReferenceIds.begin() + 4, kReferenceIds.begin() + 52);
  EXPECT_EQ(got, want);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), got.begin(), got.end());
  EXPECT_EQ(tok.decode(all), std::string(kReferenceText).substr(0, tok.decode(all).size()));
  EXPECT_THAT(tok.decode(all), HasSubstr("She wanted to play with it"));
}

// The heart of the first invariant, checked at every decode step.
void expect_cache_equals_recompute(const std::string& path, DType kv_dtype, int n_threads,
                                   std::optional<DType> v_dtype = std::nullopt) {
  Rig rig(path, n_threads, kv_dtype, 0, v_dtype);
  std::vector<int32_t> seq = {1, 403, 407, 261, 378};
  const int n_vocab = rig.model->config().n_vocab;
  for (int32_t& t : seq) t %= n_vocab;
  kv::BlockTable table(*rig.pool);
  ASSERT_TRUE(table.reserve(64));
  std::vector<BatchRow> rows;
  for (size_t i = 0; i < seq.size(); ++i) {
    rows.push_back({seq[i], static_cast<int32_t>(i), &table, i + 1 == seq.size()});
  }
  auto cached = rig.model->forward(*rig.threads, *rig.pool, rows, rig.scratch);
  std::vector<float> logits(cached.begin(), cached.end());
  for (int step = 0; step < 36; ++step) {
    ASSERT_TRUE(same_bits(logits, rig.recompute(seq)))
        << "step " << step << " kv " << dtype_name(kv_dtype) << "/"
        << dtype_name(v_dtype.value_or(kv_dtype)) << " threads " << n_threads;
    seq.push_back(argmax(logits));
    const BatchRow row{seq.back(), static_cast<int32_t>(seq.size() - 1), &table, true};
    auto next = rig.model->forward(*rig.threads, *rig.pool, {&row, 1}, rig.scratch);
    logits.assign(next.begin(), next.end());
  }
}

TEST(LlamaModel, CachedDecodeIsBitIdenticalToRecompute) {
  KVC_REQUIRE_STORIES(path);
  for (int threads : {1, 2}) {
    expect_cache_equals_recompute(path, DType::F32, threads);
    expect_cache_equals_recompute(path, DType::F16, threads);
  }
}

// Quantised KV: a token's keys and values are quantised once, when written, and read in place;
// stories260K groups its 4 KV heads of 8 per token, the tiny model its 2 heads of 16.
TEST(LlamaModel, QuantisedKvKeepsCachedDecodeBitIdentical) {
  std::vector<std::string> paths = {testing::synthetic_model_path("tiny", DType::Q8_0)};
  if (const std::string stories = testing::stories_model_path(); !stories.empty()) {
    paths.push_back(stories);
  }
  for (const std::string& path : paths) {
    for (int threads : {1, 2}) {
      expect_cache_equals_recompute(path, DType::Q8_0, threads);
      expect_cache_equals_recompute(path, DType::Q4_0, threads);
      expect_cache_equals_recompute(path, DType::Q8_0, threads, DType::F16);
      expect_cache_equals_recompute(path, DType::F16, threads, DType::Q4_0);
    }
  }
}

// Each instruction set's quantised attention (AVX-512's 16-lane loops for heads of 16, its
// AVX2 fallback for heads of 8, AVX2's own, scalar) keeps the invariant.
TEST(LlamaModel, QuantisedKvKeepsTheInvariantOnEveryIsa) {
  const kernels::Isa saved = kernels::active_isa();
  std::vector<std::string> paths = {testing::synthetic_model_path("tiny", DType::F16)};
  if (const std::string stories = testing::stories_model_path(); !stories.empty()) {
    paths.push_back(stories);
  }
  for (kernels::Isa isa : {kernels::Isa::kScalar, kernels::Isa::kAvx2, kernels::Isa::kAvx512}) {
    if (isa > kernels::best_isa()) continue;
    kernels::set_isa(isa);
    for (const std::string& path : paths) {
      expect_cache_equals_recompute(path, DType::Q8_0, 2);
      expect_cache_equals_recompute(path, DType::Q4_0, 2, DType::Q8_0);
    }
  }
  kernels::set_isa(saved);
}

// Quantised keys and values change the logits a little, not the greedy story.
TEST(LlamaModel, Q8KvLogitsStayCloseToF16) {
  KVC_REQUIRE_STORIES(path);
  Rig f16(path, 2, DType::F16), q8(path, 2, DType::Q8_0);
  const auto prompt = std::vector<int32_t>(kReferenceIds.begin(), kReferenceIds.begin() + 40);
  const std::vector<float> a = f16.recompute(prompt), b = q8.recompute(prompt);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(argmax(a), argmax(b));
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += a[i] * a[i];
  }
  EXPECT_LT(std::sqrt(diff / norm), 0.02);
  EXPECT_FALSE(same_bits(a, b));  // the q8_0 path really ran
}

TEST(LlamaModel, CachedDecodeIsBitIdenticalOnSyntheticModelsOfEveryDtype) {
  for (DType t : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0}) {
    expect_cache_equals_recompute(testing::synthetic_model_path("tiny", t), DType::F32, 2);
  }
}

std::vector<int32_t> long_prompt(int n, int n_vocab);
void expect_batch_company_irrelevant(const std::string& path, DType k, DType v);

// A 100-token prompt's logits, prefilled in chunks of 1, 7 and 64 tokens on 1 and 2 threads,
// have the bits of one whole-prompt prefill on 1 thread.
void expect_chunks_and_threads_irrelevant(const std::string& path) {
  Rig one(path, 1), two(path, 2);
  const auto prompt = long_prompt(100, one.model->config().n_vocab);
  testing::Generator g1(*one.model, *one.pool, *one.threads);
  testing::Generator g2(*two.model, *two.pool, *two.threads);
  const std::vector<float> reference = g1.prompt_logits(prompt, 1000);
  for (int chunk : {1, 7, 64}) {
    EXPECT_TRUE(same_bits(reference, g1.prompt_logits(prompt, chunk))) << "chunk " << chunk;
    EXPECT_TRUE(same_bits(reference, g2.prompt_logits(prompt, chunk))) << "2 threads " << chunk;
  }
}

// Each instruction set's kernels (GEMM tiles included) keep the invariant for every weight
// type, at every decode step and every prefill chunk size; an instruction set this CPU lacks
// is reported as skipped.
class EveryIsa : public ::testing::TestWithParam<kernels::Isa> {
 protected:
  void SetUp() override {
    if (GetParam() > kernels::best_isa()) {
      GTEST_SKIP() << "this CPU lacks " << kernels::isa_name(GetParam()) << " (best is "
                   << kernels::isa_name(kernels::best_isa()) << "): its kernels are not tested";
    }
    kernels::set_isa(GetParam());
  }
  void TearDown() override { kernels::set_isa(saved_); }
  kernels::Isa saved_ = kernels::active_isa();
};

// Every weight type make-model writes; the K types on the "small" preset, whose rows hold whole
// 256-element super-blocks (on "tiny" they would fall back to q8_0).
constexpr DType kModelWeightTypes[] = {
    DType::F32,  DType::F16,  DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,  DType::Q5_1,
    DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL};

std::string model_of_type(DType t) {
  return testing::synthetic_model_path(block_elements(t) == 256 ? "small" : "tiny", t);
}

TEST_P(EveryIsa, CachedDecodeAndChunkedPrefillKeepTheInvariant) {
  // bf16 is covered by the kernel tests: make-model does not write it.
  for (DType t : kModelWeightTypes) {
    SCOPED_TRACE(std::string(kernels::isa_name(GetParam())) + " " + std::string(dtype_name(t)));
    const std::string path = model_of_type(t);
    expect_cache_equals_recompute(path, DType::F16, 2);
    expect_chunks_and_threads_irrelevant(path);
  }
}

// Cascade attention: samples forked from one prompt decode in one batch with an unrelated
// sequence, their queries reading each shared block once for all of them (from four on, a
// block's keys are transposed once); each row's logits keep the bits it has alone.
TEST_P(EveryIsa, SequencesSharingAPrefixDecodeTogetherAsAlone) {
  std::vector<std::string> paths = {testing::synthetic_model_path("tiny", DType::F32)};
  if (!testing::stories_model_path().empty()) paths.push_back(testing::stories_model_path());
  for (const std::string& path : paths) {
    for (DType kv : {DType::F16, DType::Q8_0}) {
      SCOPED_TRACE(path + " " + std::string(dtype_name(kv)));
      Rig rig(path, 2, kv);
      const auto prompt = long_prompt(70, rig.model->config().n_vocab);
      kv::BlockTable base(*rig.pool), other(*rig.pool);
      ASSERT_TRUE(base.reserve(prompt.size() + 1) && other.reserve(21));
      std::vector<BatchRow> rows;
      for (size_t i = 0; i < prompt.size(); ++i) {
        rows.push_back({prompt[i], static_cast<int32_t>(i), &base, false});
      }
      for (int i = 0; i < 20; ++i) rows.push_back({prompt[i + 3], i, &other, false});
      rig.model->forward(*rig.threads, *rig.pool, rows, rig.scratch);
      std::vector<kv::BlockTable> samples;
      for (int k = 0; k < 6; ++k) {
        samples.push_back(base.fork());
        ASSERT_TRUE(samples.back().ensure_writable(prompt.size()));
      }
      rows.clear();
      for (int k = 0; k < 6; ++k) {
        rows.push_back({10 + k, static_cast<int32_t>(prompt.size()), &samples[k], true});
        if (k == 4) rows.push_back({5, 20, &other, true});
      }
      const auto logits = rig.model->forward(*rig.threads, *rig.pool, rows, rig.scratch);
      const size_t n_vocab = static_cast<size_t>(rig.model->config().n_vocab);
      const std::vector<float> together(logits.begin(), logits.end());
      for (int k = 0; k < 6; ++k) {
        std::vector<int32_t> tokens = prompt;
        tokens.push_back(10 + k);
        const size_t at = static_cast<size_t>(k + (k > 4 ? 1 : 0)) * n_vocab;
        EXPECT_TRUE(
            same_bits(rig.recompute(tokens), std::span<const float>(together).subspan(at, n_vocab)))
            << "sample " << k;
      }

      // A shorter sequence sharing only the first block leads a tile with a longer one: each
      // reads only its own blocks.
      const int bt = rig.pool->geometry().block_tokens;
      kv::BlockTable shorter(*rig.pool);
      shorter.append_shared(base.blocks().front());
      ASSERT_TRUE(shorter.reserve(bt + 5));
      rows.clear();
      for (int i = bt; i < bt + 4; ++i) rows.push_back({prompt[i], i, &shorter, false});
      rig.model->forward(*rig.threads, *rig.pool, rows, rig.scratch);
      kv::BlockTable longer = base.fork();
      ASSERT_TRUE(longer.ensure_writable(prompt.size()));
      rows = {{9, bt + 4, &shorter, true}, {8, static_cast<int32_t>(prompt.size()), &longer, true}};
      const auto pair = rig.model->forward(*rig.threads, *rig.pool, rows, rig.scratch);
      const std::vector<float> both(pair.begin(), pair.end());
      std::vector<int32_t> short_tokens(prompt.begin(), prompt.begin() + bt + 4);
      short_tokens.push_back(9);
      std::vector<int32_t> long_tokens = prompt;
      long_tokens.push_back(8);
      EXPECT_TRUE(
          same_bits(rig.recompute(short_tokens), std::span<const float>(both).first(n_vocab)));
      EXPECT_TRUE(same_bits(rig.recompute(long_tokens),
                            std::span<const float>(both).subspan(n_vocab, n_vocab)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(LlamaModel, EveryIsa,
                         ::testing::Values(kernels::Isa::kScalar, kernels::Isa::kAvx2,
                                           kernels::Isa::kAvx512),
                         [](const auto& info) {
                           return std::string(kernels::isa_name(info.param));
                         });

// Every quantised weight type computes what f32 arithmetic computes on the same weight values
// (an f32 model holding exactly the values the quantised blocks stand for): the kernels, the
// blocks read in place and the dequantised embedding rows agree, up to the q8_0 rounding of
// the activations the integer kernels multiply by (about 0.5% per product).
TEST(LlamaModel, QuantisedWeightsComputeWhatF32ComputesOnTheirValues) {
  for (DType t : kModelWeightTypes) {
    if (block_elements(t) == 1) continue;
    const std::string preset = block_elements(t) == 256 ? "small" : "tiny";
    const auto dir = testing::scratch_dir();
    const std::string exact_path =
        (dir / (preset + "-f32-values-of-" + std::string(dtype_name(t)) + ".gguf")).string();
    SyntheticOptions o;
    o.preset = preset;
    o.values_of = t;
    write_synthetic_model(o, exact_path);
    Rig exact(exact_path, 1);
    Rig quantised(testing::synthetic_model_path(preset, t), 1);
    EXPECT_EQ(quantised.model->weight_dtype(), t);
    EXPECT_EQ(exact.model->weight_dtype(), DType::F32);
    const auto prompt = long_prompt(30, exact.model->config().n_vocab);
    const std::vector<float> a = exact.recompute(prompt), b = quantised.recompute(prompt);
    ASSERT_EQ(a.size(), b.size());
    double diff = 0.0, norm = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
      diff += (a[i] - b[i]) * (a[i] - b[i]);
      norm += a[i] * a[i];
    }
    const double relative = std::sqrt(diff / norm);
    EXPECT_LT(relative, 0.05) << dtype_name(t);
    EXPECT_GT(relative, 0.0) << dtype_name(t);  // the integer kernels really ran
  }
}

// Rope scaling as llama.cpp applies it: a rope_freqs.weight factor divides its pair's angle
// and linear scaling multiplies every angle by 1 / factor, so factors of 2 everywhere and
// linear scaling by 2 are the same model, bit for bit, and factors of 1 are no scaling at all.
TEST(LlamaModel, RopeFreqFactorsAndLinearScalingScaleTheAngles) {
  const auto dir = testing::scratch_dir();
  const auto write = [&](const std::string& name, std::vector<float> factors, float linear) {
    SyntheticOptions o;
    o.preset = "tiny";
    o.rope_freq_factors = std::move(factors);
    o.rope_linear_factor = linear;
    const std::string path = (dir / (name + ".gguf")).string();
    write_synthetic_model(o, path);
    return path;
  };
  const int pairs = 16 / 2;  // tiny: head dimension 16
  const std::string plain = write("rope-plain", {}, 0.0f);
  const std::string ones = write("rope-ones", std::vector<float>(pairs, 1.0f), 0.0f);
  const std::string twos = write("rope-twos", std::vector<float>(pairs, 2.0f), 0.0f);
  const std::string linear = write("rope-linear", {}, 2.0f);
  const std::string llama31 = write("rope-llama31", llama31_rope_factors(16, 10000.0f), 0.0f);
  const auto logits = [&](const std::string& path) {
    Rig rig(path, 1);
    return rig.recompute(long_prompt(60, rig.model->config().n_vocab));
  };
  const std::vector<float> base = logits(plain);
  EXPECT_TRUE(same_bits(base, logits(ones)));
  EXPECT_TRUE(same_bits(logits(twos), logits(linear)));
  EXPECT_FALSE(same_bits(base, logits(twos)));
  EXPECT_FALSE(same_bits(base, logits(llama31)));

  const std::vector<float> factors = llama31_rope_factors(128, 500000.0f);
  ASSERT_EQ(factors.size(), 64u);
  EXPECT_EQ(factors.front(), 1.0f);  // short wavelengths keep their angle
  EXPECT_EQ(factors.back(), 8.0f);   // wavelengths past 8192 positions are stretched 8x
  EXPECT_TRUE(std::is_sorted(factors.begin(), factors.end()));

  EXPECT_THAT([&] { LlamaModel::load(write("rope-zero", std::vector<float>(pairs, 0.0f), 0.0f)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("rope_freqs.weight holds 0")));
  EXPECT_THAT([&] { LlamaModel::load(write("rope-half", {}, 0.5f)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("rope.scaling.factor 0.5")));
}

// LongRoPE as llama.cpp runs it: the long factors when the context exceeds the original one,
// else the short ones, each dividing its pair's angle as rope_freqs.weight does, and the
// attention factor multiplying every cosine and sine (so 1 changes nothing).
TEST(LlamaModel, LongRopeChoosesItsFactorsByContextAndScalesByItsAttentionFactor) {
  const auto dir = testing::scratch_dir();
  const int pairs = 16 / 2;  // tiny: head dimension 16, context 512
  const auto write = [&](const std::string& name, std::vector<float> freqs,
                         std::optional<LongRope> long_rope) {
    SyntheticOptions o;
    o.preset = "tiny";
    o.rope_freq_factors = std::move(freqs);
    o.long_rope = std::move(long_rope);
    const std::string path = (dir / (name + ".gguf")).string();
    write_synthetic_model(o, path);
    return path;
  };
  const auto logits = [&](const std::string& path) {
    Rig rig(path, 1);
    return rig.recompute(long_prompt(60, rig.model->config().n_vocab));
  };
  const std::vector<float> ones(pairs, 1.0f), twos(pairs, 2.0f), threes(pairs, 3.0f);
  const std::vector<float> with_twos = logits(write("twos", twos, std::nullopt));
  const std::vector<float> with_threes = logits(write("threes", threes, std::nullopt));
  // Context 512 above an original 256: the long factors; at 512 itself: the short ones.
  EXPECT_TRUE(same_bits(with_twos, logits(write("long", {}, LongRope{twos, threes, 256, 1.0f}))));
  EXPECT_TRUE(
      same_bits(with_threes, logits(write("short", {}, LongRope{twos, threes, 512, 1.0f}))));
  const std::vector<float> scaled = logits(write("scaled", {}, LongRope{twos, ones, 256, 1.25f}));
  EXPECT_FALSE(same_bits(with_twos, scaled));
  ASSERT_EQ(scaled.size(), with_twos.size());
  for (float v : scaled) ASSERT_TRUE(std::isfinite(v));

  // make-model's Phi-3.5 shape: rising factors, and the attention factor of its converter.
  const LongRope phi35 = phi35_long_rope(96, 131072, 4096);
  ASSERT_EQ(phi35.long_factors.size(), 48u);
  EXPECT_TRUE(std::is_sorted(phi35.long_factors.begin(), phi35.long_factors.end()));
  EXPECT_EQ(phi35.short_factors.front(), 1.0f);
  EXPECT_NEAR(phi35.attn_factor, std::sqrt(1.0 + std::log(32.0) / std::log(4096.0)), 1e-6);
  SyntheticOptions o;
  o.preset = "tiny";
  o.arch = "phi3";
  o.long_rope = phi35_long_rope(16, 512, 16);
  const std::string phi3 = (dir / "phi3-longrope.gguf").string();
  write_synthetic_model(o, phi3);
  const auto model = LlamaModel::load(phi3);
  EXPECT_EQ(model->config().rope_original_context, 16);
  EXPECT_FLOAT_EQ(model->config().rope_attn_factor, o.long_rope->attn_factor);

  EXPECT_THAT(
      [&] {
        LlamaModel::load(write("zero-long", {}, LongRope{ones, ones, 256, 0.0f}));
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("rope.scaling.attn_factor 0")));
  std::vector<float> bad = ones;
  bad[3] = -1.0f;
  EXPECT_THAT(
      [&] {
        LlamaModel::load(write("bad-long", {}, LongRope{bad, ones, 256, 1.0f}));
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("rope_factors_long.weight holds -1")));
}

// The same weights as a qwen2 file (rotary pairs in halves), rewritten as a llama file whose Q
// and K rows (and biases) are permuted so that adjacent pairs hold what the halves held: the
// permutation llama.cpp's converter applies to Llama checkpoints. f32 weights only.
std::string as_adjacent_llama(const std::string& qwen2_path, const std::string& out_path) {
  const auto file = gguf::File::open(qwen2_path);
  const int head_dim = static_cast<int>(file->get_u64("qwen2.rope.dimension_count"));
  gguf::Writer w;
  for (const auto& [key, value] : file->metadata()) {
    std::string name = key;
    if (name.rfind("qwen2.", 0) == 0) name = "llama." + name.substr(6);
    if (name == "general.architecture") {
      w.set_string(name, "llama");
    } else {
      w.set(name, value);
    }
  }
  for (const gguf::TensorInfo& t : file->tensors()) {
    const bool permute =
        t.name.find("attn_q.") != std::string::npos || t.name.find("attn_k.") != std::string::npos;
    w.add_tensor(t.name, t.dims, t.dtype, [&t, permute, head_dim](uint8_t* dst, size_t bytes) {
      std::memcpy(dst, t.data, bytes);
      if (!permute) return;
      EXPECT_EQ(t.dtype, DType::F32);
      // Bias vectors are one row of scalars; weight matrices have rows of dims[0] floats.
      const size_t row = t.dims.size() == 1 ? 1 : t.dims[0];
      const size_t rows = t.dims.size() == 1 ? t.dims[0] : t.dims[1];
      const auto* src = reinterpret_cast<const float*>(t.data);
      auto* out = reinterpret_cast<float*>(dst);
      const int half = head_dim / 2;
      for (size_t r = 0; r < rows; ++r) {
        const size_t head = r / head_dim, i = r % head_dim;
        const size_t from = head * head_dim + (i % 2 == 0 ? i / 2 : half + i / 2);
        std::memcpy(out + r * row, src + from * row, row * sizeof(float));
      }
    });
  }
  w.write(out_path);
  return out_path;
}

double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += a[i] * a[i];
  }
  return std::sqrt(diff / norm);
}

// qwen2 and qwen3: biases and per-head norms change the model, NEOX rotary is llama's adjacent
// rotary on permuted weights, and the exactness invariant holds for both.
TEST(LlamaModel, Qwen2AndQwen3ArchitecturesComputeTheirModels) {
  const auto dir = testing::scratch_dir();
  const auto write = [&](const std::string& arch, DType t) {
    SyntheticOptions o;
    o.preset = block_elements(t) == 256 ? "small" : "tiny";
    o.arch = arch;
    o.dtype = t;
    const std::string path = (dir / (arch + "-" + std::string(dtype_name(t)) + ".gguf")).string();
    write_synthetic_model(o, path);
    return path;
  };
  const std::string qwen2 = write("qwen2", DType::F32), qwen3 = write("qwen3", DType::F32);
  const std::string llama = testing::synthetic_model_path("tiny", DType::F32);
  const auto logits = [](const std::string& path) {
    Rig rig(path, 1);
    return rig.recompute(long_prompt(50, rig.model->config().n_vocab));
  };
  EXPECT_EQ(LlamaModel::load(qwen2)->config().rope_layout, RopeLayout::kHalves);
  EXPECT_TRUE(LlamaModel::load(qwen3)->config().qk_norm);
  const std::vector<float> l = logits(llama), q2 = logits(qwen2), q3 = logits(qwen3);
  EXPECT_GT(relative_difference(l, q2), 0.01);  // the biases and the rotary layout matter
  EXPECT_GT(relative_difference(l, q3), 0.01);  // so do the Q/K norms
  const std::vector<float> twin = logits(as_adjacent_llama(qwen2, (dir / "twin.gguf").string()));
  EXPECT_LT(relative_difference(q2, twin), 1e-5);  // only the order of attention's sums differs

  for (const std::string& path :
       {qwen2, qwen3, write("qwen2", DType::Q4_K), write("qwen3", DType::Q8_0)}) {
    SCOPED_TRACE(path);
    expect_cache_equals_recompute(path, DType::F16, 2);
    expect_cache_equals_recompute(path, DType::Q8_0, 1);
  }
  // A qwen3 file without its Q norms is refused, naming the tensor.
  const auto file = gguf::File::open(qwen3);
  gguf::Writer w;
  for (const auto& [key, value] : file->metadata()) w.set(key, value);
  for (const gguf::TensorInfo& t : file->tensors()) {
    if (t.name == "blk.1.attn_q_norm.weight") continue;
    w.add_tensor(t.name, t.dims, t.dtype,
                 [&t](uint8_t* dst, size_t bytes) { std::memcpy(dst, t.data, bytes); });
  }
  const std::string broken = (dir / "qwen3-no-q-norm.gguf").string();
  w.write(broken);
  EXPECT_THAT([&] { LlamaModel::load(broken); },
              ::testing::ThrowsMessage<Error>(HasSubstr("blk.1.attn_q_norm.weight")));
}

// phi3's fused matrices are read as views of their rows: a phi3 file gives the bits of the
// same weights split into separate Q, K, V, gate and up tensors (a qwen2 file without biases,
// which rotates alike).
TEST(LlamaModel, Phi3FusedMatricesAreTheirSplitParts) {
  const auto dir = testing::scratch_dir();
  for (DType t : {DType::F32, DType::Q4_K}) {
    SyntheticOptions o;
    o.preset = block_elements(t) == 256 ? "small" : "tiny";
    o.arch = "phi3";
    o.dtype = t;
    const std::string phi3 = (dir / ("phi3-" + std::string(dtype_name(t)) + ".gguf")).string();
    write_synthetic_model(o, phi3);
    const auto file = gguf::File::open(phi3);
    const LlamaConfig c = LlamaModel::load(phi3)->config();
    const size_t q = c.q_dim(), kv = c.kv_dim(), ff = c.n_ff;
    gguf::Writer w;
    for (const auto& [key, value] : file->metadata()) {
      std::string name = key;
      if (name.rfind("phi3.", 0) == 0) name = "qwen2." + name.substr(5);
      if (name == "general.architecture") {
        w.set_string(name, "qwen2");
      } else {
        w.set(name, value);
      }
    }
    const auto add_rows = [&](const gguf::TensorInfo& t, const std::string& name, size_t first,
                              size_t count) {
      const size_t stride = row_bytes(t.dtype, t.dims[0]);
      w.add_tensor(name, {t.dims[0], count}, t.dtype, [&t, stride, first](uint8_t* dst, size_t n) {
        std::memcpy(dst, t.data + first * stride, n);
      });
    };
    for (const gguf::TensorInfo& t : file->tensors()) {
      const std::string prefix = t.name.substr(0, t.name.find('.', 4) + 1);
      if (t.name.ends_with("attn_qkv.weight")) {
        add_rows(t, prefix + "attn_q.weight", 0, q);
        add_rows(t, prefix + "attn_k.weight", q, kv);
        add_rows(t, prefix + "attn_v.weight", q + kv, kv);
      } else if (t.name.ends_with("ffn_up.weight")) {
        add_rows(t, prefix + "ffn_gate.weight", 0, ff);
        add_rows(t, prefix + "ffn_up.weight", ff, ff);
      } else {
        w.add_tensor(t.name, t.dims, t.dtype,
                     [&t](uint8_t* dst, size_t n) { std::memcpy(dst, t.data, n); });
      }
    }
    const std::string split =
        (dir / ("phi3-split-" + std::string(dtype_name(t)) + ".gguf")).string();
    w.write(split);
    Rig a(phi3, 2), b(split, 2);
    const auto prompt = long_prompt(40, a.model->config().n_vocab);
    EXPECT_TRUE(same_bits(a.recompute(prompt), b.recompute(prompt))) << dtype_name(t);
    expect_cache_equals_recompute(phi3, DType::F16, 2);
  }
}

// Sliding-window attention as llama.cpp runs it (and for Mistral-style llama files, which it
// runs without): on a one-layer model (whose keys depend only
// on their token and position), the last position's logits depend on the last `window` tokens
// only; chunks, threads, batches and cache hits still change no bit; gemma2 slides on even
// layers only.
TEST(LlamaModel, SlidingWindowsSeeOnlyTheirLastTokens) {
  const auto dir = testing::scratch_dir();
  for (const std::string arch : {"llama", "phi3", "gemma2"}) {
    SyntheticOptions o;
    o.arch = arch;
    o.layers = 1;
    o.sliding_window = 8;
    const std::string path = (dir / (arch + "-window-8.gguf")).string();
    write_synthetic_model(o, path);
    o.sliding_window = 0;
    const std::string full = (dir / (arch + "-window-full.gguf")).string();
    write_synthetic_model(o, full);
    Rig rig(path, 1), rig_full(full, 1);
    EXPECT_EQ(rig.model->config().sliding_window, 8);
    EXPECT_EQ(rig.model->config().context_length, 512);
    const int n_vocab = rig.model->config().n_vocab;
    std::vector<int32_t> a = long_prompt(20, n_vocab), b = a;
    for (int i = 1; i < 12; ++i)
      b[i] = 3 + (a[i] + 17) % (n_vocab - 3);  // differs before the window
    EXPECT_TRUE(same_bits(rig.recompute(a), rig.recompute(b))) << arch;
    EXPECT_FALSE(same_bits(rig_full.recompute(a), rig_full.recompute(b))) << arch;
    b[12] = 3 + (a[12] + 17) % (n_vocab - 3);  // the window's first token
    EXPECT_FALSE(same_bits(rig.recompute(a), rig.recompute(b))) << arch;
  }
  SyntheticOptions o;
  o.arch = "gemma2";
  o.sliding_window = 24;
  const std::string gemma = (dir / "gemma2-window-24.gguf").string();
  write_synthetic_model(o, gemma);
  const LlamaConfig c = LlamaModel::load(gemma)->config();
  EXPECT_TRUE(c.layer_slides(0));
  EXPECT_FALSE(c.layer_slides(1));
  o.arch = "phi3";
  o.sliding_window = 20;
  const std::string phi3 = (dir / "phi3-window-20.gguf").string();
  write_synthetic_model(o, phi3);
  for (const std::string& path : {gemma, phi3}) {
    SCOPED_TRACE(path);
    expect_cache_equals_recompute(path, DType::F16, 2);
    expect_cache_equals_recompute(path, DType::Q8_0, 1);
    expect_chunks_and_threads_irrelevant(path);
    expect_batch_company_irrelevant(path, DType::F16, DType::F16);
  }
}

// gemma2: logits soft-capped at 30 (never beyond, however large the raw values), the
// embedding tied, GELU and post norms in place; the invariant holds with every KV dtype.
TEST(LlamaModel, Gemma2CapsItsLogitsAndKeepsTheInvariant) {
  const auto dir = testing::scratch_dir();
  for (DType t : {DType::F32, DType::Q6_K}) {
    SyntheticOptions o;
    o.preset = block_elements(t) == 256 ? "small" : "tiny";
    o.arch = "gemma2";
    o.dtype = t;
    const std::string path = (dir / ("gemma2-" + std::string(dtype_name(t)) + ".gguf")).string();
    write_synthetic_model(o, path);
    const auto model = LlamaModel::load(path);
    const LlamaConfig& c = model->config();
    EXPECT_EQ(model->file().find_tensor("output.weight"), nullptr);
    EXPECT_FLOAT_EQ(c.final_softcap, 30.0f);
    EXPECT_FLOAT_EQ(c.attn_softcap, 50.0f);
    EXPECT_FLOAT_EQ(c.embedding_scale, std::sqrt(static_cast<float>(c.n_embd)));
    Rig rig(path, 2);
    const std::vector<float> logits = rig.recompute(long_prompt(40, c.n_vocab));
    float largest = 0.0f;
    for (float v : logits) largest = std::max(largest, std::fabs(v));
    EXPECT_LE(largest, 30.0f);
    EXPECT_GT(largest, 1.0f);
    expect_cache_equals_recompute(path, DType::F16, 2);
    expect_cache_equals_recompute(path, DType::Q8_0, 1, DType::Q4_0);
  }
}

std::vector<int32_t> long_prompt(int n, int n_vocab) {
  Rng rng(3);
  std::vector<int32_t> p = {1};
  while (static_cast<int>(p.size()) < n)
    p.push_back(3 + static_cast<int32_t>(rng.next() % (n_vocab - 3)));
  return p;
}

TEST(LlamaModel, PrefillChunkSizeAndThreadsDoNotChangeLogits) {
  std::string path = testing::stories_model_path();
  if (path.empty()) path = testing::synthetic_model_path("tiny", DType::F32);
  for (const auto& [k, v] : {std::pair{DType::F32, DType::F32}, std::pair{DType::Q8_0, DType::Q8_0},
                             std::pair{DType::Q4_0, DType::F16}}) {
    Rig one(path, 1, k, 0, v), two(path, 2, k, 0, v);
    const auto prompt = long_prompt(150, one.model->config().n_vocab);
    testing::Generator g1(*one.model, *one.pool, *one.threads);
    testing::Generator g2(*two.model, *two.pool, *two.threads);
    const std::vector<float> reference = g1.prompt_logits(prompt, 1000);
    for (int chunk : {1, 7, 64}) {
      EXPECT_TRUE(same_bits(reference, g1.prompt_logits(prompt, chunk)))
          << dtype_name(k) << " chunk " << chunk;
      EXPECT_TRUE(same_bits(reference, g2.prompt_logits(prompt, chunk)))
          << dtype_name(k) << " 2 threads " << chunk;
    }
    EXPECT_EQ(one.pool->counts().free, one.pool->num_blocks());  // every table released
  }
}

// Rows of one sequence batched with rows of others, at other positions, give the same
// logits as the sequence run alone.
void expect_batch_company_irrelevant(const std::string& path, DType k, DType v) {
  Rig rig(path, 2, k, 0, v);
  const int n_vocab = rig.model->config().n_vocab;
  const auto a = long_prompt(40, n_vocab);
  const std::vector<float> alone = rig.recompute(a);

  kv::BlockTable ta(*rig.pool), tb(*rig.pool), tc(*rig.pool);
  ASSERT_TRUE(ta.reserve(a.size()) && tb.reserve(100) && tc.reserve(100));
  const auto b = long_prompt(90, n_vocab);
  // Warm sequence b with 60 tokens so its rows below sit at later positions.
  std::vector<BatchRow> warm;
  for (int i = 0; i < 60; ++i) warm.push_back({b[i], i, &tb, false});
  rig.model->forward(*rig.threads, *rig.pool, warm, rig.scratch);
  std::vector<BatchRow> mixed;
  for (size_t i = 0; i < a.size(); ++i) {
    mixed.push_back({b[60 + i % 30], static_cast<int32_t>(60 + i % 30), &tb, i % 3 == 0});
    mixed.push_back({a[i], static_cast<int32_t>(i), &ta, i + 1 == a.size()});
    if (i < 5) mixed.push_back({7, static_cast<int32_t>(i), &tc, true});
  }
  // Drop b's duplicated positions: each (sequence, position) appears once.
  std::vector<BatchRow> rows;
  std::vector<bool> seen(200, false);
  for (const BatchRow& r : mixed) {
    if (r.table == &tb) {
      if (seen[r.pos]) continue;
      seen[r.pos] = true;
    }
    rows.push_back(r);
  }
  auto logits = rig.model->forward(*rig.threads, *rig.pool, rows, rig.scratch);
  size_t index = 0, a_index = 0;
  for (const BatchRow& r : rows) {
    if (!r.want_logits) continue;
    if (r.table == &ta) a_index = index;
    ++index;
  }
  EXPECT_TRUE(same_bits(alone, logits.subspan(a_index * n_vocab, n_vocab)))
      << dtype_name(k) << "/" << dtype_name(v);
}

TEST(LlamaModel, BatchCompanyDoesNotChangeLogits) {
  std::string path = testing::stories_model_path();
  if (path.empty()) path = testing::synthetic_model_path("tiny", DType::F32);
  expect_batch_company_irrelevant(path, DType::F32, DType::F32);
  expect_batch_company_irrelevant(path, DType::Q8_0, DType::Q8_0);
  expect_batch_company_irrelevant(path, DType::Q4_0, DType::Q8_0);
}

TEST(LlamaModel, RejectsRowsOutsideTheirBlocksAndBadTokens) {
  Rig rig(testing::synthetic_model_path("tiny", DType::F32), 1);
  kv::BlockTable table(*rig.pool);
  ASSERT_TRUE(table.reserve(16));
  BatchRow row{1, 16, &table, true};
  EXPECT_THAT(
      [&] {
        rig.model->forward(*rig.threads, *rig.pool, {&row, 1}, rig.scratch);
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("position 16")));
  row = {100000, 0, &table, true};
  EXPECT_THAT(
      [&] {
        rig.model->forward(*rig.threads, *rig.pool, {&row, 1}, rig.scratch);
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("token id 100000")));
}

// Copies a model, letting edit drop or reshape tensors and metadata, to make broken files.
std::string edited_copy(const std::string& src, const std::string& name,
                        const std::function<bool(gguf::Writer&, const gguf::TensorInfo&)>& keep,
                        const std::function<void(gguf::Writer&)>& meta = {}) {
  const auto file = gguf::File::open(src);
  auto holder = std::shared_ptr<const gguf::File>(file.get(), [](const gguf::File*) {});
  gguf::Writer w;
  for (const auto& [key, value] : file->metadata()) w.set(key, value);
  if (meta) meta(w);
  for (const auto& t : file->tensors()) {
    if (!keep(w, t)) continue;
    const uint8_t* data = t.data;
    w.add_tensor(t.name, t.dims, t.dtype,
                 [data](uint8_t* dst, size_t bytes) { std::memcpy(dst, data, bytes); });
  }
  const std::string path = (testing::scratch_dir() / name).string();
  w.write(path);
  return path;
}

TEST(LlamaModel, BrokenModelsNameWhatIsWrong) {
  const std::string tiny = testing::synthetic_model_path("tiny", DType::F32);
  const auto keep_all = [](gguf::Writer&, const gguf::TensorInfo&) { return true; };
  const std::string missing = edited_copy(
      tiny, "missing.gguf",
      [](gguf::Writer&, const gguf::TensorInfo& t) { return t.name != "blk.1.ffn_up.weight"; });
  EXPECT_THAT([&] { LlamaModel::load(missing); },
              ::testing::ThrowsMessage<Error>(HasSubstr("'blk.1.ffn_up.weight' is missing")));
  const std::string reshaped =
      edited_copy(tiny, "reshaped.gguf", [](gguf::Writer& w, const gguf::TensorInfo& t) {
        if (t.name != "blk.0.attn_k.weight") return true;
        w.add_tensor(t.name, {t.dims[1], t.dims[0]}, t.dtype, [](uint8_t*, size_t) {});
        return false;
      });
  EXPECT_THAT([&] { LlamaModel::load(reshaped); },
              ::testing::ThrowsMessage<Error>(HasSubstr("'blk.0.attn_k.weight' has shape")));
  const std::string gpt2 = edited_copy(tiny, "gpt2.gguf", keep_all, [](gguf::Writer& w) {
    w.set_string("general.architecture", "gpt2");
  });
  EXPECT_THAT([&] { LlamaModel::load(gpt2); },
              ::testing::ThrowsMessage<Error>(HasSubstr("architecture 'gpt2'")));
  const std::string no_heads = edited_copy(tiny, "noheads.gguf", keep_all, [](gguf::Writer& w) {
    w.set_u32("llama.attention.head_count", 3);
  });
  EXPECT_THAT([&] { LlamaModel::load(no_heads); },
              ::testing::ThrowsMessage<Error>(HasSubstr("not a multiple")));
}

// The layer count must be the one the tensors have, and every tensor must be used (llama.cpp:
// "wrong number of tensors"); hyperparameters must be finite and in range; experts are refused
// before any tensor is looked for.
TEST(LlamaModel, FilesThatAreNotTheirMetadataNameWhatIsWrong) {
  const std::string tiny = testing::synthetic_model_path("tiny", DType::F32);
  ASSERT_EQ(LlamaModel::load(tiny)->config().n_layers, 2);
  const auto keep_all = [](gguf::Writer&, const gguf::TensorInfo&) { return true; };
  const auto with = [&](const std::string& name, const std::string& key, gguf::Value value) {
    return edited_copy(tiny, name, keep_all, [&](gguf::Writer& w) { w.set(key, value); });
  };
  const auto u32 = [](uint64_t v) { return gguf::make_uint(gguf::ValueType::kU32, v); };
  const auto u64 = [](uint64_t v) { return gguf::make_uint(gguf::ValueType::kU64, v); };
  const auto f64 = [](double v) { return gguf::make_float(gguf::ValueType::kF64, v); };
  const auto error = [](const std::string& path) {
    try {
      LlamaModel::load(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(loaded)");
  };

  // Too few layers would ignore the rest; too many would size millions of layers first.
  EXPECT_THAT(error(with("one-layer.gguf", "llama.block_count", u32(1))),
              HasSubstr("llama.block_count is 1 but the file's tensors are of 2 layers (blk.0 to "
                        "blk.1)"));
  EXPECT_THAT(error(with("many-layers.gguf", "llama.block_count", u32(1 << 24))),
              HasSubstr("llama.block_count is 16777216 but the file's tensors are of 2 layers"));
  // A tensor no weight reads: an extra bias, or anything else.
  const auto with_extra = [&](const std::string& name, const std::string& tensor) {
    return edited_copy(tiny, name,
                       [&, added = false](gguf::Writer& w, const gguf::TensorInfo&) mutable {
                         if (!added)
                           w.add_tensor(tensor, {64}, DType::F32, [](uint8_t*, size_t) {});
                         added = true;
                         return true;
                       });
  };
  EXPECT_THAT(error(with_extra("bias.gguf", "blk.0.attn_output.bias")),
              HasSubstr("tensor 'blk.0.attn_output.bias' is not used by this 2-layer llama model "
                        "(1 of the file's"));
  EXPECT_THAT(error(with_extra("router.gguf", "blk.1.ffn_gate_inp.weight")),
              HasSubstr("tensor 'blk.1.ffn_gate_inp.weight' is not used"));
  // Mixtral-style experts under the llama name.
  EXPECT_THAT(error(with("moe.gguf", "llama.expert_count", u32(8))),
              HasSubstr("mixture-of-experts models (llama.expert_count = 8) are not supported"));
  EXPECT_EQ(error(with("no-experts.gguf", "llama.expert_count", u32(0))), "(loaded)");
  // Head dimensions: bounded, and compared whole (not narrowed to int).
  EXPECT_THAT(error(with("wide-heads.gguf", "llama.attention.key_length", u32(1 << 20))),
              HasSubstr("'llama.attention.key_length' = 1048576 is out of range (1 to 4096)"));
  EXPECT_THAT(error(with("value-length.gguf", "llama.attention.value_length",
                         u64((uint64_t{1} << 32) + 16))),
              HasSubstr("key length 16 differs from value length 4294967312"));
  // Float hyperparameters must stay finite as 32-bit floats.
  EXPECT_THAT(error(with("eps.gguf", "llama.attention.layer_norm_rms_epsilon", f64(1e300))),
              HasSubstr("llama.attention.layer_norm_rms_epsilon 1e+300 must be positive and "
                        "finite"));
  EXPECT_THAT(error(with("eps-nan.gguf", "llama.attention.layer_norm_rms_epsilon", f64(NAN))),
              HasSubstr("layer_norm_rms_epsilon nan must be positive"));
  EXPECT_THAT(error(with("theta.gguf", "llama.rope.freq_base", f64(INFINITY))),
              HasSubstr("llama.rope.freq_base inf must be positive and finite"));
  EXPECT_THAT(error(with("attn-factor.gguf", "llama.rope.scaling.attn_factor", f64(1e40))),
              HasSubstr("llama.rope.scaling.attn_factor 1e+40 must be positive and finite"));
  const std::string linear = edited_copy(tiny, "linear.gguf", keep_all, [](gguf::Writer& w) {
    w.set_string("llama.rope.scaling.type", "linear");
    w.set("llama.rope.scaling.factor", gguf::make_float(gguf::ValueType::kF64, 1e300));
  });
  EXPECT_THAT(error(linear), HasSubstr("llama.rope.scaling.factor 1e+300 must be positive"));

  SyntheticOptions o;
  o.arch = "gemma2";
  const std::string gemma2 = (testing::scratch_dir() / "gemma2-caps.gguf").string();
  write_synthetic_model(o, gemma2);
  const std::string uncapped =
      edited_copy(gemma2, "gemma2-inf-cap.gguf", keep_all, [](gguf::Writer& w) {
        w.set("gemma2.attn_logit_softcapping", gguf::make_float(gguf::ValueType::kF64, INFINITY));
      });
  EXPECT_THAT(error(uncapped),
              HasSubstr("gemma2.attn_logit_softcapping inf must be non-negative and finite"));
  const std::string negative =
      edited_copy(gemma2, "gemma2-negative-cap.gguf", keep_all,
                  [](gguf::Writer& w) { w.set_f32("gemma2.final_logit_softcapping", -1.0f); });
  EXPECT_THAT(error(negative), HasSubstr("gemma2.final_logit_softcapping -1 must be non-negative"));
}

// The reported case on the real model: block_count 3 on stories260K's 5 layers used to load,
// ignoring 18 of its 48 tensors.
TEST(LlamaModel, Stories260KWithTooFewLayersIsRefused) {
  KVC_REQUIRE_STORIES(path);
  const std::string three = edited_copy(
      path, "stories-3-layers.gguf", [](gguf::Writer&, const gguf::TensorInfo&) { return true; },
      [](gguf::Writer& w) { w.set_u32("llama.block_count", 3); });
  EXPECT_THAT([&] { LlamaModel::load(three); },
              ::testing::ThrowsMessage<Error>(
                  HasSubstr("llama.block_count is 3 but the file's tensors are of 5 layers")));
}

// The roofline's count: every matrix of the file's layers once per position (their dims as the
// file gives them, fused or not), each query head's score and weighted value over the keys its
// position sees (its layer's window), and one row of logits.
TEST(LlamaModel, MultiplyAddsCountMatricesAttentionAndOneRowOfLogits) {
  const auto dir = testing::scratch_dir();
  for (const std::string arch : {"llama", "phi3", "gemma2"}) {
    SCOPED_TRACE(arch);
    SyntheticOptions o;
    o.arch = arch;
    o.sliding_window = arch == "llama" ? 0 : 8;
    const std::string path = (dir / (arch + "-multiply-adds.gguf")).string();
    write_synthetic_model(o, path);
    const auto model = LlamaModel::load(path);
    const LlamaConfig& c = model->config();
    uint64_t layer_weights = 0, logits = 0;
    for (const auto& t : model->file().tensors()) {
      const bool layer_matrix =
          t.name.starts_with("blk.") && t.dims.size() == 2 && !t.name.ends_with("_norm.weight") &&
          (t.name.find(".attn_") != std::string::npos || t.name.find(".ffn_") != std::string::npos);
      if (layer_matrix) layer_weights += t.dims[0] * t.dims[1];
      if (t.name == "output.weight") logits = t.dims[0] * t.dims[1];
    }
    if (logits == 0) logits = static_cast<uint64_t>(c.n_embd) * c.n_vocab;  // tied to the embedding
    ASSERT_GT(layer_weights, 0u);
    const auto expected = [&](int start, int tokens) {
      uint64_t keys = 0;
      for (int l = 0; l < c.n_layers; ++l) {
        for (int p = start; p < start + tokens; ++p) {
          const bool slides = o.sliding_window > 0 && (arch != "gemma2" || l % 2 == 0);
          keys += slides ? std::min(p + 1, o.sliding_window) : p + 1;
        }
      }
      return layer_weights * tokens + 2 * static_cast<uint64_t>(c.q_dim()) * keys + logits;
    };
    EXPECT_EQ(model->multiply_adds(0, 0), 0u);
    EXPECT_EQ(model->multiply_adds(0, 1), expected(0, 1));
    EXPECT_EQ(model->multiply_adds(0, 20), expected(0, 20));
    EXPECT_EQ(model->multiply_adds(100, 7), expected(100, 7));
  }
}

}  // namespace
}  // namespace kvc::model
