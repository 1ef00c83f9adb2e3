// The shape of KV storage for one model: how many bytes a token, a block and a pool take, and
// where each layer's keys and values sit inside a block.
//
// This is the single place that turns a model's attention geometry into bytes; the block
// pool allocates with it and `kvcache plan` predicts with it, so the two always agree.
//
// Keys and values have their own dtypes (f32, f16, q8_0 or q4_0). A quantised dtype stores
// groups of 32 values with one f16 scale, as GGUF does; which 32 values form a group depends
// on the head dimension (see KvGrouping). A token's group never spans other tokens, so a
// token is quantised once, when it is written, and a block's bytes never change afterwards.
//
// Thread-safety: an immutable value once built; safe to read from any thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"

namespace kvc::kv {

// Tokens per KV block unless configured otherwise (every command and the planner use it).
inline constexpr int kDefaultBlockTokens = 16;

// Which values share a quantisation group (32 values, one scale).
enum class KvGrouping : uint8_t {
  // Along head_dim within one head (f32/f16, or head_dim a multiple of 32). A kind's slab in a
  // block is [kv_head][token][head_dim].
  kHead,
  // Across the KV heads of one token and layer (head_dim divides 32, as stories260K's 8 with 4
  // KV heads): a kind's slab in a block is [token][kv_head * head_dim], and one head's values
  // are a run inside one group.
  kToken,
};

// Where attention finds one (layer, K|V, kv head) inside a block: token t's values start at
// element `first` of the group that begins offset + t * stride bytes into the block.
struct KvRun {
  size_t offset = 0;
  size_t stride = 0;
  int first = 0;
};

struct KvGeometry {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_tokens = kDefaultBlockTokens;
  DType k_dtype = DType::F16;
  DType v_dtype = DType::F16;

  // The dtype of kind 0 (K) or 1 (V).
  DType dtype(int kind) const { return kind == 0 ? k_dtype : v_dtype; }
  // The grouping kind's dtype uses; call validate() first for quantised dtypes.
  KvGrouping grouping(int kind) const;
  // Bytes of one token's K (kind 0) or V (kind 1) in one layer, every head.
  size_t token_bytes(int kind) const;
  // Bytes of K and V for one token across all layers.
  size_t bytes_per_token() const;
  // Bytes of one block: block_tokens tokens, [layer][K|V] slabs laid out by grouping(kind).
  size_t bytes_per_block() const;
  // Blocks needed to hold n tokens (rounded up).
  size_t blocks_for_tokens(size_t n) const;
  // Byte offset inside a block of the slab of (layer, kind).
  size_t slab_offset(int layer, int kind) const;
  // Where the rows of (layer, kind, kv_head) sit inside a block.
  KvRun run(int layer, int kind, int kv_head) const;
  // Byte offset inside a block of the row (or, grouped per token, the group) holding token's
  // values of (layer, kind, kv_head).
  size_t offset(int layer, int kind, int kv_head, int token) const;
  // Quantises one token's K (kind 0) or V (kind 1) of one layer, n_kv_heads * head_dim values
  // head after head, into its slot of block: the only place a token's stored bytes are made.
  void store_token(uint8_t* block, int layer, int kind, int slot, const float* values) const;
  // Throws Error naming the field when a dimension is not positive, a dtype is not one the
  // pool stores (f32, f16, q8_0, q4_0), or no grouping of 32 values fits a quantised dtype.
  void validate() const;
};

}  // namespace kvc::kv
