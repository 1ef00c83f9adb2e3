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

// hsum256 of eight vectors at once: the same additions of the same lanes (fold 128, then lanes
// 0+2 and 1+3, then 0+1), so each sum has hsum256's bits.
inline void hsum256x8(const __m256 v[8], float out[8]) {
  __m256 p[4];
  for (int i = 0; i < 4; ++i) {  // p[i] = [v[2i] folded to 4 lanes | v[2i+1] folded]
    p[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20),
                         _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
  }
  // r[i]: 128-bit lane 0 holds v[4i] and v[4i+2] folded to 2 lanes, lane 1 v[4i+1], v[4i+3].
  __m256 r[2];
  for (int i = 0; i < 2; ++i) {
    r[i] = _mm256_add_ps(_mm256_shuffle_ps(p[2 * i], p[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(p[2 * i], p[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // Lane 0: v[0], v[2], v[4], v[6]; lane 1: v[1], v[3], v[5], v[7].
  const __m256 f = _mm256_add_ps(_mm256_shuffle_ps(r[0], r[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm256_shuffle_ps(r[0], r[1], _MM_SHUFFLE(3, 1, 3, 1)));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, f);
  for (int k = 0; k < 4; ++k) {
    out[2 * k] = lanes[k];
    out[2 * k + 1] = lanes[4 + k];
  }
}

// hsum256 of each of N vectors (a GEMM tile's outputs), eight at a time through hsum256x8 where
// there are three or more: the same bits, a fraction of the shuffles.
template <int N>
inline void hsums(const __m256 (&v)[N], float (&out)[N]) {
  if constexpr (N < 3) {
    for (int i = 0; i < N; ++i) out[i] = hsum256(v[i]);
  } else {
    for (int base = 0; base < N; base += 8) {
      __m256 group[8];
      float sums[8];
      for (int i = 0; i < 8; ++i) group[i] = base + i < N ? v[base + i] : _mm256_setzero_ps();
      hsum256x8(group, sums);
      for (int i = 0; i < 8 && base + i < N; ++i) out[base + i] = sums[i];
    }
  }
}

inline float half(uint16_t h) {
  return _cvtsh_ss(h);
}
