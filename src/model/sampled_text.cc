#include "model/sampled_text.h"

#include <algorithm>

#include "base/error.h"
#include "kv/block_pool.h"
#include "kv/block_table.h"
#include "model/sampler.h"

namespace kvc::model {

std::vector<int32_t> sample_own_text(const LlamaModel& model, ThreadPool& threads, size_t n,
                                     size_t segment, int32_t first, uint64_t seed) {
  const LlamaConfig& c = model.config();
  if (segment < 2) fail("sampled text: a segment must hold at least 2 tokens, got {}", segment);
  kv::KvGeometry g{c.n_layers, c.n_kv_heads, c.head_dim, kv::kDefaultBlockTokens,
                   DType::F32, DType::F32};
  kv::BlockPool pool(g, g.bytes_per_block() * g.blocks_for_tokens(segment));
  ForwardScratch scratch;
  std::vector<int32_t> text;
  text.reserve(n);
  for (uint64_t i = 0; text.size() < n; ++i) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = seed + i;
    Sampler sampler(p);
    kv::BlockTable table(pool);
    const size_t length = std::min(segment, n - text.size());
    if (!table.reserve(length)) fail("sampled text: the KV pool is too small");
    std::vector<int32_t> tokens{first};
    while (tokens.size() < length) {
      const BatchRow row{tokens.back(), static_cast<int32_t>(tokens.size() - 1), &table, true};
      tokens.push_back(sampler.sample(model.forward(threads, pool, {&row, 1}, scratch), tokens));
    }
    text.insert(text.end(), tokens.begin(), tokens.end());
  }
  return text;
}

}  // namespace kvc::model
