// Blocks, hashes and an identity for the tier tests (disk, Redis, codec).
#pragma once

#include <cstdint>
#include <vector>

#include "kv/tier_block.h"

namespace kvc::kv::tier_fixtures {

// A small layout: 2 layers, 2 KV heads of 4 dims, 4-token blocks, f32.
inline TierIdentity identity() {
  TierIdentity id;
  id.model_fingerprint.fill(7);
  id.geometry.n_layers = 2;
  id.geometry.n_kv_heads = 2;
  id.geometry.head_dim = 4;
  id.geometry.block_tokens = 4;
  id.geometry.k_dtype = id.geometry.v_dtype = DType::F32;
  return id;
}

inline Hash256 hash_of(int i) {
  Hash256 h{};
  h[0] = static_cast<uint8_t>(i);
  h[1] = static_cast<uint8_t>(i >> 8);
  h[31] = 0xab;
  return h;
}

inline Hash256 ns_of(int i) {
  Hash256 h{};
  h.fill(static_cast<uint8_t>(i));
  return h;
}

// A block's bytes, different for each seed.
inline std::vector<uint8_t> payload(int seed) {
  std::vector<uint8_t> p(identity().geometry.bytes_per_block());
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(seed * 31 + i * 7);
  return p;
}

}  // namespace kvc::kv::tier_fixtures
