// The Llama-family forward pass over a batch of sequences whose keys and values live in
// KV-pool blocks.
//
// One call runs any mix of rows: prompt chunks and single decode tokens of different
// sequences at different positions. Each row's result depends only on its own token, its
// position and its sequence's cached keys and values, never on the other rows, the batch size
// or the thread count (DESIGN.md: a hit never changes the answer).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "base/matmul.h"
#include "base/thread_pool.h"
#include "kv/block_pool.h"
#include "kv/block_table.h"
#include "model/gguf.h"
#include "model/llama_config.h"

namespace kvc::model {

// One token of one sequence in a forward batch.
struct BatchRow {
  int32_t token = 0;
  int32_t pos = 0;                        // its position in the sequence
  const kv::BlockTable* table = nullptr;  // blocks covering positions [0, pos]
  bool want_logits = false;               // whether to compute this row's logits
  // Where the pool splits windowed layers from full ones (KvGeometry::split_window): the
  // blocks of the windowed layers, table holding the full layers'.
  const kv::BlockTable* window_table = nullptr;
};

// Working memory of forward passes, reused between calls to avoid reallocation.
struct ForwardScratch {
  std::vector<float> x, xb, q, k, v, attn, gate, up, logits_in, logits;
  std::vector<float> rope_cos, rope_sin;
  std::vector<uint8_t> activations;
  std::vector<uint16_t> staged_keys;  // f16 keys of blocks a batch fills past a sequence's open one
};

struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;
  std::vector<float> q_bias, k_bias, v_bias;         // qwen2's; empty when the file has none
  std::vector<float> q_norm, k_norm;                 // qwen3's per-head RMSNorm weights (head_dim)
  std::vector<float> post_attn_norm, post_ffn_norm;  // gemma2's
  WeightView wq, wk, wv, wo, w_gate, w_up, w_down;
};

class LlamaModel {
 public:
  // Loads (or maps, as residency says) the GGUF file at path and binds every tensor in place;
  // throws Error naming the tensor or key at fault, including a block_count the tensors do not
  // have and a tensor the model does not use.
  static std::unique_ptr<LlamaModel> load(const std::string& path,
                                          gguf::Residency residency = gguf::Residency::kLoaded);
  // Binds an already parsed file (which must outlive the model).
  static std::unique_ptr<LlamaModel> from_file(std::shared_ptr<const gguf::File> file);

  const LlamaConfig& config() const { return config_; }
  const gguf::File& file() const { return *file_; }
  // Bytes of all tensors (what a decode step streams from memory, plus the embedding table).
  uint64_t weight_bytes() const { return weight_bytes_; }
  // Bytes read from weights to produce one token's logits (all matrices but the embedding).
  uint64_t bytes_read_per_token() const { return bytes_read_per_token_; }
  // Multiply-adds of one sequence's forward pass over positions [start, start + tokens): every
  // layer's matrix products, attention's scores and weighted values over the keys each
  // position sees (its layer's window, if any), and the logits of the last position only, as a
  // prompt's prefill computes them.
  uint64_t multiply_adds(int start, int tokens) const;
  // The dtype most of the weights have (that of attn_q in layer 0).
  DType weight_dtype() const { return layers_.front().wq.dtype; }

  // Runs rows through the model, writing each row's keys and values into its block table's
  // blocks (at position pos) and returning, row-major, the vocabulary logits of the rows with
  // want_logits set, in row order. Throws Error if a row's table does not cover its position
  // or a token is outside the vocabulary.
  std::span<const float> forward(ThreadPool& threads, kv::BlockPool& pool,
                                 std::span<const BatchRow> rows, ForwardScratch& scratch) const;

 private:
  LlamaModel() = default;
  // Binds every tensor the config needs; throws Error naming a missing, misshapen or unused one.
  void bind_weights();
  // The tensor called name, which must exist, marked as used.
  const gguf::TensorInfo& bind(const std::string& name);
  WeightView matrix(const std::string& name, size_t in_dim, size_t out_dim);
  // Rows [first, first + count) of w, in place.
  static WeightView rows_of(const WeightView& w, size_t first, size_t count);
  std::vector<float> vector(const std::string& name, size_t n);
  // own_keys: per row, where keys are grouped per channel, its own block's f16 keys of this
  // layer, [kv_head][slot][head_dim] (empty otherwise).
  // kv_layer: where layer's keys and values sit in the rows' tables' blocks (its index in its
  // group of layers, LlamaConfig::kv_slot).
  void attention(ThreadPool& threads, kv::BlockPool& pool, std::span<const BatchRow> rows,
                 int layer, int kv_layer, std::span<const uint16_t* const> own_keys,
                 ForwardScratch& s) const;

  std::shared_ptr<const gguf::File> file_;
  LlamaConfig config_;
  // While binding: per tensor of the file, whether a weight uses it (or it is deliberately
  // skipped).
  std::vector<bool> bound_;
  const gguf::TensorInfo* token_embd_ = nullptr;
  std::vector<LayerWeights> layers_;
  std::vector<float> output_norm_;
  // Per rotary pair i, the divisor of its angle (rope_freqs.weight, as Llama 3.1 files carry
  // for their long-context scaling, or LongRoPE's long or short factors); empty when the file
  // has none (all 1).
  std::vector<float> rope_freq_factors_;
  WeightView output_;
  uint64_t weight_bytes_ = 0;
  uint64_t bytes_read_per_token_ = 0;
  // Elements of every layer's matrices, all layers: each multiplies once per position.
  uint64_t layer_matrix_elements_ = 0;
};

}  // namespace kvc::model
