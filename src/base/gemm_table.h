// The per-instruction-set GEMM micro-kernels behind kernels::gemm (internal to base/).
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"

namespace kvc::kernels {

// y[r * y_stride + c] = dot(w_c, x_r) for r < n_x, c < n_w, where w_c = w + c * w_stride and
// x_r = x + r * x_stride bytes; each value is bit-identical to the table's single-row dot.
using GemmFn = void (*)(const void* w, size_t w_stride, size_t n_w, const void* x, size_t x_stride,
                        size_t n_x, size_t n, float* y, size_t y_stride);

struct GemmTable {
  // Indexed by DType.
  GemmFn gemm[kDTypeCount];
};

// The calling thread's scratch buffer of at least `bytes`, kept between calls, where a kernel
// lays out its activation rows once per call; it starts on a cache line.
uint8_t* gemm_scratch(size_t bytes);
// A second such buffer, for a kernel that also lays out weight rows.
uint8_t* gemm_weight_scratch(size_t bytes);

// Null when the compiler cannot target the instruction set.
const GemmTable* avx2_gemm();
const GemmTable* avx512_gemm();

}  // namespace kvc::kernels
