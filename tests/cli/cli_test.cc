// The `kvcache` program end to end: each subcommand run as a user runs it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "test_models.h"

namespace kvc {
namespace {

using ::testing::HasSubstr;

struct Result {
  int status = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Runs kvcache with args (shell-quoted by the caller) in a private cache directory.
Result kvcache(const std::string& args) {
  const auto dir = testing::scratch_dir();
  const std::string out = (dir / "stdout").string(), err = (dir / "stderr").string();
  const std::string cmd = "KVCACHE_CACHE_DIR=" + (dir / "cache").string() + " " KVCACHE_BINARY " " +
                          args + " >" + out + " 2>" + err;
  const int raw = std::system(cmd.c_str());
  Result r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

TEST(Cli, RunReproducesTheReferenceStoryAndReportsSpeedAndKvBytes) {
  KVC_REQUIRE_STORIES(model);
  const Result r = kvcache("run -m " + model + " -p 'Once upon a time' -n 48 --temp 0 -t 2");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out,
            "Once upon a time, there was a little girl named Lily. She loved to play outside in "
            "the park. One day, she saw a big, red ball. She wanted to play with it,\n");
  EXPECT_THAT(r.err, HasSubstr("prompt: 5 tokens"));
  EXPECT_THAT(r.err, HasSubstr("decode: 48 tokens"));
  EXPECT_THAT(r.err, HasSubstr("1280 B/token"));
  EXPECT_THAT(r.err, HasSubstr("KV used: 4 blocks = 81920 bytes"));
}

TEST(Cli, SeededSamplingIsReproducible) {
  const std::string model = testing::synthetic_model_path("tiny", DType::Q8_0);
  const std::string args = "run -m " + model + " -p hello -n 24 --temp 1.0 --seed 7 -t 2";
  const Result a = kvcache(args), b = kvcache(args);
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  const Result c = kvcache("run -m " + model + " -p hello -n 24 --temp 1.0 --seed 8 -t 2");
  EXPECT_NE(a.out, c.out);
}

TEST(Cli, RunWithoutModelUsesTheEmbeddedDefault) {
  const Result r = kvcache("run -n 8 --seed 1");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("random text"));
  EXPECT_THAT(r.err, HasSubstr("-m FILE.gguf"));
  EXPECT_THAT(r.out, ::testing::StartsWith("Once upon a time"));
}

TEST(Cli, BadInputsGiveClearErrors) {
  const std::string bad = (testing::scratch_dir() / "truncated.gguf").string();
  {
    const std::string good = slurp(testing::synthetic_model_path("tiny", DType::F32));
    std::ofstream(bad, std::ios::binary) << good.substr(0, good.size() / 2);
  }
  Result r = kvcache("run -m " + bad + " -n 4");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("beyond the end of the file"));
  r = kvcache("run -m /nonexistent.gguf -n 4");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("cannot open model file '/nonexistent.gguf'"));
  const std::string tiny = testing::synthetic_model_path("tiny", DType::F32);
  r = kvcache("run -m " + tiny + " --kv-memory 1KiB -n 4");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("holds no block"));
  r = kvcache("run -m " + tiny + " --kv-memory 40KiB -n 200 --ignore-eos");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("KV cache full"));
  r = kvcache("run -m " + tiny + " --top-p 0 -n 4");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("top_p"));
  r = kvcache("run -m " + tiny + " --kv-dtype q4_0 -n 4");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("--kv-dtype"));
}

TEST(Cli, InspectShowsShapesTokenizerAndKvBytes) {
  KVC_REQUIRE_STORIES(model);
  const Result r = kvcache("inspect " + model);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("gguf: version 3, 19 metadata keys, 48 tensors"));
  EXPECT_THAT(r.out, HasSubstr("8 heads, 4 KV heads (GQA), head dim 8"));
  EXPECT_THAT(r.out, HasSubstr("output: separate matrix"));
  EXPECT_THAT(r.out, HasSubstr("tokenizer: llama, 512 tokens, bos 1, eos 2"));
  EXPECT_THAT(r.out, HasSubstr("f32       1280 B/token"));
  EXPECT_THAT(r.out, HasSubstr("f16        640 B/token"));
  EXPECT_THAT(r.out, HasSubstr("q8_0  n/a (head dim 8 is not a multiple of 32)"));
}

TEST(Cli, MakeModelWritesALoadableFileWithProgress) {
  const std::string out = (testing::scratch_dir() / "made.gguf").string();
  Result r = kvcache("make-model --preset tiny --dtype q4_0 --layers 3 --seed 4 -o " + out);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("100%"));
  r = kvcache("inspect " + out);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("layers 3"));
  EXPECT_THAT(r.out, HasSubstr("q4_0"));
  r = kvcache("make-model --preset nope -o " + out);
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("unknown preset 'nope'"));
}

TEST(Cli, BenchReportsDecodeAgainstBandwidth) {
  const Result r = kvcache(
      "bench --models tiny --dtypes q8_0 --threads 1 --prompt-tokens 8 --decode-tokens 4 "
      "--bandwidth-mib 64");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("memory read bandwidth"));
  EXPECT_THAT(r.out, HasSubstr("of limit"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("tiny +q8_0 +1 "));
}

}  // namespace
}  // namespace kvc
