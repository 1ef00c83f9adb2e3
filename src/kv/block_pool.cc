#include "kv/block_pool.h"

#include <cassert>
#include <cstring>

#include "base/error.h"

namespace kvc::kv {

BlockPool::BlockPool(const KvGeometry& geometry, size_t memory_bytes) : geometry_(geometry) {
  geometry_.validate();
  block_bytes_ = geometry_.bytes_per_block();
  const size_t block = block_bytes_;
  const size_t n = memory_bytes / block;
  if (n == 0) {
    fail("KV memory of {} bytes holds no block: one block of {} tokens takes {} bytes",
         memory_bytes, geometry_.block_tokens, block);
  }
  if (n > static_cast<size_t>(INT32_MAX)) fail("KV memory of {} bytes is too many blocks", n);
  arena_ = HugePageMemory(n * block);
  // Resident from the start, so that a short memory shows at startup, not mid-request.
  arena_.commit();
  states_.assign(n, BlockState::kFree);
  refs_.assign(n, 0);
  cacheable_.assign(n, 0);
  free_list_.reserve(n);
  // Lowest ids are handed out first, which keeps early blocks warm in cache.
  for (size_t i = n; i-- > 0;) free_list_.push_back(static_cast<BlockId>(i));
}

size_t BlockPool::check(BlockId id) const {
  if (id < 0 || static_cast<size_t>(id) >= states_.size()) {
    fail("block id {} is outside the pool of {} blocks", id, states_.size());
  }
  return static_cast<size_t>(id);
}

std::optional<BlockId> BlockPool::allocate() {
  if (free_list_.empty()) return std::nullopt;
  const BlockId id = free_list_.back();
  free_list_.pop_back();
  states_[id] = BlockState::kReferenced;
  refs_[id] = 1;
  cacheable_[id] = 0;
  ++referenced_;
  check_accounting();
  return id;
}

void BlockPool::retain(BlockId id) {
  const size_t i = check(id);
  if (states_[i] == BlockState::kFree) fail("retain of free block {}", id);
  if (states_[i] == BlockState::kCached) {
    states_[i] = BlockState::kReferenced;
    --cached_;
    ++referenced_;
    ++cached_transitions_;
  }
  ++refs_[i];
  check_accounting();
}

void BlockPool::release(BlockId id) {
  const size_t i = check(id);
  if (states_[i] != BlockState::kReferenced) fail("release of unreferenced block {}", id);
  if (--refs_[i] > 0) return;
  --referenced_;
  if (cacheable_[i]) {
    states_[i] = BlockState::kCached;
    ++cached_;
    ++cached_transitions_;
  } else {
    states_[i] = BlockState::kFree;
    free_list_.push_back(id);
  }
  check_accounting();
}

void BlockPool::set_cacheable(BlockId id, bool cacheable) {
  cacheable_[check(id)] = cacheable;
}

void BlockPool::free_cached(BlockId id) {
  const size_t i = check(id);
  if (states_[i] != BlockState::kCached) fail("free_cached of block {} that is not cached", id);
  states_[i] = BlockState::kFree;
  cacheable_[i] = 0;
  --cached_;
  free_list_.push_back(id);
  check_accounting();
}

void BlockPool::copy_tokens(BlockId src, BlockId dst, int n_tokens) {
  if (n_tokens < 0 || n_tokens > geometry_.block_tokens) {
    fail("copy_tokens: {} tokens do not fit a {}-token block", n_tokens, geometry_.block_tokens);
  }
  const uint8_t* from = data(src);
  uint8_t* to = data(dst);
  const KvGeometry& g = geometry_;
  // One contiguous run of n_tokens rows per slab (token grouping) or per head within it.
  for (int l = 0; l < g.n_layers; ++l) {
    for (int kind = 0; kind < 2; ++kind) {
      if (g.grouping(kind) == KvGrouping::kChannel) {
        // A block's keys grouped per channel exist only once it is full (before, they are in
        // its sequence's open-key blocks).
        if (n_tokens == g.block_tokens) {
          const size_t at = g.slab_offset(l, kind);
          std::memcpy(to + at, from + at, g.slab_bytes(kind));
        }
        continue;
      }
      if (g.grouping(kind) == KvGrouping::kToken) {
        const size_t at = g.slab_offset(l, kind);
        std::memcpy(to + at, from + at, g.token_bytes(kind) * n_tokens);
        continue;
      }
      for (int h = 0; h < g.n_kv_heads; ++h) {
        const KvRun r = g.run(l, kind, h);
        std::memcpy(to + r.offset, from + r.offset, r.stride * n_tokens);
      }
    }
  }
}

void BlockPool::check_accounting() const {
  assert(free_list_.size() + referenced_ + cached_ == states_.size());
}

PoolCounts BlockPool::counts() const {
  return PoolCounts{states_.size(), free_list_.size(), referenced_, cached_};
}

}  // namespace kvc::kv
