#include "reference_generator.h"

#include <algorithm>
#include <chrono>

#include "base/error.h"

namespace kvc::testing {

namespace {
double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

Generator::Generator(const model::LlamaModel& model, kv::BlockPool& pool, ThreadPool& threads)
    : model_(model), pool_(pool), threads_(threads) {}

void Generator::make_writable(kv::BlockTable& table, size_t pos) {
  if (!table.ensure_writable(pos)) {
    fail(
        "KV cache full: no free block to copy a shared block into before writing position {} "
        "(raise --kv-memory)",
        pos);
  }
}

void Generator::reserve(kv::BlockTable& table, size_t tokens) {
  if (!table.reserve(tokens)) {
    const auto& g = pool_.geometry();
    fail(
        "KV cache full: {} tokens need {} blocks of {} tokens, but only {} of {} blocks are "
        "free (raise --kv-memory)",
        tokens, g.blocks_for_tokens(tokens), g.block_tokens, pool_.counts().free,
        pool_.num_blocks());
  }
}

std::vector<float> Generator::prompt_logits(std::span<const int32_t> prompt, int chunk) {
  if (prompt.empty()) fail("the prompt is empty");
  kv::BlockTable table(pool_);
  reserve(table, prompt.size());
  std::span<const float> logits;
  for (size_t start = 0; start < prompt.size(); start += chunk) {
    const size_t end = std::min(prompt.size(), start + static_cast<size_t>(chunk));
    std::vector<model::BatchRow> rows;
    for (size_t i = start; i < end; ++i) {
      rows.push_back({prompt[i], static_cast<int32_t>(i), &table, i + 1 == prompt.size()});
    }
    logits = model_.forward(threads_, pool_, rows, scratch_);
  }
  return {logits.begin(), logits.end()};
}

GenerationStats Generator::generate(std::span<const int32_t> prompt,
                                    const GenerationOptions& options,
                                    const std::function<bool(int32_t)>& on_token,
                                    const CacheContext& cache) {
  const auto start_time = std::chrono::steady_clock::now();
  if (prompt.empty()) fail("the prompt is empty");
  if (options.max_tokens < 0) fail("max tokens must be >= 0, got {}", options.max_tokens);
  if (options.prefill_chunk < 1) fail("prefill chunk must be >= 1, got {}", options.prefill_chunk);
  const size_t context = model_.config().context_length;
  if (prompt.size() > context) {
    fail("the prompt has {} tokens, more than the model's context of {} tokens", prompt.size(),
         context);
  }
  GenerationStats stats;
  stats.prompt_tokens = prompt.size();
  model::Sampler sampler(options.sampling);
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  const size_t block = pool_.geometry().block_tokens;

  kv::BlockTable table(pool_, cache.index);  // allocation evicts the cache LRU
  if (cache.index != nullptr) {
    const kv::PrefixMatch m = cache.index->match(cache.ns, prompt, prompt.size() - 1, table);
    stats.cached_tokens = m.cached_tokens;
    stats.miss = m.miss;
  } else {
    stats.miss = {kv::MissKind::kDisabled, 0, 0};
  }
  // Blocks become cache entries as soon as they fill, so concurrent and later requests can
  // share them; a sequence's last, partial block joins when it is done.
  const auto seal = [&](size_t written, bool done) {
    if (cache.index != nullptr) cache.index->insert(cache.ns, history, written, table, done);
  };
  reserve(table, prompt.size());
  const auto prefill_start = std::chrono::steady_clock::now();
  std::span<const float> logits;
  for (size_t start = stats.cached_tokens; start < prompt.size(); start += options.prefill_chunk) {
    const size_t end = std::min(prompt.size(), start + options.prefill_chunk);
    make_writable(table, start);
    std::vector<model::BatchRow> rows;
    for (size_t i = start; i < end; ++i) {
      rows.push_back({prompt[i], static_cast<int32_t>(i), &table, i + 1 == prompt.size()});
    }
    logits = model_.forward(threads_, pool_, rows, scratch_);
    seal(end, false);
  }
  stats.prefill_ms = ms_since(prefill_start);

  const auto decode_start = std::chrono::steady_clock::now();
  stats.finish_reason = "length";
  size_t written = prompt.size();
  for (int n = 0; n < options.max_tokens; ++n) {
    if (options.on_logits) options.on_logits(logits);
    const int32_t token = sampler.sample(logits, history);
    if (n == 0) stats.ttft_ms = ms_since(start_time);
    history.push_back(token);
    ++stats.generated_tokens;
    if (options.stop_at_eos && token == options.eos_id) {
      stats.finish_reason = "eos";
      break;
    }
    if (!on_token(token)) break;
    if (n + 1 == options.max_tokens) break;
    if (history.size() >= context) {
      stats.finish_reason = "context";
      break;
    }
    reserve(table, history.size());
    make_writable(table, written);
    const model::BatchRow row{token, static_cast<int32_t>(written), &table, true};
    logits = model_.forward(threads_, pool_, {&row, 1}, scratch_);
    ++written;
    ++stats.decode_steps;
    if (written % block == 0) seal(written, false);
  }
  stats.decode_ms = ms_since(decode_start);
  stats.kv_blocks = table.blocks().size();
  stats.kv_bytes = stats.kv_blocks * pool_.geometry().bytes_per_block();
  seal(written, true);
  return stats;
}

}  // namespace kvc::testing
