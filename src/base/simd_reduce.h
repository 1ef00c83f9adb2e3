// The horizontal sum and f16 conversion every x86 kernel file reduces with (internal to base/).
//
// Included by each kernels_*, gemm_* and kv_attention_* file after its target pragma, inside
// an anonymous namespace, like gemm_tiles.h: one definition of the lane order that exactness
// depends on (a single-row dot, a GEMM tile and attention all sum 8 lanes in this order), each
// compiled for its file's instruction set. It includes nothing itself.
#pragma once

// The 8 lanes of v summed as (lo + hi) folded twice: the fixed order of every 256-bit reduction.
inline float hsum256(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

inline float half(uint16_t h) {
  return _cvtsh_ss(h);
}
