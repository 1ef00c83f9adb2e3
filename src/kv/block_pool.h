// The KV block pool: one preallocated arena cut into fixed-size blocks, with reference counts.
//
// A block is free (on the free list), referenced (held by one or more sequences) or cached
// (unreferenced but kept for reuse; the prefix index owns that state). Allocation and release
// are O(1), and free + cached + referenced == total after every call.
//
// Thread-safety: none; its owner (the KV cache manager) serialises every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "base/huge_page_memory.h"
#include "kv/block_id.h"
#include "kv/block_source.h"
#include "kv/kv_geometry.h"

namespace kvc::kv {

enum class BlockState : uint8_t { kFree, kReferenced, kCached };

struct PoolCounts {
  size_t total = 0;
  size_t free = 0;
  size_t referenced = 0;
  size_t cached = 0;
};

class BlockPool : public BlockSource {
 public:
  // Carves memory_bytes into whole blocks of geometry.bytes_per_block(); throws Error when the
  // geometry is invalid or not even one block fits.
  BlockPool(const KvGeometry& geometry, size_t memory_bytes);

  const KvGeometry& geometry() const { return geometry_; }
  size_t num_blocks() const { return states_.size(); }
  // Bytes actually allocated for blocks (num_blocks * bytes_per_block).
  size_t arena_bytes() const { return arena_.size(); }

  // Takes a free block with reference count 1; nullopt when the free list is empty (the pool
  // never evicts: a BlockSource above it decides what to evict).
  std::optional<BlockId> allocate();
  std::optional<BlockId> take_block() override { return allocate(); }
  // Adds a reference to a referenced or cached block (a cached block becomes referenced).
  void retain(BlockId id);
  // Drops a reference; at zero the block becomes cached if marked cacheable, else free.
  void release(BlockId id);
  // Marks whether a block is kept (cached) rather than freed when its last reference goes.
  void set_cacheable(BlockId id, bool cacheable);
  // Returns a cached block to the free list (eviction); it must have no references.
  void free_cached(BlockId id);

  BlockState state(BlockId id) const { return states_.at(check(id)); }
  bool cacheable(BlockId id) const { return cacheable_.at(check(id)) != 0; }
  // Copies the keys and values of the first n_tokens token slots of src into dst.
  void copy_tokens(BlockId src, BlockId dst, int n_tokens);
  uint32_t ref_count(BlockId id) const { return refs_.at(check(id)); }
  uint8_t* data(BlockId id) { return arena_.data() + check(id) * block_bytes_; }
  const uint8_t* data(BlockId id) const { return arena_.data() + check(id) * block_bytes_; }

  PoolCounts counts() const;
  // How many times a block has gone from cached to referenced or back: what a count of the
  // cached blocks a lookup will reference depends on besides the index's own changes.
  uint64_t cached_transitions() const { return cached_transitions_; }

 private:
  size_t check(BlockId id) const;
  // Debug builds verify free + cached + referenced == total after every state change.
  void check_accounting() const;

  KvGeometry geometry_;
  size_t block_bytes_ = 0;  // geometry_.bytes_per_block(), read on every block access
  HugePageMemory arena_;    // attention streams it like the weights
  std::vector<BlockState> states_;
  std::vector<uint32_t> refs_;
  std::vector<uint8_t> cacheable_;
  std::vector<BlockId> free_list_;
  size_t referenced_ = 0;
  size_t cached_ = 0;
  uint64_t cached_transitions_ = 0;
};

}  // namespace kvc::kv
