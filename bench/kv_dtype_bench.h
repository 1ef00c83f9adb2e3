// `kvcache bench kv-dtypes`: what each KV storage type costs in memory and accuracy, side by
// side in one run against f16 keys and values, on text the model samples itself.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "base/dtype.h"

namespace kvc::bench {

struct KvDtypeBenchOptions {
  std::string model_path;
  size_t tokens = 40960;  // sampled text, in segments of the chunk size (half is scored)
  uint64_t seed = 1;
  int context = 512;  // perplexity chunk (-c); capped at the model's context
  int threads = 2;
  // (K, V) pairs compared with f16 / f16.
  std::vector<std::pair<DType, DType>> types = {
      {DType::Q8_0, DType::Q8_0}, {DType::Q8_0, DType::Q4_0}, {DType::Q4_0, DType::Q4_0}};
  std::string save_text;  // where set, the sampled text is written there (for llama-perplexity)
  bool json = false;
};

// Samples the text, scores it with f16 KV and with each pair, and prints per pair: bytes per
// token vs f16, perplexity and its change, mean and 99th-percentile KL divergence, top-1
// agreement.
void run_kv_dtype_bench(const KvDtypeBenchOptions& options, std::ostream& out);

}  // namespace kvc::bench
