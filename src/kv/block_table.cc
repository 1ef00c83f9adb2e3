#include "kv/block_table.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "base/error.h"

namespace kvc::kv {

BlockTable::BlockTable(BlockTable&& other) noexcept
    : pool_(other.pool_),
      source_(other.source_),
      blocks_(std::move(other.blocks_)),
      first_held_(other.first_held_),
      open_keys_(std::move(other.open_keys_)) {
  other.blocks_.clear();
  other.first_held_ = 0;
  other.open_keys_.clear();
}

BlockTable& BlockTable::operator=(BlockTable&& other) noexcept {
  if (this != &other) {
    clear();
    pool_ = other.pool_;
    source_ = other.source_;
    blocks_ = std::move(other.blocks_);
    first_held_ = other.first_held_;
    open_keys_ = std::move(other.open_keys_);
    other.blocks_.clear();
    other.first_held_ = 0;
    other.open_keys_.clear();
  }
  return *this;
}

namespace {

// Takes blocks from source onto `into` until it has n; on failure returns those it took.
bool take_blocks(BlockPool& pool, BlockSource& source, std::vector<BlockId>& into, size_t n) {
  const size_t before = into.size();
  while (into.size() < n) {
    auto id = source.take_block();
    if (!id) {
      while (into.size() > before) {
        pool.release(into.back());
        into.pop_back();
      }
      return false;
    }
    into.push_back(*id);
  }
  return true;
}

}  // namespace

bool BlockTable::reserve(size_t n_tokens) {
  const KvGeometry& g = pool_->geometry();
  const size_t before = blocks_.size();
  if (!take_blocks(*pool_, *source_, blocks_, g.blocks_for_tokens(n_tokens))) return false;
  if (n_tokens > 0 && !take_blocks(*pool_, *source_, open_keys_, g.open_key_blocks())) {
    while (blocks_.size() > before) {
      pool_->release(blocks_.back());
      blocks_.pop_back();
    }
    return false;
  }
  return true;
}

uint16_t* BlockTable::open_keys(int layer) const {
  const KvGeometry& g = pool_->geometry();
  uint8_t* block = pool_->data(open_keys_.at(g.open_key_block_of(layer)));
  return reinterpret_cast<uint16_t*>(block + g.open_key_offset(layer));
}

void BlockTable::append_hole() {
  if (first_held_ != blocks_.size()) fail("a block table's holes come before its blocks");
  blocks_.push_back(kNoBlock);
  ++first_held_;
}

size_t BlockTable::release_before(size_t pos) {
  const size_t end = std::min(blocks_.size(), pos / block_tokens());
  const size_t released = end > first_held_ ? end - first_held_ : 0;
  for (; first_held_ < end; ++first_held_) {
    pool_->release(blocks_[first_held_]);
    blocks_[first_held_] = kNoBlock;
  }
  return released;
}

void BlockTable::truncate(size_t n_tokens) {
  const size_t keep = pool_->geometry().blocks_for_tokens(n_tokens);
  while (blocks_.size() > keep) {
    if (blocks_.size() > first_held_) pool_->release(blocks_.back());
    blocks_.pop_back();
  }
  first_held_ = std::min(first_held_, blocks_.size());
}

void BlockTable::append_shared(BlockId id) {
  pool_->retain(id);
  blocks_.push_back(id);
}

BlockTable BlockTable::fork() const {
  BlockTable copy(*pool_, source_);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    if (i < first_held_) {
      copy.append_hole();
    } else {
      copy.append_shared(blocks_[i]);
    }
  }
  if (!take_blocks(*pool_, *source_, copy.open_keys_, open_keys_.size())) {
    fail("fork: no KV block is free for the open keys of the copy");
  }
  for (size_t i = 0; i < open_keys_.size(); ++i) {
    std::memcpy(pool_->data(copy.open_keys_[i]), pool_->data(open_keys_[i]),
                pool_->geometry().bytes_per_block());
  }
  return copy;
}

bool BlockTable::ensure_writable(size_t pos) {
  const size_t index = pos / block_tokens();
  if (index >= blocks_.size()) return true;
  if (index < first_held_) fail("position {} lies in a block released behind the window", pos);
  const BlockId old = blocks_[index];
  if (pool_->ref_count(old) == 1 && !pool_->cacheable(old)) return true;
  const auto fresh = source_->take_block();
  if (!fresh) return false;
  pool_->copy_tokens(old, *fresh, slot_of(pos));
  blocks_[index] = *fresh;
  pool_->release(old);
  return true;
}

void BlockTable::clear() {
  for (size_t i = first_held_; i < blocks_.size(); ++i) pool_->release(blocks_[i]);
  for (BlockId id : open_keys_) pool_->release(id);
  blocks_.clear();
  first_held_ = 0;
  open_keys_.clear();
}

}  // namespace kvc::kv
