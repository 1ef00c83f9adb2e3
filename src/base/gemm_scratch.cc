// Per-thread scratch for the GEMM kernels, compiled without any target pragma so that the
// vector's code runs on any x86-64.
#include <vector>

#include "base/aligned_buffer.h"
#include "base/gemm_table.h"

namespace kvc::kernels {

uint8_t* gemm_scratch(size_t bytes) {
  thread_local std::vector<uint8_t> buffer;
  if (buffer.size() < line_aligned_size(bytes)) buffer.resize(line_aligned_size(bytes));
  return line_aligned(buffer.data());
}

}  // namespace kvc::kernels
