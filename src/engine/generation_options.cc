#include "engine/generation_options.h"

#include <random>

namespace kvc::engine {

std::vector<Request> make_requests(const std::vector<std::vector<int32_t>>& prompts,
                                   size_t samples_per_prompt, const GenerationOptions& options) {
  std::vector<Request> out;
  out.reserve(prompts.size() * samples_per_prompt);
  for (const auto& prompt : prompts) {
    for (size_t j = 0; j < samples_per_prompt; ++j) {
      Request q;
      q.prompt = prompt;
      q.sampling = options.sampling;
      q.sampling.seed = options.sampling.seed + out.size();
      q.max_tokens = options.max_tokens;
      q.stop = options.stop;
      q.stop_tokens = options.stop_tokens;
      q.ignore_eos = options.ignore_eos;
      q.ns = options.ns;
      out.push_back(std::move(q));
    }
  }
  return out;
}

uint64_t fresh_seed() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

}  // namespace kvc::engine
