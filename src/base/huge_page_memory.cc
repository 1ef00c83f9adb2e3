#include "base/huge_page_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <new>
#include <utility>

namespace kvc {

HugePageMemory::HugePageMemory(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  // A huge page of slack lets the data start on a huge-page boundary wherever the mapping lands.
  mapping_bytes_ = bytes + kHugePageBytes;
  void* p =
      mmap(nullptr, mapping_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  mapping_ = p;
  const auto start = reinterpret_cast<uintptr_t>(p);
  data_ =
      reinterpret_cast<uint8_t*>((start + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes);
  // Advice only: a kernel without transparent huge pages refuses it and keeps plain pages.
  madvise(data_, bytes, MADV_HUGEPAGE);
}

HugePageMemory::~HugePageMemory() {
  release();
}

HugePageMemory::HugePageMemory(HugePageMemory&& other) noexcept
    : mapping_(std::exchange(other.mapping_, nullptr)),
      mapping_bytes_(std::exchange(other.mapping_bytes_, 0)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

HugePageMemory& HugePageMemory::operator=(HugePageMemory&& other) noexcept {
  if (this != &other) {
    release();
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapping_bytes_ = std::exchange(other.mapping_bytes_, 0);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void HugePageMemory::commit() {
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  volatile uint8_t* bytes = data_;
  for (size_t i = 0; i < size_; i += page) bytes[i] = 0;
}

void HugePageMemory::release() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_bytes_);
  mapping_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

}  // namespace kvc
