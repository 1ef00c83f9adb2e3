// `kvcache bench tiers`: the tiers' policies side by side on serving workloads whose working
// set is four times the pool: drop (no tier, least recently used eviction), keep-all (every
// block to the disk tier, every hit loaded) and the cost model; TTFT p50/p99 of each, the ratios
// that decide, and a warm restart.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace kvc::bench {

struct TierBenchOptions {
  std::string model_path;
  std::vector<std::string> workloads = {"conversations", "documents", "short"};
  double scale = 1.0;  // multiplies the number of users, documents' questions and prompts
  int threads = 2;
  uint64_t seed = 1;
  int repeat = 1;  // runs of each policy (in rotated order); TTFT figures are their medians
  bool json = false;
};

// Runs every workload under every policy; the disk tier lives in a directory made for the run
// under $TMPDIR and emptied and removed afterwards.
void run_tier_bench(const TierBenchOptions& options, std::ostream& out);

}  // namespace kvc::bench
