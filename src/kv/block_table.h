// One sequence's view of the pool: the ordered blocks that hold its tokens' keys and values.
// Where keys are grouped per channel (KvGeometry::keys_by_channel), the table also holds
// open-key blocks: the f16 keys of its last, partly filled block, every layer, until that block
// is full and its keys are quantised into it.
// Under a sliding window (KvGeometry::window_tokens) the table releases the blocks wholly behind
// the window as it moves: its first first_held() entries are then holes (kNoBlock) that keep the
// positions of the blocks after them.
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
  // The entry of a released block (a hole before the window).
  static constexpr BlockId kNoBlock = -1;

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
  // Appends a hole (a block the window no longer needs); only before any block is held.
  void append_hole();
  // Keeps the blocks that hold the first n_tokens positions and releases the rest.
  void truncate(size_t n_tokens);
  // Releases the blocks wholly before token position pos; returns how many it released.
  size_t release_before(size_t pos);
  // A second table sharing every block of this one (n > 1 samples from one prompt), with a
  // copy of its open keys; throws Error when no block is left for that copy.
  BlockTable fork() const;
  // Makes the block holding position pos private before a write: a block that is shared or
  // indexed by the prefix cache is copied (its first pos % block_tokens slots) into a fresh
  // block. Returns false when no block can be allocated for the copy.
  bool ensure_writable(size_t pos);

  size_t capacity_tokens() const { return blocks_.size() * block_tokens(); }
  int block_tokens() const { return pool_->geometry().block_tokens; }
  // Every entry, holes (kNoBlock) first.
  const std::vector<BlockId>& blocks() const { return blocks_; }
  // Entries before this one are holes.
  size_t first_held() const { return first_held_; }
  // Blocks the table holds a reference to (its holes and open-key blocks not counted).
  size_t held_blocks() const { return blocks_.size() - first_held_; }
  // The open-key blocks (empty unless keys are grouped per channel and capacity is reserved).
  const std::vector<BlockId>& open_key_blocks() const { return open_keys_; }
  // Layer's f16 keys of the last block, [kv_head][slot][head_dim]; reserve() first.
  uint16_t* open_keys(int layer) const;
  BlockPool& pool() const { return *pool_; }
  BlockSource& source() const { return *source_; }

  // The block holding token position pos (kNoBlock for a hole) and the token's slot inside it.
  BlockId block_of(size_t pos) const { return blocks_[pos / block_tokens()]; }
  int slot_of(size_t pos) const { return static_cast<int>(pos % block_tokens()); }

 private:
  BlockPool* pool_;
  BlockSource* source_;
  std::vector<BlockId> blocks_;
  size_t first_held_ = 0;
  std::vector<BlockId> open_keys_;
};

}  // namespace kvc::kv
