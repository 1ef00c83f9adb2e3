#include "model/key_centres.h"

#include <algorithm>

#include "base/error.h"
#include "kv/block_pool.h"
#include "kv/block_table.h"
#include "model/llama_model.h"

namespace kvc::model {

KeyCentres calibrate_key_centres(const LlamaModel& model, ThreadPool& threads) {
  const LlamaConfig& c = model.config();
  KeyCentres out;
  if (c.attn_softcap > 0.0f) return out;
  const int n = std::min(kKeyCentreTokens, c.context_length);
  if (n < 2) return out;
  kv::KvGeometry g{c.n_layers, c.n_kv_heads, c.head_dim, kv::kDefaultBlockTokens,
                   DType::F32, DType::F32};
  kv::BlockPool pool(g, g.bytes_per_block() * g.blocks_for_tokens(static_cast<size_t>(n)));
  kv::BlockTable table(pool);
  if (!table.reserve(static_cast<size_t>(n))) fail("key calibration: the KV pool is too small");
  // xorshift64: the same tokens on every machine, spread over the whole vocabulary.
  uint64_t state = 0x9E3779B97F4A7C15ull;
  std::vector<BatchRow> rows;
  for (int i = 0; i < n; ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    rows.push_back(
        {static_cast<int32_t>(state % static_cast<uint64_t>(c.n_vocab)), i, &table, false});
  }
  ForwardScratch scratch;
  model.forward(threads, pool, rows, scratch);
  const int hd = c.head_dim;
  for (int l = 0; l < c.n_layers; ++l) {
    std::vector<double> sum(static_cast<size_t>(c.kv_dim()), 0.0);
    for (int t = 1; t < n; ++t) {
      const uint8_t* block = pool.data(table.block_of(static_cast<size_t>(t)));
      const int slot = table.slot_of(static_cast<size_t>(t));
      for (int h = 0; h < c.n_kv_heads; ++h) {
        const auto* key = reinterpret_cast<const float*>(block + g.offset(l, 0, h, slot));
        for (int i = 0; i < hd; ++i) sum[static_cast<size_t>(h * hd + i)] += key[i];
      }
    }
    std::vector<float> centre(sum.size());
    for (size_t i = 0; i < sum.size(); ++i) centre[i] = static_cast<float>(sum[i] / (n - 1));
    out.per_layer.push_back(std::move(centre));
  }
  return out;
}

}  // namespace kvc::model
