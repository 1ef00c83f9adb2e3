// Per-thread scratch for the GEMM kernels, compiled without any target pragma so that the
// vector's code runs on any x86-64.
#include <vector>

#include "base/gemm_table.h"

namespace kvc::kernels {

uint8_t* gemm_scratch(size_t bytes, int slot) {
  thread_local std::vector<uint8_t> buffers[2];
  std::vector<uint8_t>& buffer = buffers[slot];
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

}  // namespace kvc::kernels
