#include "kv/kv_geometry.h"

#include <algorithm>

#include "base/channel_keys.h"
#include "base/error.h"
#include "base/kernels.h"

namespace kvc::kv {

namespace {

constexpr int kGroup = 32;  // values per q8_0/q4_0 group

bool quantised(DType t) {
  return block_elements(t) > 1;
}

}  // namespace

KvGrouping KvGeometry::grouping(int kind) const {
  const DType t = dtype(kind);
  if (!quantised(t)) return KvGrouping::kHead;
  if (kind == 0) return KvGrouping::kChannel;
  return head_dim % kGroup == 0 ? KvGrouping::kHead : KvGrouping::kToken;
}

size_t KvGeometry::slab_bytes(int kind) const {
  const DType t = dtype(kind);
  switch (grouping(kind)) {
    case KvGrouping::kChannel:
      return static_cast<size_t>(n_kv_heads) * kernels::channel_slab_bytes(t, head_dim);
    case KvGrouping::kToken:
      return row_bytes(t, static_cast<size_t>(n_kv_heads) * head_dim) * block_tokens;
    case KvGrouping::kHead:
      break;
  }
  return static_cast<size_t>(n_kv_heads) * row_bytes(t, head_dim) * block_tokens;
}

size_t KvGeometry::token_bytes(int kind) const {
  return (slab_bytes(kind) + block_tokens - 1) / block_tokens;
}

size_t KvGeometry::bytes_per_token() const {
  return (bytes_per_block() + block_tokens - 1) / block_tokens * static_cast<size_t>(groups());
}

KvGeometry KvGeometry::group(int g) const {
  KvGeometry out = *this;
  out.split_window = 0;
  if (split_window > 0) out.window_tokens = g == 0 ? 0 : split_window;
  return out;
}

size_t KvGeometry::bytes_per_block() const {
  return static_cast<size_t>(n_layers) * (slab_bytes(0) + slab_bytes(1));
}

size_t KvGeometry::blocks_for_tokens(size_t n) const {
  return (n + block_tokens - 1) / block_tokens;
}

size_t KvGeometry::first_needed(size_t pos) const {
  const auto window = static_cast<size_t>(window_tokens);
  return window > 0 && pos + 1 > window ? pos + 1 - window : 0;
}

size_t KvGeometry::blocks_for_sequence(size_t n, size_t chunk) const {
  if (split_window > 0) {
    return group(0).blocks_for_sequence(n, chunk) + group(1).blocks_for_sequence(n, chunk);
  }
  size_t blocks = blocks_for_tokens(n);
  if (window_tokens > 0) {
    // A step's queries read the window before its first token through its last: a run of
    // window - 1 + chunk positions, which straddles at most ceil((run - 1) / B) + 1 blocks.
    const size_t run = static_cast<size_t>(window_tokens) - 1 + std::max<size_t>(chunk, 1);
    blocks = std::min(blocks, (run - 1 + block_tokens - 1) / block_tokens + 1);
  }
  return blocks + open_key_blocks();
}

size_t KvGeometry::slab_offset(int layer, int kind) const {
  const size_t k_slab = slab_bytes(0);
  return static_cast<size_t>(layer) * (k_slab + slab_bytes(1)) + (kind == 0 ? 0 : k_slab);
}

KvRun KvGeometry::run(int layer, int kind, int kv_head) const {
  const size_t slab = slab_offset(layer, kind);
  const DType t = dtype(kind);
  if (grouping(kind) == KvGrouping::kChannel) {
    return KvRun{slab + static_cast<size_t>(kv_head) * kernels::channel_slab_bytes(t, head_dim), 0,
                 0};
  }
  if (grouping(kind) == KvGrouping::kToken) {
    const size_t element = static_cast<size_t>(kv_head) * head_dim;
    return KvRun{slab + element / kGroup * block_bytes(t), token_bytes(kind),
                 static_cast<int>(element % kGroup)};
  }
  const size_t head_row = row_bytes(t, head_dim);
  return KvRun{slab + static_cast<size_t>(kv_head) * head_row * block_tokens, head_row, 0};
}

size_t KvGeometry::offset(int layer, int kind, int kv_head, int token) const {
  const KvRun r = run(layer, kind, kv_head);
  return r.offset + static_cast<size_t>(token) * r.stride;
}

void KvGeometry::store_token(uint8_t* block, int layer, int kind, int slot,
                             const float* values) const {
  const DType t = dtype(kind);
  if (grouping(kind) == KvGrouping::kChannel) {
    fail("store_token: keys grouped per channel are stored a block at a time");
  }
  if (grouping(kind) == KvGrouping::kToken) {
    const size_t at = slab_offset(layer, kind) + static_cast<size_t>(slot) * token_bytes(kind);
    kernels::quantize(t, values, block + at, static_cast<size_t>(n_kv_heads) * head_dim);
    return;
  }
  for (int h = 0; h < n_kv_heads; ++h) {
    kernels::quantize(t, values + static_cast<size_t>(h) * head_dim,
                      block + offset(layer, kind, h, slot), head_dim);
  }
}

void KvGeometry::store_block_keys(uint8_t* block, int layer, const uint16_t* keys) const {
  const size_t head_keys = static_cast<size_t>(block_tokens) * head_dim;
  for (int h = 0; h < n_kv_heads; ++h) {
    kernels::quantize_channel_keys(k_dtype, keys + h * head_keys, head_dim,
                                   block + run(layer, 0, h).offset);
  }
}

size_t KvGeometry::open_layer_bytes() const {
  return static_cast<size_t>(n_kv_heads) * block_tokens * head_dim * sizeof(uint16_t);
}

size_t KvGeometry::open_key_blocks() const {
  if (!keys_by_channel()) return 0;
  const size_t per_block = bytes_per_block() / open_layer_bytes();
  return (static_cast<size_t>(n_layers) + per_block - 1) / per_block;
}

size_t KvGeometry::open_key_block_of(int layer) const {
  return static_cast<size_t>(layer) / (bytes_per_block() / open_layer_bytes());
}

size_t KvGeometry::open_key_offset(int layer) const {
  return static_cast<size_t>(layer) % (bytes_per_block() / open_layer_bytes()) * open_layer_bytes();
}

void KvGeometry::validate() const {
  if (n_layers <= 0) fail("KV geometry: layer count must be positive, got {}", n_layers);
  if (n_kv_heads <= 0) fail("KV geometry: KV head count must be positive, got {}", n_kv_heads);
  if (head_dim <= 0) fail("KV geometry: head dimension must be positive, got {}", head_dim);
  if (block_tokens <= 0 || block_tokens > 4096) {
    fail("KV geometry: block size must be 1..4096 tokens, got {}", block_tokens);
  }
  if (window_tokens < 0) fail("KV geometry: sliding window must be >= 0, got {}", window_tokens);
  if (split_window < 0 || (split_window > 0 && window_tokens > 0)) {
    fail("KV geometry: a split window ({}) must be >= 0 and comes without a window of every layer",
         split_window);
  }
  for (int kind = 0; kind < 2; ++kind) {
    const DType t = dtype(kind);
    const char* what = kind == 0 ? "keys" : "values";
    if (t != DType::F32 && t != DType::F16 && t != DType::Q8_0 && t != DType::Q4_0) {
      fail("KV geometry: the block pool stores {} as f32, f16, q8_0 or q4_0, not {}", what,
           dtype_name(t));
    }
    if (quantised(t) && kind == 0) {
      if (block_tokens != kernels::kChannelTokens) {
        fail(
            "KV geometry: keys stored as {} are grouped per channel across a block of {} tokens; "
            "the block size is {} (use --block-tokens {})",
            dtype_name(t), kernels::kChannelTokens, block_tokens, kernels::kChannelTokens);
      }
      if (head_dim % 8 != 0) {
        fail("KV geometry: keys stored as {} need a head dimension that is a multiple of 8, got {}",
             dtype_name(t), head_dim);
      }
      if (bytes_per_block() < open_layer_bytes()) {
        fail(
            "KV geometry: a block ({} bytes) cannot hold one layer's f16 keys of a block ({} "
            "bytes), which keys stored as {} are held in until the block is full",
            bytes_per_block(), open_layer_bytes(), dtype_name(t));
      }
      continue;
    }
    if (!quantised(t) || head_dim % kGroup == 0) continue;
    const int per_token = n_kv_heads * head_dim;
    if (kGroup % head_dim != 0 || per_token % kGroup != 0) {
      fail(
          "KV geometry: {} {} groups 32 values, either along one head (head dim a multiple of "
          "32) or across the KV heads of a token (head dim dividing 32, KV heads x head dim a "
          "multiple of 32); head dim {} with {} KV heads ({} values per token) fits neither; "
          "use f16 or f32",
          what, dtype_name(t), head_dim, n_kv_heads, per_token);
    }
  }
}

}  // namespace kvc::kv
