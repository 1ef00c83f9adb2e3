// Perplexity of a model over a text's tokens, scored as llama.cpp's llama-perplexity scores it:
// the tokens are cut into chunks of `context` tokens, each chunk starts with BOS and runs in a
// fresh KV sequence, and only the second half of each chunk is scored (every scored token then
// sees at least context / 2 tokens before it).
//
// Thread-safety: one call at a time per model scratch; the model itself is read-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "base/dtype.h"
#include "base/thread_pool.h"
#include "model/llama_model.h"

namespace kvc::model {

struct PerplexityOptions {
  int context = 512;  // tokens per chunk (-c)
  int chunks = -1;    // chunks to score; -1: every whole chunk of the text
  DType k_dtype = DType::F16;
  DType v_dtype = DType::F16;
  int block_tokens = 0;           // 0: kv::block_tokens_for the key dtype
  int batch_tokens = 512;         // tokens per forward pass within a chunk
  std::optional<int32_t> bos_id;  // written over each chunk's first token
};

struct PerplexityResult {
  size_t chunks = 0;
  size_t scored_tokens = 0;         // per chunk: context - 1 - context / 2
  double mean_nll = 0.0;            // mean negative log-likelihood (nats) of the scored tokens
  double nll_stderr = 0.0;          // standard error of mean_nll
  double ppl = 0.0;                 // exp(mean_nll)
  double ppl_error = 0.0;           // ppl * nll_stderr, the first-order error of ppl
  std::vector<double> running_ppl;  // ppl over the chunks scored so far, after each chunk
};

// Called for each scored token, in order, with the log-probabilities the model gives every
// vocabulary entry and the token that actually follows.
using LogProbSink = std::function<void(std::span<const float> log_probs, int32_t next)>;
// Called after each chunk with (chunks done, chunks in all, perplexity so far).
using ProgressFn = std::function<void(size_t done, size_t total, double ppl)>;

// Scores tokens; throws Error when there are no tokens, fewer than one chunk, a context below
// 4 tokens or above the model's context length, or a KV dtype the pool cannot store.
PerplexityResult perplexity(const LlamaModel& model, ThreadPool& threads,
                            std::span<const int32_t> tokens, const PerplexityOptions& options,
                            const LogProbSink& sink = {}, const ProgressFn& progress = {});

// log_softmax(logits) into out (same size), in a fixed order, accumulated in double.
void log_softmax(std::span<const float> logits, std::span<float> out);

}  // namespace kvc::model
