#include "model/perplexity.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "kv/block_pool.h"
#include "kv/block_table.h"

namespace kvc::model {

void log_softmax(std::span<const float> logits, std::span<float> out) {
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
  const double log_sum = std::log(sum);
  for (size_t i = 0; i < logits.size(); ++i) {
    out[i] = static_cast<float>(static_cast<double>(logits[i]) - max - log_sum);
  }
}

PerplexityResult perplexity(const LlamaModel& model, ThreadPool& threads,
                            std::span<const int32_t> tokens, const PerplexityOptions& o,
                            const LogProbSink& sink, const ProgressFn& progress) {
  const LlamaConfig& c = model.config();
  if (tokens.empty()) fail("perplexity: the text is empty");
  if (o.context < 4)
    fail("perplexity: the context (-c) must be at least 4 tokens, got {}", o.context);
  if (o.context > c.context_length) {
    fail("perplexity: a context (-c) of {} tokens is larger than the model's {}", o.context,
         c.context_length);
  }
  const size_t ctx = static_cast<size_t>(o.context);
  const size_t available = tokens.size() / ctx;
  if (available == 0) {
    fail("perplexity: the text has {} tokens, fewer than one chunk of {} (lower -c)", tokens.size(),
         ctx);
  }
  const size_t chunks =
      o.chunks < 0 ? available : std::min(available, static_cast<size_t>(o.chunks));
  if (chunks == 0) fail("perplexity: --chunks must be positive");

  const kv::KvGeometry g = c.kv_geometry(o.k_dtype, o.v_dtype, o.block_tokens);
  kv::BlockPool pool(g, g.blocks_for_sequence(ctx) * g.bytes_per_block());
  ForwardScratch scratch;
  const size_t first = ctx / 2;  // the first scored position: its logits predict first + 1
  const size_t n_vocab = static_cast<size_t>(c.n_vocab);
  std::vector<float> log_probs(n_vocab);
  std::vector<BatchRow> rows;
  PerplexityResult r;
  double sum = 0.0, sum2 = 0.0;
  for (size_t chunk = 0; chunk < chunks; ++chunk) {
    const std::span<const int32_t> text = tokens.subspan(chunk * ctx, ctx);
    kv::BlockTable table(pool);
    if (!table.reserve(ctx)) fail("perplexity: the KV pool cannot hold one chunk");
    for (size_t begin = 0; begin < ctx; begin += static_cast<size_t>(o.batch_tokens)) {
      const size_t end = std::min(ctx, begin + static_cast<size_t>(o.batch_tokens));
      rows.clear();
      for (size_t j = begin; j < end; ++j) {
        const int32_t token = j == 0 && o.bos_id ? *o.bos_id : text[j];
        rows.push_back({token, static_cast<int32_t>(j), &table, j >= first && j + 1 < ctx});
      }
      const std::span<const float> logits = model.forward(threads, pool, rows, scratch);
      size_t m = 0;
      for (size_t j = begin; j < end; ++j) {
        if (!rows[j - begin].want_logits) continue;
        log_softmax(logits.subspan(m * n_vocab, n_vocab), log_probs);
        ++m;
        const int32_t next = text[j + 1];
        const double nll = -static_cast<double>(log_probs[static_cast<size_t>(next)]);
        sum += nll;
        sum2 += nll * nll;
        ++r.scored_tokens;
        if (sink) sink(log_probs, next);
      }
    }
    ++r.chunks;
    r.running_ppl.push_back(std::exp(sum / static_cast<double>(r.scored_tokens)));
    if (progress) progress(r.chunks, chunks, r.running_ppl.back());
  }
  const auto n = static_cast<double>(r.scored_tokens);
  r.mean_nll = sum / n;
  // As llama-perplexity: the standard error of the mean over the scored tokens.
  const double variance = std::max(0.0, sum2 / n - r.mean_nll * r.mean_nll);
  r.nll_stderr = n > 1 ? std::sqrt(variance / (n - 1)) : 0.0;
  r.ppl = std::exp(r.mean_nll);
  r.ppl_error = r.ppl * r.nll_stderr;
  return r;
}

}  // namespace kvc::model
