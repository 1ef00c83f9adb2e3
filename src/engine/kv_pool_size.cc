#include "engine/kv_pool_size.h"

#include <unistd.h>

#include <algorithm>

namespace kvc::engine {

uint64_t default_kv_pool_bytes(const kv::KvGeometry& geometry, size_t context_length, size_t chunk,
                               int max_running) {
  const uint64_t block = geometry.bytes_per_block();
  const uint64_t context = geometry.blocks_for_sequence(context_length, chunk) * block;
  const uint64_t wanted = std::max(
      context, std::min<uint64_t>(context * static_cast<uint64_t>(std::max(max_running, 1)),
                                  kMaxDefaultKvPoolBytes));
  uint64_t cap = kMaxDefaultKvPoolBytes;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) {
    cap = std::min(cap, static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 2);
  }
  return std::max(std::min(wanted, cap / block * block), block);
}

}  // namespace kvc::engine
