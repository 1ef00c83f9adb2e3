// Where a block table takes fresh blocks from: the pool's free list, or a policy that evicts
// cached blocks first when the free list is empty (the prefix index's LRU, the KV cache
// manager's tiers of reclaim). The pool itself never calls back up into a policy.
//
// Thread-safety: as the object that implements it (none of kv/ is thread-safe).
#pragma once

#include <optional>

#include "kv/block_id.h"

namespace kvc::kv {

class BlockSource {
 public:
  virtual ~BlockSource() = default;
  // A block with reference count 1, or nullopt when none can be had.
  virtual std::optional<BlockId> take_block() = 0;
};

}  // namespace kvc::kv
