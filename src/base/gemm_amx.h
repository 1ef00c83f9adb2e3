// The q8_0 GEMM on AMX tiles (internal to base/): Intel's tile matrix multiply, where the
// CPU has AMX-INT8 and the kernel grants this process the tile state.
#pragma once

#include <cstddef>

namespace kvc::kernels {

// Whether the AMX q8_0 GEMM can run here: the CPU has AMX-TILE and AMX-INT8 and Linux granted
// the tile data state (asked once per process).
bool amx_available();

// Whether the AVX-512 q8_0 GEMM takes the AMX tiles: amx_available() and not turned off (by
// kernels::set_amx(false) or KVCACHE_AMX=0 in the environment).
bool amx_enabled();

// y[r * y_stride + c] = dot(w_c, x_r) for q8_0 weight rows w_c (n_w of them, a multiple of 16,
// w_stride bytes apart) and q8_0 activation rows x_r (n_x, a multiple of 16), rows of n values:
// the bits of the AVX-512 q8_0 kernels (gemm_avx512.cc's Q8Tile documents the order). Only where
// amx_available().
void gemm_q8_0_amx(const void* w, size_t w_stride, size_t n_w, const void* x, size_t x_stride,
                   size_t n_x, size_t n, float* y, size_t y_stride);

}  // namespace kvc::kernels
