// What a caller asks of a generation (sampling, length, stops, namespace), turned into engine
// requests one way for every caller: `kvcache run` and the HTTP server both build their
// requests here.
//
// Thread-safety: plain values and pure functions; fresh_seed() may be called from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/request.h"
#include "kv/content_hash.h"
#include "model/sampler.h"

namespace kvc::engine {

struct GenerationOptions {
  model::SamplingParams sampling;  // sampling.seed is the first sample's seed
  int max_tokens = 128;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_tokens;
  bool ignore_eos = false;
  kv::Hash256 ns{};
};

// One request per prompt and sample, prompt by prompt: samples of one call differ only by
// seed (seed, seed + 1, ... across all of them), so the prefix cache lets them share each
// prompt's blocks.
std::vector<Request> make_requests(const std::vector<std::vector<int32_t>>& prompts,
                                   size_t samples_per_prompt, const GenerationOptions& options);

// A seed for a caller that gave none (callers that print it let a run be repeated).
uint64_t fresh_seed();

}  // namespace kvc::engine
