#include "kv/kv_geometry.h"

#include "base/error.h"

namespace kvc::kv {

size_t KvGeometry::bytes_per_token() const {
  return static_cast<size_t>(n_layers) * 2 * n_kv_heads * row_bytes(dtype, head_dim);
}

size_t KvGeometry::bytes_per_block() const {
  return bytes_per_token() * block_tokens;
}

size_t KvGeometry::blocks_for_tokens(size_t n) const {
  return (n + block_tokens - 1) / block_tokens;
}

size_t KvGeometry::offset(int layer, int kind, int kv_head, int token) const {
  const size_t head_row = row_bytes(dtype, head_dim);
  const size_t per_head = head_row * block_tokens;
  return ((static_cast<size_t>(layer) * 2 + kind) * n_kv_heads + kv_head) * per_head +
         static_cast<size_t>(token) * head_row;
}

void KvGeometry::validate() const {
  if (n_layers <= 0) fail("KV geometry: layer count must be positive, got {}", n_layers);
  if (n_kv_heads <= 0) fail("KV geometry: KV head count must be positive, got {}", n_kv_heads);
  if (head_dim <= 0) fail("KV geometry: head dimension must be positive, got {}", head_dim);
  if (block_tokens <= 0 || block_tokens > 4096) {
    fail("KV geometry: block size must be 1..4096 tokens, got {}", block_tokens);
  }
  if (dtype != DType::F32 && dtype != DType::F16) {
    fail("KV geometry: the block pool stores f32 or f16 keys and values, not {}",
         dtype_name(dtype));
  }
}

}  // namespace kvc::kv
