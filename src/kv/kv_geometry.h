// The shape of KV storage for one model: how many bytes a token, a block and a pool take, and
// where each layer's keys and values sit inside a block.
//
// This is the single place that turns a model's attention geometry into bytes; the block
// pool allocates with it and `kvcache plan` predicts with it, so the two always agree.
//
// Keys and values have their own dtypes (f32, f16, q8_0 or q4_0). Quantised values store
// groups of 32 values with one f16 scale, as GGUF does; which 32 values form a group depends
// on the head dimension (see KvGrouping), and a token's group never spans other tokens.
// Quantised keys are grouped per channel across a block's 32 tokens (base/channel_keys.h): a
// block's keys are held as f16 in its sequence's open-key blocks (kv/block_table.h) until its
// last token is written, then quantised once; a block's stored bytes never change afterwards.
//
// Thread-safety: an immutable value once built; safe to read from any thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"

namespace kvc::kv {

// Tokens per KV block unless configured otherwise (every command and the planner use it), and
// where keys are quantised (grouped per channel across a block of 32 tokens).
inline constexpr int kDefaultBlockTokens = 16;
inline constexpr int kQuantisedKeyBlockTokens = 32;
// The block size for keys of k_dtype when none is asked for (requested 0), else requested.
inline int block_tokens_for(DType k_dtype, int requested) {
  if (requested != 0) return requested;
  return block_elements(k_dtype) > 1 ? kQuantisedKeyBlockTokens : kDefaultBlockTokens;
}

// Which values share a quantisation group (32 values, one scale).
enum class KvGrouping : uint8_t {
  // Along head_dim within one head (f32/f16, or head_dim a multiple of 32). A kind's slab in a
  // block is [kv_head][token][head_dim].
  kHead,
  // Across the KV heads of one token and layer (head_dim divides 32, as stories260K's 8 with 4
  // KV heads): a kind's slab in a block is [token][kv_head * head_dim], and one head's values
  // are a run inside one group.
  kToken,
  // Quantised keys: per channel across the block's 32 tokens; a slab is one channel-grouped
  // slab (base/channel_keys.h) per KV head.
  kChannel,
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
  // Sliding window of every layer, in tokens (0: full attention): the query at position p sees
  // the keys at p - window_tokens + 1 .. p, so a sequence holds only the blocks that window
  // touches and releases those wholly behind it (kv/block_table.h).
  int window_tokens = 0;
  // Layers of two kinds (Gemma 2: full attention and a sliding window, alternating): n_layers is
  // then the layers of one group (the larger), and a sequence holds blocks of this shape for
  // each group, the second group's sliding over split_window tokens (0: one group).
  int split_window = 0;

  // Groups of layers a sequence holds blocks for: 1, or 2 with split_window.
  int groups() const { return split_window > 0 ? 2 : 1; }
  // Whether some layers slide (every layer, or the second group's): a sequence then holds no
  // more than its window's blocks in them, releasing those behind it as it runs.
  bool slides() const { return window_tokens > 0 || split_window > 0; }
  // The geometry of one group's blocks: the full-attention group (0) or the windowed one (1).
  KvGeometry group(int g) const;

  // The dtype of kind 0 (K) or 1 (V).
  DType dtype(int kind) const { return kind == 0 ? k_dtype : v_dtype; }
  // The grouping kind's dtype uses; call validate() first for quantised dtypes.
  KvGrouping grouping(int kind) const;
  // Whether keys are grouped per channel (quantised keys), held as f16 until a block is full.
  bool keys_by_channel() const { return grouping(0) == KvGrouping::kChannel; }
  // Bytes of one token's K (kind 0) or V (kind 1) in one layer, every head; for keys grouped
  // per channel, a block's slab divided by its tokens, rounded up.
  size_t token_bytes(int kind) const;
  // Bytes of one block's slab of K (kind 0) or V (kind 1) in one layer.
  size_t slab_bytes(int kind) const;
  // Bytes of K and V for one token across all layers of every group (bytes_per_block() /
  // block_tokens, rounded up where keys are grouped per channel, per group).
  size_t bytes_per_token() const;
  // Bytes of one block: block_tokens tokens, [layer][K|V] slabs laid out by grouping(kind).
  size_t bytes_per_block() const;
  // Blocks needed to hold n tokens (rounded up).
  size_t blocks_for_tokens(size_t n) const;
  // The first position whose keys the query at position pos reads (0 without a window).
  size_t first_needed(size_t pos) const;
  // Blocks one sequence of n tokens (n > 0) holds while it runs, computing at most chunk tokens
  // per step: its tokens' (with a window, those the window of a step's first query to its last
  // token touches) and its open keys', summed over the groups. With chunk 1 (decoding) it is
  // what `kvcache plan` costs.
  size_t blocks_for_sequence(size_t n, size_t chunk = 1) const;
  // Byte offset inside a block of the slab of (layer, kind).
  size_t slab_offset(int layer, int kind) const;
  // Where the rows of (layer, kind, kv_head) sit inside a block.
  KvRun run(int layer, int kind, int kv_head) const;
  // Byte offset inside a block of the row (or, grouped per token, the group) holding token's
  // values of (layer, kind, kv_head).
  size_t offset(int layer, int kind, int kv_head, int token) const;
  // Quantises one token's K (kind 0) or V (kind 1) of one layer, n_kv_heads * head_dim values
  // head after head, into its slot of block: the only place a token's stored bytes are made
  // (keys grouped per channel: values only).
  void store_token(uint8_t* block, int layer, int kind, int slot, const float* values) const;
  // Keys grouped per channel: quantises one layer's keys of a full block from their f16 form,
  // [kv_head][token][head_dim] (open_layer_bytes() bytes), into block.
  void store_block_keys(uint8_t* block, int layer, const uint16_t* keys) const;
  // Keys grouped per channel: bytes of one layer's f16 keys of one block, and the open-key
  // blocks a sequence holds them in (whole layers per block; 0 for other keys).
  size_t open_layer_bytes() const;
  size_t open_key_blocks() const;
  // Which open-key block holds layer's f16 keys, and at what byte offset.
  size_t open_key_block_of(int layer) const;
  size_t open_key_offset(int layer) const;
  // Throws Error naming the field when a dimension is not positive, a dtype is not one the
  // pool stores (f32, f16, q8_0, q4_0), no grouping of 32 values fits quantised values, or
  // quantised keys meet a block size other than 32 or a head size not a multiple of 8, or the
  // window is negative.
  void validate() const;
};

}  // namespace kvc::kv
