// The shape of KV storage for one model: how many bytes a token, a block and a pool take.
//
// This is the single place that turns a model's attention geometry into bytes; the block
// pool allocates with it and `kvcache plan` predicts with it, so the two always agree.
//
// Thread-safety: an immutable value once built; safe to read from any thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"

namespace kvc::kv {

// Tokens per KV block unless configured otherwise (every command and the planner use it).
inline constexpr int kDefaultBlockTokens = 16;

struct KvGeometry {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_tokens = kDefaultBlockTokens;
  DType dtype = DType::F32;  // f32 or f16 in the block pool

  // Bytes of K and V for one token across all layers.
  size_t bytes_per_token() const;
  // Bytes of one block: block_tokens tokens laid out [layer][K|V][kv_head][token][head_dim].
  size_t bytes_per_block() const;
  // Blocks needed to hold n tokens (rounded up).
  size_t blocks_for_tokens(size_t n) const;
  // Byte offset inside a block of (layer, kind 0 = K / 1 = V, kv_head, token).
  size_t offset(int layer, int kind, int kv_head, int token) const;
  // Throws Error naming the field when a dimension is not positive or the dtype is not one
  // the pool stores.
  void validate() const;
};

}  // namespace kvc::kv
