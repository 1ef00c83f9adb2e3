#include "kv/block_table.h"

#include <utility>

namespace kvc::kv {

BlockTable::BlockTable(BlockTable&& other) noexcept
    : pool_(other.pool_), source_(other.source_), blocks_(std::move(other.blocks_)) {
  other.blocks_.clear();
}

BlockTable& BlockTable::operator=(BlockTable&& other) noexcept {
  if (this != &other) {
    clear();
    pool_ = other.pool_;
    source_ = other.source_;
    blocks_ = std::move(other.blocks_);
    other.blocks_.clear();
  }
  return *this;
}

bool BlockTable::reserve(size_t n_tokens) {
  const size_t need = pool_->geometry().blocks_for_tokens(n_tokens);
  const size_t before = blocks_.size();
  while (blocks_.size() < need) {
    auto id = source_->take_block();
    if (!id) {
      while (blocks_.size() > before) {
        pool_->release(blocks_.back());
        blocks_.pop_back();
      }
      return false;
    }
    blocks_.push_back(*id);
  }
  return true;
}

void BlockTable::append_shared(BlockId id) {
  pool_->retain(id);
  blocks_.push_back(id);
}

BlockTable BlockTable::fork() const {
  BlockTable copy(*pool_, source_);
  for (BlockId id : blocks_) copy.append_shared(id);
  return copy;
}

bool BlockTable::ensure_writable(size_t pos) {
  const size_t index = pos / block_tokens();
  if (index >= blocks_.size()) return true;
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
  for (BlockId id : blocks_) pool_->release(id);
  blocks_.clear();
}

}  // namespace kvc::kv
