// Per-thread scratch for the GEMM kernels, compiled without any target pragma so that the
// vector's code runs on any x86-64.
#include <vector>

#include "base/aligned_buffer.h"
#include "base/gemm_table.h"

namespace kvc::kernels {

namespace {

uint8_t* grown(std::vector<uint8_t>& buffer, size_t bytes) {
  if (buffer.size() < line_aligned_size(bytes)) buffer.resize(line_aligned_size(bytes));
  return line_aligned(buffer.data());
}

}  // namespace

uint8_t* gemm_scratch(size_t bytes) {
  thread_local std::vector<uint8_t> buffer;
  return grown(buffer, bytes);
}

uint8_t* gemm_weight_scratch(size_t bytes) {
  thread_local std::vector<uint8_t> buffer;
  return grown(buffer, bytes);
}

}  // namespace kvc::kernels
