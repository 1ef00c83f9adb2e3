// `kvcache perplexity`'s computation: a case whose perplexity is known exactly, llama-perplexity's
// chunking, clear errors for bad inputs, and the KL-divergence comparison file.
#include "model/perplexity.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "base/error.h"
#include "model/gguf_writer.h"
#include "model/kl_divergence.h"
#include "test_models.h"

namespace kvc::model {
namespace {

using ::testing::HasSubstr;

// The tiny model with every embedding zero: every hidden state, hence every logit, is 0 (its
// output matrix is the embedding), so each next token has probability 1 / n_vocab and the
// perplexity of any text is exactly n_vocab.
std::string uniform_model() {
  const std::string src = testing::synthetic_model_path("tiny", DType::F32);
  const auto file = gguf::File::open(src);
  gguf::Writer w;
  for (const auto& [key, value] : file->metadata()) w.set(key, value);
  for (const auto& t : file->tensors()) {
    const uint8_t* data = t.data;
    const bool zero = t.name == "token_embd.weight";
    w.add_tensor(t.name, t.dims, t.dtype, [data, zero](uint8_t* dst, size_t bytes) {
      if (!zero) std::memcpy(dst, data, bytes);
    });
  }
  const std::string path = (testing::scratch_dir() / "uniform.gguf").string();
  w.write(path);
  return path;
}

std::vector<int32_t> some_tokens(size_t n, int n_vocab) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>(3 + (i * 37) % (n_vocab - 3));
  return t;
}

TEST(Perplexity, UniformModelScoresExactlyItsVocabularySize) {
  const auto model = LlamaModel::load(uniform_model());
  ThreadPool threads(2);
  const int n_vocab = model->config().n_vocab;
  PerplexityOptions o;
  o.context = 64;
  o.batch_tokens = 7;  // chunks run in several forward passes
  const auto tokens = some_tokens(64 * 3 + 10, n_vocab);
  const PerplexityResult r = perplexity(*model, threads, tokens, o);
  EXPECT_EQ(r.chunks, 3u);              // the 10 tokens left over make no chunk
  EXPECT_EQ(r.scored_tokens, 3u * 31);  // positions 32..62 predict 33..63
  EXPECT_NEAR(r.ppl, n_vocab, n_vocab * 1e-6);
  EXPECT_NEAR(r.mean_nll, std::log(static_cast<double>(n_vocab)), 1e-6);
  EXPECT_NEAR(r.ppl_error, 0.0, 1e-3);  // every token scores the same
  o.chunks = 2;
  EXPECT_EQ(perplexity(*model, threads, tokens, o).scored_tokens, 2u * 31);
}

TEST(Perplexity, BadInputsGetClearErrors) {
  const auto model = LlamaModel::load(testing::synthetic_model_path("tiny", DType::F32));
  ThreadPool threads(1);
  PerplexityOptions o;
  o.context = 64;
  const auto error = [&](std::vector<int32_t> tokens, const PerplexityOptions& opt) {
    try {
      perplexity(*model, threads, tokens, opt);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(error({}, o), HasSubstr("the text is empty"));
  EXPECT_THAT(error(some_tokens(63, 512), o), HasSubstr("63 tokens, fewer than one chunk of 64"));
  PerplexityOptions big = o;
  big.context = model->config().context_length + 1;
  EXPECT_THAT(error(some_tokens(2000, 512), big), HasSubstr("larger than the model's"));
}

// A run compared with its own saved distributions agrees exactly; q8_0 KV against f16 KV
// agrees closely, and the file holds 4 + 4 * n_vocab bytes per scored token after its header.
TEST(Perplexity, KlDivergenceAgainstASavedRun) {
  const auto model = LlamaModel::load(testing::synthetic_model_path("tiny", DType::F32));
  ThreadPool threads(2);
  const int n_vocab = model->config().n_vocab;
  PerplexityOptions o;
  o.context = 32;
  const auto tokens = some_tokens(100, n_vocab);
  const std::string path = (testing::scratch_dir() / "base.kld").string();
  LogProbWriter writer(path, static_cast<uint32_t>(n_vocab), 32);
  const PerplexityResult base =
      perplexity(*model, threads, tokens, o, [&](auto lp, int32_t next) { writer.add(lp, next); });
  writer.finish();
  EXPECT_EQ(std::filesystem::file_size(path), 24 + base.scored_tokens * (4 + 4 * n_vocab));

  KlComparison same(path, static_cast<uint32_t>(n_vocab), 32);
  perplexity(*model, threads, tokens, o, [&](auto lp, int32_t next) { same.add(lp, next); });
  const KlStats s = same.finish();
  EXPECT_EQ(s.tokens, base.scored_tokens);
  EXPECT_EQ(s.mean_kl, 0.0);
  EXPECT_EQ(s.top1_agreement, 1.0);
  EXPECT_NEAR(s.ppl_ratio, 1.0, 1e-12);
  EXPECT_NEAR(s.base_ppl, base.ppl, base.ppl * 1e-6);

  o.k_dtype = o.v_dtype = DType::Q8_0;
  KlComparison q8(path, static_cast<uint32_t>(n_vocab), 32);
  perplexity(*model, threads, tokens, o, [&](auto lp, int32_t next) { q8.add(lp, next); });
  const KlStats k = q8.finish();
  EXPECT_GT(k.mean_kl, 0.0);
  EXPECT_LT(k.mean_kl, 1e-2);
  EXPECT_LE(k.mean_kl, k.p99_kl);
  EXPECT_LE(k.p99_kl, k.max_kl);

  EXPECT_THROW(KlComparison(path, static_cast<uint32_t>(n_vocab), 64), Error);  // other -c
  KlComparison other_text(path, static_cast<uint32_t>(n_vocab), 32);
  EXPECT_THROW(perplexity(*model, threads, some_tokens(100, 7), o,
                          [&](auto lp, int32_t next) { other_text.add(lp, next); }),
               Error);
}

// The in-memory figures from hand-computed distributions: KL(base || run) per token, its
// percentiles, top-1 agreement and both perplexities over the tokens that follow.
TEST(Perplexity, KlAccumulatorFiguresFromKnownDistributions) {
  const auto logs = [](std::vector<double> p) {
    std::vector<float> lp;
    for (double x : p) lp.push_back(static_cast<float>(std::log(x)));
    return lp;
  };
  KlAccumulator kl;
  EXPECT_EQ(kl.finish().tokens, 0u);
  const std::vector<float> base1 = logs({0.5, 0.25, 0.25}), run1 = logs({0.25, 0.5, 0.25});
  const std::vector<float> base2 = logs({0.1, 0.2, 0.7});
  kl.add(base1, run1, 0);   // KL = 0.5 ln 2 - 0.25 ln 2 = 0.25 ln 2; top-1 differs
  kl.add(base2, base2, 2);  // identical: KL 0, top-1 agrees
  const KlStats s = kl.finish();
  EXPECT_EQ(s.tokens, 2u);
  EXPECT_NEAR(s.mean_kl, 0.125 * std::log(2.0), 1e-6);
  EXPECT_NEAR(s.max_kl, 0.25 * std::log(2.0), 1e-6);
  EXPECT_EQ(s.p99_kl, s.max_kl);
  EXPECT_EQ(s.top1_agreement, 0.5);
  EXPECT_NEAR(s.base_ppl, std::exp(-(std::log(0.5) + std::log(0.7)) / 2), 1e-5);
  EXPECT_NEAR(s.ppl, std::exp(-(std::log(0.25) + std::log(0.7)) / 2), 1e-5);
  EXPECT_NEAR(s.ppl_ratio, s.ppl / s.base_ppl, 1e-12);
}

}  // namespace
}  // namespace kvc::model
