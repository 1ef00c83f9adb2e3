// Software prefetch of a byte range (internal to base/): for rows that a later call will read
// where the hardware prefetchers cannot foresee it (the next blocks of a paged KV cache lie
// anywhere in the pool).
#pragma once

#include <cstddef>

namespace kvc::kernels {

// Requests the cache lines holding bytes [begin, end) of base; nothing when base is null.
// kLocality as __builtin_prefetch takes it: 3 into every level, 2 into the second-level cache
// (prefetcht1 on x86), for more bytes than the first level holds.
template <int kLocality = 3>
inline void prefetch_lines(const void* base, size_t begin, size_t end) {
  if (base == nullptr) return;
  const auto* p = static_cast<const char*>(base);
  for (size_t at = begin & ~size_t{63}; at < end; at += 64)
    __builtin_prefetch(p + at, 0, kLocality);
}

}  // namespace kvc::kernels
