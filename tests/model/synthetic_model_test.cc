#include "model/synthetic_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "base/error.h"
#include "model/gguf.h"
#include "model/llama_model.h"
#include "model/tokenizer.h"
#include "test_models.h"

namespace kvc::model {
namespace {

SyntheticOptions options(const std::string& preset, DType dtype, int layers = 0,
                         uint64_t seed = 1) {
  SyntheticOptions o;
  o.preset = preset;
  o.dtype = dtype;
  o.layers = layers;
  o.seed = seed;
  return o;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(SyntheticModel, EveryDtypeLoadsWithTheStandardKeys) {
  for (DType t : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0}) {
    const std::string path = testing::synthetic_model_path("tiny", t);
    const auto model = LlamaModel::load(path);
    const auto& c = model->config();
    EXPECT_EQ(c.n_layers, 2);
    EXPECT_EQ(c.n_heads, 4);
    EXPECT_EQ(c.n_kv_heads, 2);
    EXPECT_EQ(c.n_vocab, 512);
    EXPECT_EQ(model->weight_dtype(), t);
    EXPECT_EQ(model->file().get_u64("llama.context_length"), 512u);
    EXPECT_EQ(model->file().find_tensor("blk.0.attn_norm.weight")->dtype, DType::F32);
    EXPECT_EQ(model->weight_bytes(), synthetic_model_bytes(options("tiny", t)));
  }
}

// llama.cpp's Q4_K_M mix: q4_K matrices, q6_K for the output and for attn_v and ffn_down in the
// first and last eighth of the layers and every third layer between; rows too short for a
// 256-element super-block fall back to q8_0, as llama.cpp's do.
TEST(SyntheticModel, KQuantMixesFollowLlamaCpp) {
  const auto dir = testing::scratch_dir();
  const std::string path = (dir / "q4km.gguf").string();
  SyntheticOptions o;
  o.preset = "small";
  o.layers = 8;
  set_synthetic_dtype(o, "q4_K_M");
  write_synthetic_model(o, path);
  const auto file = gguf::File::open(path);
  EXPECT_EQ(file->get_u64("general.file_type"), 15u);
  EXPECT_EQ(file->find_tensor("blk.0.attn_q.weight")->dtype, DType::Q4_K);
  EXPECT_EQ(file->find_tensor("output.weight")->dtype, DType::Q6_K);
  EXPECT_EQ(file->find_tensor("token_embd.weight")->dtype, DType::Q4_K);
  for (int l = 0; l < 8; ++l) {
    const bool more = l < 1 || l >= 7 || (l - 1) % 3 == 2;
    const std::string b = "blk." + std::to_string(l) + ".";
    EXPECT_EQ(file->find_tensor(b + "attn_v.weight")->dtype, more ? DType::Q6_K : DType::Q4_K) << l;
    EXPECT_EQ(file->find_tensor(b + "ffn_down.weight")->dtype, more ? DType::Q6_K : DType::Q4_K)
        << l;
  }
  const auto model = LlamaModel::load(path);
  EXPECT_EQ(model->weight_bytes(), synthetic_model_bytes(o));

  SyntheticOptions tiny;
  set_synthetic_dtype(tiny, "q5_K");
  EXPECT_EQ(synthetic_file_type(tiny), 16u);
  write_synthetic_model(tiny, (dir / "tiny-q5k.gguf").string());
  EXPECT_EQ(
      gguf::File::open((dir / "tiny-q5k.gguf").string())->find_tensor("blk.0.attn_q.weight")->dtype,
      DType::Q8_0);
  EXPECT_THAT([&] { set_synthetic_dtype(tiny, "q8_K"); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr("q4_K_M")));
}

TEST(SyntheticModel, SameSeedSameBytesOtherSeedOtherWeights) {
  const auto dir = testing::scratch_dir();
  const std::string a = (dir / "a.gguf").string(), b = (dir / "b.gguf").string(),
                    c = (dir / "c.gguf").string();
  write_synthetic_model(options("tiny", DType::Q8_0, 1, 5), a);
  write_synthetic_model(options("tiny", DType::Q8_0, 1, 5), b);
  write_synthetic_model(options("tiny", DType::Q8_0, 1, 6), c);
  EXPECT_EQ(read_all(a), read_all(b));
  EXPECT_NE(read_all(a), read_all(c));
  EXPECT_EQ(gguf::File::open(a)->get_u64("llama.block_count"), 1u);
}

TEST(SyntheticModel, VocabularyIsLlamaStyleAndReachableByBpe) {
  const SyntheticVocab v = make_synthetic_vocab(4000, 1);
  ASSERT_EQ(v.tokens.size(), 4000u);
  EXPECT_EQ(v.tokens[0], "<unk>");
  EXPECT_EQ(v.tokens[1], "<s>");
  EXPECT_EQ(v.tokens[3], "<0x00>");
  EXPECT_EQ(v.tokens[258], "<0xFF>");
  EXPECT_EQ(v.types[258], 6);
  Vocabulary vocab;
  vocab.tokens = v.tokens;
  vocab.scores = v.scores;
  for (int32_t t : v.types) vocab.types.push_back(static_cast<TokenType>(t));
  const Tokenizer tok(vocab);
  // Space-led word pieces encode back to themselves as one token, except where a
  // higher-priority merge inside the word splits it differently (as in real vocabularies).
  int checked = 0, single = 0;
  for (int32_t id = 259; id < 4000; ++id) {
    std::string text = v.tokens[id];
    const std::string space = "\xe2\x96\x81";
    if (text.size() <= 3 || text.rfind(space, 0) != 0) continue;
    const auto ids = tok.encode(text.substr(3), false);  // the tokenizer adds the space
    ++checked;
    single += ids.size() == 1 && ids[0] == id;
    EXPECT_EQ(tok.decode(ids), text.substr(3));
  }
  EXPECT_GT(checked, 2000);
  EXPECT_GT(single, checked * 3 / 4);
}

TEST(SyntheticModel, BadOptionsAreClearErrors) {
  const std::string path = (testing::scratch_dir() / "bad.gguf").string();
  EXPECT_THAT(
      [&] { write_synthetic_model(options("gpt5", DType::F32), path); },
      ::testing::ThrowsMessage<Error>(::testing::HasSubstr("known presets: tiny, small, 110m")));
  EXPECT_THROW(write_synthetic_model(options("tiny", DType::F32, -1), path), Error);
  EXPECT_THROW(write_synthetic_model(options("tiny", DType::BF16), path), Error);
}

TEST(SyntheticModel, PresetsHaveRealShapes) {
  const SyntheticPreset& t = find_synthetic_preset("tinyllama-1.1b");
  EXPECT_EQ(t.n_embd, 2048);
  EXPECT_EQ(t.n_layers, 22);
  EXPECT_EQ(t.n_kv_heads, 4);
  EXPECT_EQ(t.n_ff, 5632);
  const SyntheticPreset& l = find_synthetic_preset("llama3-8b");
  EXPECT_EQ(l.n_vocab, 128256);
  EXPECT_EQ(l.n_kv_heads, 8);
  // q8_0 weights of TinyLlama take about 1.1 GiB, as llama.cpp's file does.
  const uint64_t bytes = synthetic_model_bytes(options("tinyllama-1.1b", DType::Q8_0));
  EXPECT_GT(bytes, 1.0e9);
  EXPECT_LT(bytes, 1.3e9);
}

}  // namespace
}  // namespace kvc::model
