// Transposing a square of floats in registers (internal to base/): the AVX-512 16x16.
//
// Included by each *_avx512 file after simd_transpose.h, inside its anonymous namespace and
// under its AVX-512 target pragma. It includes nothing itself.
#pragma once

// kt[c * 16 + i] = r[i][c]: sixteen rows of sixteen floats stored as sixteen columns (kt
// aligned to 64 bytes); r is overwritten.
inline void transpose16x16(__m512 r[16], float* kt) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // r[4i + c], 128-bit lane L: rows 4i..4i+3 of column 4L + c.
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int c = 0; c < 4; ++c) {
    const __m512 even_a = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
    const __m512 even_b = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
    const __m512 odd_a = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xdd);
    const __m512 odd_b = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xdd);
    _mm512_store_ps(kt + c * 16, _mm512_shuffle_f32x4(even_a, even_b, 0x88));
    _mm512_store_ps(kt + (8 + c) * 16, _mm512_shuffle_f32x4(even_a, even_b, 0xdd));
    _mm512_store_ps(kt + (4 + c) * 16, _mm512_shuffle_f32x4(odd_a, odd_b, 0x88));
    _mm512_store_ps(kt + (12 + c) * 16, _mm512_shuffle_f32x4(odd_a, odd_b, 0xdd));
  }
}
