// The KV pool's size when the operator gives none.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kv/kv_geometry.h"

namespace kvc::engine {

// The most a default pool takes: a file may name a context of millions of tokens, and a pool
// sized by it would take more memory than the machine has.
inline constexpr uint64_t kMaxDefaultKvPoolBytes = uint64_t{2} << 30;

// Room for max_running sequences of context_length tokens (computed chunk tokens a step), at
// least one whole sequence, but never more than kMaxDefaultKvPoolBytes or half of this machine's
// memory, and never less than one block.
uint64_t default_kv_pool_bytes(const kv::KvGeometry& geometry, size_t context_length, size_t chunk,
                               int max_running);

}  // namespace kvc::engine
