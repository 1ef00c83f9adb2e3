// `kvcache bench workload`: serving workloads run in process through the engine, each with
// the prefix cache on and then off, reporting TTFT p50/p99 and throughput side by side.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace kvc::bench {

struct WorkloadBenchOptions {
  std::string model_path;
  std::vector<std::string> workloads = {"shared-system-prompt", "multi-turn", "few-shot",
                                        "no-sharing"};
  int users = 16;  // shared system prompt, few-shot, no sharing
  int system_prompt_tokens = 1000;
  int question_tokens = 24;
  int output_tokens = 16;
  int sessions = 4;  // multi-turn
  int turns = 5;
  int turn_tokens = 24;  // new user tokens per turn
  int threads = 2;
  uint64_t seed = 1;
  bool json = false;
};

void run_workload_bench(const WorkloadBenchOptions& options, std::ostream& out);

}  // namespace kvc::bench
