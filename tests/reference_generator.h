// A reference loop for tests: one sequence, prefilled in chunks, then decoded token by token,
// with every token's keys and values in KV-pool blocks. It calls the model directly, with none
// of the engine's scheduling, so engine results can be checked against it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "kv/block_pool.h"
#include "kv/block_table.h"
#include "kv/prefix_index.h"
#include "model/llama_model.h"
#include "model/sampler.h"

namespace kvc::testing {

struct GenerationOptions {
  int max_tokens = 128;
  int prefill_chunk = 512;  // prompt tokens per forward call
  model::SamplingParams sampling;
  bool stop_at_eos = true;
  int32_t eos_id = -1;
  // Called with each step's logits before sampling (tests, log-probabilities).
  std::function<void(std::span<const float>)> on_logits;
};

// Where a generation looks up and leaves its prefix: an index and the request's namespace.
struct CacheContext {
  kv::PrefixIndex* index = nullptr;
  kv::Hash256 ns{};
};

struct GenerationStats {
  size_t prompt_tokens = 0;
  size_t generated_tokens = 0;
  double prefill_ms = 0.0;
  double decode_ms = 0.0;   // from the first to the last sampled token
  size_t decode_steps = 0;  // single-token forward passes in decode_ms
  size_t kv_blocks = 0;
  size_t kv_bytes = 0;        // bytes of the blocks the sequence holds
  std::string finish_reason;  // "length", "eos" or "context"
  size_t cached_tokens = 0;   // prompt tokens whose keys and values came from the cache
  kv::MissReason miss;        // why the cache did not cover more of the prompt
  double ttft_ms = 0.0;       // from the call to the first sampled token
};

class Generator {
 public:
  // All three must outlive the generator.
  Generator(const model::LlamaModel& model, kv::BlockPool& pool, ThreadPool& threads);

  // Runs prompt (non-empty) and samples up to options.max_tokens tokens, calling on_token for
  // each; on_token returning false stops early. With a cache context, the prompt's cached
  // prefix is reused (all but its last token, whose logits are needed) and the sequence's
  // blocks are indexed as they fill and when it ends. Throws Error when the KV pool cannot
  // hold the sequence.
  GenerationStats generate(std::span<const int32_t> prompt, const GenerationOptions& options,
                           const std::function<bool(int32_t)>& on_token,
                           const CacheContext& cache = {});

  // Logits of the last prompt token after prefilling in chunks of chunk tokens (for tests).
  std::vector<float> prompt_logits(std::span<const int32_t> prompt, int chunk);

 private:
  void reserve(kv::BlockTable& table, size_t tokens);
  void make_writable(kv::BlockTable& table, size_t pos);

  const model::LlamaModel& model_;
  kv::BlockPool& pool_;
  ThreadPool& threads_;
  model::ForwardScratch scratch_;
};

}  // namespace kvc::testing
