// A heap buffer with a fixed alignment, for SIMD kernels and the KV arena.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

namespace kvc {

template <typename T>
class AlignedBuffer {
 public:
  static constexpr size_t kAlignment = 64;

  AlignedBuffer() = default;
  // Allocates n zero-filled elements; throws std::bad_alloc when memory is short.
  explicit AlignedBuffer(size_t n) { resize(n); }

  // Replaces the contents with n zero-filled elements.
  void resize(size_t n) {
    size_ = n;
    if (n == 0) {
      data_.reset();
      return;
    }
    const size_t bytes = (n * sizeof(T) + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, bytes);
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    data_.reset(static_cast<T*>(p));
  }

  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  size_t size() const { return size_; }
  T& operator[](size_t i) { return data_.get()[i]; }
  const T& operator[](size_t i) const { return data_.get()[i]; }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data_;
  size_t size_ = 0;
};

// Bytes a growable buffer needs beyond `bytes` so that line_aligned(its data) holds them.
inline size_t line_aligned_size(size_t bytes) {
  return bytes + AlignedBuffer<uint8_t>::kAlignment - 1;
}

// The first address at or after p on a cache line (AlignedBuffer's alignment), where a vector's
// wide loads never span two lines.
inline uint8_t* line_aligned(uint8_t* p) {
  constexpr uintptr_t kLine = AlignedBuffer<uint8_t>::kAlignment;
  return p + ((kLine - reinterpret_cast<uintptr_t>(p) % kLine) % kLine);
}

}  // namespace kvc
