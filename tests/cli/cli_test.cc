// The `kvcache` program end to end: each subcommand run as a user runs it.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

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
  EXPECT_THAT(r.err, HasSubstr("KV cache: f16, 16-token blocks, 640 B/token"));
  EXPECT_THAT(r.err, HasSubstr("KV used: 4 blocks = 40960 bytes"));
}

// q8_0 keys and q4_0 values (llama.cpp's -ctk/-ctv): 5 layers x (35 + 18) B per token, keys
// grouped per channel over 32-token blocks.
TEST(Cli, RunStoresQuantisedKeysAndValues) {
  KVC_REQUIRE_STORIES(model);
  const Result r =
      kvcache("run -m " + model + " -p 'Once upon a time' -n 24 --temp 0 -ctk q8_0 -ctv q4_0");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Once upon a time, there was a little girl"));
  EXPECT_THAT(r.err, HasSubstr("KV cache: K q8_0 / V q4_0, 32-token blocks, 265 B/token"));
  const Result p = kvcache("plan --model " + model + " --context 2048 --kv-dtype q8_0 --json");
  ASSERT_EQ(p.status, 0) << p.err;
  EXPECT_THAT(p.out, HasSubstr("\"kv_dtype_k\": \"q8_0\""));
  EXPECT_THAT(p.out, HasSubstr("\"bytes_per_token\": 345"));
}

TEST(Cli, SeededSamplingIsReproducibleLoadedOrMapped) {
  const std::string model = testing::synthetic_model_path("tiny", DType::Q8_0);
  const std::string args = "run -m " + model + " -p hello -n 24 --temp 1.0 --seed 7 -t 2";
  const Result a = kvcache(args), b = kvcache(args), mapped = kvcache(args + " --mmap");
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  ASSERT_EQ(mapped.status, 0) << mapped.err;
  EXPECT_EQ(mapped.out, a.out);  // the file mapped, not loaded: the same weights
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
  r = kvcache("run -m " + tiny + " --kv-memory 40KiB -n 200 --ignore-eos --kv-dtype f32");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err,
              HasSubstr("the pool has 5 blocks in all; lower max_tokens or raise --kv-memory"));
  r = kvcache("run -m " + tiny + " --top-p 0 -n 4");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("top_p"));
  r = kvcache("run -m " + tiny + " --kv-dtype bf16 -n 4");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("--kv-dtype: the KV pool stores f32, f16, q8_0 or q4_0, not bf16"));
  r = kvcache("run -m " + tiny + " -ctk q8_0 -ctv q5_1 -n 4");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("--kv-dtype-v: q5_1 is a weight type"));
  r = kvcache("run -m " + tiny + " -ctk q9_0 -n 4");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("--kv-dtype-k: unknown KV dtype 'q9_0'"));
}

// Whether this build runs under a sanitizer, whose shadow memory a limit on address space
// forbids.
constexpr bool kSanitized =
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
    true;
#else
    false;
#endif
#else
    false;
#endif

// A file may name a context of millions of tokens: without --kv-memory, `run` (and `serve`,
// through the same engine default) caps its pool at 2 GiB and says so, rather than taking 4 GiB
// here (or 256 GiB at 2^30 tokens); where even the capped pool cannot be allocated (1 GiB of
// address space here), the error names the context length and the flag.
TEST(Cli, RunCapsTheDefaultKvPoolOfAHugeContext) {
  if (kSanitized) GTEST_SKIP() << "limits the address space, which the sanitizers need";
  const auto dir = testing::scratch_dir();
  const std::string model = (dir / "huge-context.gguf").string();
  const Result made = kvcache("make-model --preset tiny --context 16777216 -o " + model);
  ASSERT_EQ(made.status, 0) << made.err;
  const std::string err = (dir / "huge-context.err").string();
  const std::string cmd = "ulimit -v 1048576 && KVCACHE_CACHE_DIR=" + (dir / "cache").string() +
                          " " KVCACHE_BINARY " run -m " + model + " -n 4 -t 1 >/dev/null 2>" + err;
  const int raw = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(raw));
  const std::string message = slurp(err);
  EXPECT_EQ(WEXITSTATUS(raw), 1) << message;
  EXPECT_THAT(message, HasSubstr("cannot allocate the default KV pool (sized by the model's "
                                 "llama.context_length of 16777216 tokens, at most 2.0 GiB); pass "
                                 "a smaller --kv-memory"));
  // Where it can be allocated, the log says the pool holds less than the context.
  const Result capped = kvcache("run -m " + model + " -n 2 -t 1 -p hi");
  EXPECT_EQ(capped.status, 0) << capped.err;
  EXPECT_THAT(capped.err, HasSubstr("2147483648 B (2.0 GiB), holds 8388608 tokens"));
  EXPECT_THAT(capped.err, HasSubstr("the pool holds less than one sequence of the model's "
                                    "llama.context_length of 16777216 tokens"));
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
  EXPECT_THAT(r.out, HasSubstr("q8_0       345 B/token"));
  EXPECT_THAT(r.out, HasSubstr("q4_0       185 B/token"));
}

TEST(Cli, InspectReadsAVocabularyOnlyFile) {
  const char* root = std::getenv("KVCACHE_TESTDATA");
  if (root == nullptr || *root == '\0') {
    GTEST_SKIP() << "KVCACHE_TESTDATA not set: point it at shared/testdata to inspect "
                    "llama.cpp's vocabulary-only GGUFs";
  }
  const std::string path = std::string(root) + "/vocab/gpt-2.gguf";
  Result r = kvcache("inspect " + path);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("tokenizer: gpt2, "));
  EXPECT_THAT(r.out, HasSubstr("byte-level BPE, pre-tokenizer gpt-2"));
  EXPECT_THAT(r.out, HasSubstr("end of gen     50256 '<|endoftext|>'"));
  EXPECT_THAT(r.out, HasSubstr("model: none (vocabulary only: no tensors"));
  // An architecture kvcache does not run is no obstacle: there is no model to describe.
  r = kvcache("inspect " + std::string(root) + "/vocab/phi-3.gguf");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"phi3\""));
  EXPECT_THAT(r.out, HasSubstr("tensors: 0, 0 B"));
  EXPECT_THAT(r.out, HasSubstr("tokenizer: llama, 32064 tokens"));
  EXPECT_THAT(r.out, HasSubstr("model: none (vocabulary only: no tensors"));
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

TEST(Cli, MakeModelWritesTheContextLengthAsked) {
  const std::string out = (testing::scratch_dir() / "long.gguf").string();
  Result r = kvcache("make-model --preset tiny --context 16384 -o " + out);
  ASSERT_EQ(r.status, 0) << r.err;
  r = kvcache("inspect " + out);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("context 16384"));
  r = kvcache("bench -m " + out + " -p 8 -n 2 -d 1000 -t 1 -r 1");  // beyond the preset's 512
  EXPECT_EQ(r.status, 0) << r.err;
  r = kvcache("make-model --preset tiny --context -5 -o " + out);
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("--context"));
}

TEST(Cli, BenchReportsDecodeAgainstBandwidth) {
  const Result r = kvcache(
      "bench --models tiny --dtypes q8_0 --threads 1 --prompt-tokens 8 --decode-tokens 4 "
      "--bandwidth-mib 64 -r 2");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("limit GB/s"));
  EXPECT_THAT(r.out, HasSubstr("of limit"));
  EXPECT_THAT(r.out, HasSubstr("measured just before and just after each decode run"));
  EXPECT_THAT(r.out, HasSubstr("the median of 2 runs"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("tiny +q8_0 +1 "));
  EXPECT_THAT(r.out, HasSubstr("vs rows"));
  EXPECT_THAT(r.out, HasSubstr("vs even = speed with each thread's range sized by its measured"));
  // The row's cells (the weights' size takes two: "137.2 KiB").
  std::istringstream row(r.out.substr(r.out.find("\ntiny ") + 1));
  std::vector<std::string> cells(20);
  for (auto& c : cells) row >> c;
  const auto cell = [&](size_t i) { return std::stod(cells[i]); };
  // The limit is the probe's sustained rate, so a fraction of it (of limit) is at least the
  // fraction of its fastest pass (of best).
  EXPECT_GE(cell(16), cell(17)) << r.out;
  EXPECT_GT(cell(17), 0.0) << r.out;
  // The product alone beside them: its GB/s, and that over the limit measured just before it
  // (near the median limit, which averages the measurements around each run).
  EXPECT_THAT(r.out, HasSubstr("GEMV GB/s = the weight type's matrix product alone"));
  EXPECT_GT(cell(18), 0.0) << r.out;
  EXPECT_GT(cell(19), 0.0) << r.out;
  EXPECT_NEAR(cell(19), cell(18) / cell(15), cell(19)) << r.out;
  // Prefill against the compute ceiling: its operations per second over the instruction set's
  // multiply-adds on as many threads, which no prefill reaches.
  EXPECT_THAT(r.out, HasSubstr("peak GOP/s = the instruction set's widest multiply-add"));
  EXPECT_GT(cell(8), 0.0) << r.out;
  EXPECT_GT(cell(9), cell(8)) << r.out;
  EXPECT_NEAR(cell(10), cell(8) / cell(9), 0.01) << r.out;
  // Each run beside one with even ranges: a ratio for prefill and one for decode.
  EXPECT_GT(cell(7), 0.0) << r.out;
  EXPECT_GT(cell(13), 0.0) << r.out;
  const Result none = kvcache("bench --models tiny --dtypes q8_0 --threads 1 -r 0");
  EXPECT_EQ(none.status, 1);
  EXPECT_THAT(none.err, HasSubstr("-r must be at least 1"));
}

TEST(Cli, BenchWithAModelRunsLlamaBenchsTestsAsJson) {
  const std::string model = testing::synthetic_model_path("tiny", DType::Q8_0);
  const Result r = kvcache("bench -m " + model + " -p 16 -n 4 -d 0,8 -t 1 -r 2 -npl 1,2 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto tests = nlohmann::json::parse(r.out);
  ASSERT_TRUE(tests.is_array());
  ASSERT_EQ(tests.size(), 6u);  // per depth: pp16, tg4, tg4 with 2 sequences
  for (const auto& t : tests) {
    EXPECT_EQ(t["model_filename"], model);
    EXPECT_EQ(t["type_k"], "f16");
    EXPECT_EQ(t["type_v"], "f16");
    EXPECT_EQ(t["n_threads"], 1);
    EXPECT_FALSE(t["isa"].get<std::string>().empty());
    ASSERT_EQ(t["samples_ts"].size(), 2u);
    EXPECT_GT(t["avg_ts"].get<double>(), 0.0);
    EXPECT_GE(t["stddev_ts"].get<double>(), 0.0);
  }
  EXPECT_EQ(tests[0]["n_prompt"], 16);
  EXPECT_EQ(tests[0]["n_gen"], 0);
  EXPECT_EQ(tests[0]["n_depth"], 0);
  EXPECT_EQ(tests[1]["n_prompt"], 0);
  EXPECT_EQ(tests[1]["n_gen"], 4);
  EXPECT_EQ(tests[1]["n_parallel"], 1);
  EXPECT_EQ(tests[2]["n_prompt"], 16);  // the shared prompt, prefilled once, untimed
  EXPECT_EQ(tests[2]["n_parallel"], 2);
  EXPECT_EQ(tests[5]["n_depth"], 8);
}

TEST(Cli, BenchKvDtypesScoresEachTypeAgainstF16OnSampledText) {
  const std::string model = testing::synthetic_model_path("tiny", DType::F32);
  const std::string text = (testing::scratch_dir() / "kv-dtypes-text.txt").string();
  const Result r = kvcache("bench kv-dtypes -m " + model +
                           " --types f32,q8_0,q8_0/q4_0 --tokens 256 -c 64 -t 1 --save-text " +
                           text + " --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["sampled_tokens"], 256);
  EXPECT_EQ(j["scored_tokens"], 4 * (64 - 1 - 32));  // llama-perplexity's second halves
  ASSERT_EQ(j["types"].size(), 3u);
  EXPECT_EQ(j["types"][0]["bytes_vs_f16"], 2.0);
  EXPECT_DOUBLE_EQ(j["types"][1]["bytes_vs_f16"].get<double>(), 345.0 / 640.0);
  EXPECT_EQ(j["types"][2]["kv_dtype_k"], "q8_0");
  EXPECT_EQ(j["types"][2]["kv_dtype_v"], "q4_0");
  for (const auto& t : j["types"]) {
    EXPECT_GE(t["mean_kl"].get<double>(), 0.0);
    EXPECT_GE(t["p99_kl"].get<double>(), 0.0);
    EXPECT_GT(t["top1_agreement"].get<double>(), 0.5);
    EXPECT_LE(t["top1_agreement"].get<double>(), 1.0);
    EXPECT_GT(t["ppl"].get<double>(), 1.0);
  }
  // f32 keys and values only round less than f16: nearly the same distributions.
  EXPECT_LT(j["types"][0]["mean_kl"].get<double>(), 1e-4);
  EXPECT_TRUE(std::filesystem::file_size(text) > 0);
  const Result bad = kvcache("bench kv-dtypes -m " + model + " --types q2_K --tokens 64 -c 32");
  EXPECT_EQ(bad.status, 1);
  EXPECT_THAT(bad.err, HasSubstr("--types"));
}

TEST(Cli, BenchWithAModelPrintsATableAndRefusesTestsLongerThanTheContext) {
  const std::string model = testing::synthetic_model_path("tiny", DType::F32);
  Result r = kvcache("bench -m " + model + " -p 8 -n 2 -d 4 -t 1 -r 1 -npl 2");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::ContainsRegex("\\| +test \\| +t/s \\|"));
  EXPECT_THAT(r.out, HasSubstr("pp8 @ d4"));
  EXPECT_THAT(r.out, HasSubstr("tg2 x2 (pp8) @ d4"));
  r = kvcache("bench -m " + model + " -p 8 -n 2 -d 100000 -r 1");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("exceed the model's context"));
}

TEST(Cli, ServeRefusesBadFlagsBeforeListening) {
  const std::string keys = (testing::scratch_dir() / "bad-keys.txt").string();
  std::ofstream(keys) << "sk-a alice admin\nsk-b\n";
  Result r = kvcache("serve --port 0 --api-keys " + keys);
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("bad-keys.txt:2: expected 'KEY TENANT [admin]'"));
  r = kvcache("serve --port 0 --chat-template vicuna");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("unknown chat template 'vicuna'"));
  r = kvcache("serve --port 0 --max-body 12XB");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("--max-body"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("listening")));
}

// `kvcache serve` as a child process with its stderr in a scratch file: started on any free
// port, ready once /health answers 200, stopped with SIGTERM.
class ServeProcess {
 public:
  explicit ServeProcess(std::vector<std::string> serve_args)
      : err_((testing::scratch_dir() / "serve.stderr").string()) {
    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_addopen(&files, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&files, 2, err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<std::string> args = {KVCACHE_BINARY, "serve", "--port", "0"};
    args.insert(args.end(), serve_args.begin(), serve_args.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, KVCACHE_BINARY, &files, nullptr, argv.data(), environ) != 0) pid_ = 0;
    posix_spawn_file_actions_destroy(&files);
  }
  ~ServeProcess() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  // The port once the log names it, or 0 after 60 s (or when the spawn failed).
  int port() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    // --port 0 takes any free port; the log says which.
    const std::string listening = "listening on http://127.0.0.1:";
    while (pid_ > 0 && port_ == 0 && std::chrono::steady_clock::now() < deadline) {
      const std::string log = this->log();
      if (const size_t at = log.find(listening); at != std::string::npos) {
        port_ = std::atoi(log.c_str() + at + listening.size());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return port_;
  }
  // The last /health status within 60 s: 200 once the model is loaded.
  int health(httplib::Client& client) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    int health = 0;
    while (health != 200 && std::chrono::steady_clock::now() < deadline) {
      if (auto r = client.Get("/health")) health = r->status;
      if (health != 200) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return health;
  }
  // Sends SIGTERM and returns the exit status, or -1 when the process did not exit within
  // 10 s (it is then killed).
  int terminate() {
    if (kill(pid_, SIGTERM) != 0) return -1;
    int status = -1;
    for (int i = 0; i < 500 && waitpid(pid_, &status, WNOHANG) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!WIFEXITED(status)) return -1;
    exited_ = true;
    return WEXITSTATUS(status);
  }
  std::string log() const { return slurp(err_); }

 private:
  std::string err_;
  pid_t pid_ = 0;
  int port_ = 0;
  bool exited_ = false;
};

TEST(Cli, ServeAnswersHealthAndDrainsOnSigterm) {
  const std::string model = testing::synthetic_model_path("tiny", DType::F32);
  ServeProcess serve({"-m", model, "--threads", "1", "--drain-seconds", "5"});
  const int port = serve.port();
  ASSERT_GT(port, 0) << serve.log();
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(std::chrono::seconds(30));
  EXPECT_EQ(serve.health(client), 200) << serve.log();
  auto r =
      client.Post("/v1/completions", R"({"prompt": "hi", "max_tokens": 3})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(serve.terminate(), 0) << serve.log();
  const std::string log = serve.log();
  EXPECT_THAT(log, HasSubstr("KV cache: f16, 16-token blocks"));
  EXPECT_THAT(log, HasSubstr("draining"));
  EXPECT_THAT(log, HasSubstr("stopped: 1 requests completed, 0 cancelled"));
}

// A vocabulary-only GGUF of an architecture kvcache does not run is served in the
// tokenizer-only mode: the log says so, the tokenizer answers, generation gets a clear 400.
TEST(Cli, ServeStartsAVocabularyOnlyFileInTheTokenizerOnlyMode) {
  const char* root = std::getenv("KVCACHE_TESTDATA");
  if (root == nullptr || *root == '\0') {
    GTEST_SKIP() << "KVCACHE_TESTDATA not set: point it at shared/testdata to serve llama.cpp's "
                    "vocabulary-only GGUFs";
  }
  ServeProcess serve({"-m", std::string(root) + "/vocab/gpt-2.gguf"});
  const int port = serve.port();
  ASSERT_GT(port, 0) << serve.log();
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(std::chrono::seconds(30));
  EXPECT_EQ(serve.health(client), 200) << serve.log();
  auto r = client.Post("/tokenize", R"({"prompt": "ied 4 ½ months", "add_special": false})",
                       "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  const auto tokens = nlohmann::json::parse(r->body);
  // llama.cpp's first gpt-2 pair; max_model_len is the file's gpt2.context_length.
  EXPECT_EQ(tokens["tokens"], nlohmann::json({798, 604, 25208, 1933}));
  EXPECT_EQ(tokens["max_model_len"], 1024);
  r = client.Post("/v1/completions", R"({"prompt": "hi"})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_THAT(r->body, HasSubstr("gpt-2 is a vocabulary-only GGUF (no weights): only /tokenize, "
                                 "/detokenize and /apply-template are served"));
  EXPECT_EQ(serve.terminate(), 0) << serve.log();
  const std::string log = serve.log();
  EXPECT_THAT(log, HasSubstr("is a vocabulary-only GGUF (architecture 'gpt2', 50257 tokens, no "
                             "weight tensors): tokenizer-only mode"));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("KV cache")));
  EXPECT_THAT(log, HasSubstr("stopped"));
}

// `kvcache perplexity`: figures on stdout (or --json), progress on stderr, clear errors.
TEST(Cli, PerplexityScoresAFileAndNamesBadInput) {
  const std::string model = testing::synthetic_model_path("tiny", DType::F32);
  const std::string text = (testing::scratch_dir() / "story.txt").string();
  std::string story;
  for (int i = 0; i < 40; ++i) story += "Once upon a time there was a little dog. ";
  std::ofstream(text) << story;
  Result r = kvcache("perplexity -m " + model + " -f " + text + " -c 64 --json -ctk q8_0");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"kv_dtype_k\": \"q8_0\""));
  EXPECT_THAT(r.out, HasSubstr("\"ppl\": "));
  EXPECT_THAT(r.err, HasSubstr("perplexity: chunk"));
  const std::string empty = (testing::scratch_dir() / "empty.txt").string();
  std::ofstream(empty).flush();
  r = kvcache("perplexity -m " + model + " -f " + empty);
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("the text is empty"));
  r = kvcache("perplexity -m " + model + " -f " + text + " -c 100000");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("larger than the model's"));
  const std::string short_text = (testing::scratch_dir() / "short.txt").string();
  std::ofstream(short_text) << "Once upon a time";
  r = kvcache("perplexity -m " + model + " -f " + short_text + " -c 64");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("fewer than one chunk of 64"));
  r = kvcache("perplexity -m " + model + " -f " + text + " --kl-divergence");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("give --kl-divergence-base FILE too"));
}

}  // namespace
}  // namespace kvc
