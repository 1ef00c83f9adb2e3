// `kvcache bench -m MODEL.gguf`: one model's prefill and decode speed, shaped like llama.cpp's
// llama-bench (same flags, same tests, same JSON fields), so the two read side by side.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "model/gguf.h"

namespace kvc::bench {

struct ModelBenchOptions {
  std::string model_path;
  std::vector<int> n_prompt = {512};  // one prefill test per value (0: none)
  std::vector<int> n_gen = {128};     // one decode test per value (0: none)
  std::vector<int> n_depth = {0};     // tokens already in the KV cache before each test
  std::vector<int> threads;           // empty: every core
  std::vector<int> n_parallel = {1};  // sequences decoding together in a decode test
  int repetitions = 5;
  DType kv_k_dtype = DType::F16;
  DType kv_v_dtype = DType::F16;
  bool json = false;  // a JSON array shaped like `llama-bench -o json` instead of a table
  gguf::Residency residency = gguf::Residency::kLoaded;  // how the model file is held
};

// One test's result, with llama-bench's field names.
struct ModelBenchResult {
  int n_prompt = 0;
  int n_gen = 0;
  int n_depth = 0;
  int n_parallel = 1;
  int n_threads = 0;
  std::vector<double> samples_ts;  // tokens/s of each repetition
  double avg_ts = 0.0;
  double stddev_ts = 0.0;  // sample standard deviation, 0 for one repetition
};

// Runs every test the options describe and prints a table or the JSON array to out.
void run_model_bench(const ModelBenchOptions& options, std::ostream& out);

}  // namespace kvc::bench
