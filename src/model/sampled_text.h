// Text a model samples itself: the in-distribution text on which KV storage types are scored
// (`kvcache bench kv-dtypes`), so that perplexity measures the storage, not a mismatch between
// the model and someone else's text.
//
// Thread-safety: runs forward passes on the caller's thread pool; the model is read-only.
#pragma once

#include <cstdint>
#include <vector>

#include "base/thread_pool.h"
#include "model/llama_model.h"

namespace kvc::model {

// n tokens in segments of `segment` tokens, each starting with `first` (BOS) and sampled at
// temperature 1 with no truncation, segment i with seed + i, through f32 keys and values. The
// same arguments give the same tokens on every machine with the same kernels.
std::vector<int32_t> sample_own_text(const LlamaModel& model, ThreadPool& threads, size_t n,
                                     size_t segment, int32_t first, uint64_t seed);

}  // namespace kvc::model
