// Transposing a square of floats in registers (internal to base/): the AVX2 8x8.
//
// Included by each AVX2-or-wider file inside its anonymous namespace and target pragma, like
// simd_reduce.h. It includes nothing itself.
#pragma once

// kt[c * 8 + i] = r[i][c]: eight rows of eight floats stored as eight columns (kt aligned to
// 32 bytes); r is overwritten.
inline void transpose8x8(__m256 r[8], float* kt) {
  __m256 t[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // r[4i + c], 128-bit lane L: rows 4i..4i+3 of column 4L + c.
  for (int i = 0; i < 2; ++i) {
    r[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int c = 0; c < 4; ++c) {
    _mm256_store_ps(kt + c * 8, _mm256_permute2f128_ps(r[c], r[4 + c], 0x20));
    _mm256_store_ps(kt + (4 + c) * 8, _mm256_permute2f128_ps(r[c], r[4 + c], 0x31));
  }
}
