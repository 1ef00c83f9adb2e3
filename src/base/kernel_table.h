// The per-instruction-set function table behind base/kernels.h (internal to base/).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvc::kernels {

using DotFn = float (*)(const void* w, const void* x, size_t n);

struct KernelTable {
  // Indexed by DType: one weight row against one prepared activation row.
  DotFn dot[5];
  float (*dot_f32)(const float* a, const float* b, size_t n);
  float (*dot_f16_f32)(const uint16_t* a, const float* b, size_t n);
  void (*axpy_f32)(float alpha, const float* x, float* y, size_t n);
  void (*axpy_f16)(float alpha, const uint16_t* x, float* y, size_t n);
};

const KernelTable& scalar_kernels();
// Null when the compiler cannot target the instruction set.
const KernelTable* avx2_kernels();
const KernelTable* avx512_kernels();

}  // namespace kvc::kernels
