// The AVX-512 horizontal sums (internal to base/), in the lane order of simd_reduce.h's hsum256.
//
// Included by each *_avx512 file after simd_reduce.h, inside its anonymous namespace and under
// its AVX-512 target pragma. It includes nothing itself.
#pragma once

// Horizontal sum in a fixed order (GCC 12's _mm512_reduce_add_ps trips -Wuninitialized).
inline float hsum512(__m512 v) {
  return hsum256(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

// hsum512 of eight vectors at once: the same additions of the same lanes (fold 256, fold 128,
// then lanes 0+2 and 1+3, then 0+1), so each sum has hsum512's bits.
inline void hsum512x8(const __m512 v[8], float out[8]) {
  __m512 p[4];
  for (int i = 0; i < 4; ++i) {  // p[i] = [v[2i] folded to 8 lanes | v[2i+1] folded]
    const __m512 lo = _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 hi = _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2));
    p[i] = _mm512_add_ps(lo, hi);
  }
  __m512 q[2];
  for (int i = 0; i < 2; ++i) {  // q[i]: v[4i..4i+3] folded to 4 lanes, one per 128-bit lane
    const __m512 lo = _mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512 hi = _mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1));
    q[i] = _mm512_add_ps(lo, hi);
  }
  // 128-bit lane k: v[k] and v[k + 4] folded to 2 lanes each, then to 1.
  const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(q[0], q[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(q[0], q[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 f = _mm512_add_ps(_mm512_shuffle_ps(r, r, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(r, r, _MM_SHUFFLE(3, 1, 3, 1)));
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, f);
  for (int k = 0; k < 4; ++k) {
    out[k] = lanes[4 * k];
    out[k + 4] = lanes[4 * k + 1];
  }
}

// hsum512 of each of N vectors (a GEMM tile's outputs), eight at a time through hsum512x8 where
// there are three or more: the same bits, a fraction of the shuffles.
template <int N>
inline void hsums(const __m512 (&v)[N], float (&out)[N]) {
  if constexpr (N < 3) {
    for (int i = 0; i < N; ++i) out[i] = hsum512(v[i]);
  } else {
    for (int base = 0; base < N; base += 8) {
      __m512 group[8];
      float sums[8];
      for (int i = 0; i < 8; ++i) group[i] = base + i < N ? v[base + i] : _mm512_setzero_ps();
      hsum512x8(group, sums);
      for (int i = 0; i < 8 && base + i < N; ++i) out[base + i] = sums[i];
    }
  }
}
