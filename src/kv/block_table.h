// One sequence's view of the pool: the ordered blocks that hold its tokens' keys and values.
// Where keys are grouped per channel (KvGeometry::keys_by_channel), the table also holds
// open-key blocks: the f16 keys of its last, partly filled block, every layer, until that block
// is full and its keys are quantised into it.
//
// Thread-safety: none; a table belongs to one sequence, used under its owner's lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kv/block_pool.h"

namespace kvc::kv {

class BlockTable {
 public:
  // A table of pool's blocks taking fresh ones from source (default: the pool's free list);
  // both must outlive it.
  explicit BlockTable(BlockPool& pool, BlockSource* source = nullptr)
      : pool_(&pool), source_(source != nullptr ? source : &pool) {}
  ~BlockTable() { clear(); }
  BlockTable(const BlockTable&) = delete;
  BlockTable& operator=(const BlockTable&) = delete;
  BlockTable(BlockTable&& other) noexcept;
  BlockTable& operator=(BlockTable&& other) noexcept;

  // Ensures capacity for n tokens, allocating blocks as needed (and the open-key blocks, where
  // keys are grouped per channel); false (with nothing allocated) when the pool runs out.
  bool reserve(size_t n_tokens);
  // Drops every block reference; the table becomes empty.
  void clear();
  // Appends a block another holder has (a cache hit), taking a reference to it.
  void append_shared(BlockId id);
  // Appends a block this table already holds the one reference to (fresh from allocate()).
  void append_owned(BlockId id) { blocks_.push_back(id); }
  // A second table sharing every block of this one (n > 1 samples from one prompt), with a
  // copy of its open keys; throws Error when no block is left for that copy.
  BlockTable fork() const;
  // Makes the block holding position pos private before a write: a block that is shared or
  // indexed by the prefix cache is copied (its first pos % block_tokens slots) into a fresh
  // block. Returns false when no block can be allocated for the copy.
  bool ensure_writable(size_t pos);

  size_t capacity_tokens() const { return blocks_.size() * block_tokens(); }
  int block_tokens() const { return pool_->geometry().block_tokens; }
  const std::vector<BlockId>& blocks() const { return blocks_; }
  // The open-key blocks (empty unless keys are grouped per channel and capacity is reserved).
  const std::vector<BlockId>& open_key_blocks() const { return open_keys_; }
  // Layer's f16 keys of the last block, [kv_head][slot][head_dim]; reserve() first.
  uint16_t* open_keys(int layer) const;
  BlockPool& pool() const { return *pool_; }
  BlockSource& source() const { return *source_; }

  // The block holding token position pos and the token's slot inside it.
  BlockId block_of(size_t pos) const { return blocks_[pos / block_tokens()]; }
  int slot_of(size_t pos) const { return static_cast<int>(pos % block_tokens()); }

 private:
  BlockPool* pool_;
  BlockSource* source_;
  std::vector<BlockId> blocks_;
  std::vector<BlockId> open_keys_;
};

}  // namespace kvc::kv
