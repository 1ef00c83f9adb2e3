// Benchmarks of the KV cache proper: prefix-index throughput and memory, KV memory waste on
// variable-length sequences, and prefill time with the prefix cache on against off.
#pragma once

#include <ostream>
#include <string>

#include "kv/kv_geometry.h"

namespace kvc::bench {

struct PrefixIndexBenchOptions {
  size_t cached_tokens = 1'000'000;  // tokens held by the index before timing
  int block_tokens = kv::kDefaultBlockTokens;
  size_t operations = 20'000;
};
// Match + insert operations per second on an index holding options.cached_tokens tokens,
// and the index's bookkeeping bytes per cached block.
void run_prefix_index_bench(const PrefixIndexBenchOptions& options, std::ostream& out);

struct KvWasteBenchOptions {
  size_t sequences = 2000;
  size_t min_tokens = 64;
  size_t max_tokens = 4096;
};
// Bytes allocated but holding no token, as a fraction of bytes allocated, for sequences of
// random lengths, at several block sizes.
void run_kv_waste_bench(const KvWasteBenchOptions& options, std::ostream& out);

struct SharedPrefixBenchOptions {
  std::string model_path;
  int prompts = 50;
  int preamble_tokens = 200;
  int question_tokens = 12;
  int threads = 2;
};
// Prompts sharing a preamble run one after another through one cache, with the prefix cache
// on and then off: total prefill time, TTFT and their ratio.
void run_shared_prefix_bench(const SharedPrefixBenchOptions& options, std::ostream& out);

}  // namespace kvc::bench
