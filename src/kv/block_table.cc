#include "kv/block_table.h"

#include <utility>

namespace kvc::kv {

BlockTable::BlockTable(BlockTable&& other) noexcept
    : pool_(other.pool_), blocks_(std::move(other.blocks_)) {
  other.blocks_.clear();
}

BlockTable& BlockTable::operator=(BlockTable&& other) noexcept {
  if (this != &other) {
    clear();
    pool_ = other.pool_;
    blocks_ = std::move(other.blocks_);
    other.blocks_.clear();
  }
  return *this;
}

bool BlockTable::reserve(size_t n_tokens) {
  const size_t need = pool_->geometry().blocks_for_tokens(n_tokens);
  const size_t before = blocks_.size();
  while (blocks_.size() < need) {
    auto id = pool_->allocate();
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

void BlockTable::clear() {
  for (BlockId id : blocks_) pool_->release(id);
  blocks_.clear();
}

}  // namespace kvc::kv
