// Eight-float vectors for the attention loops (internal to base/): the AVX2 file's lanes, and
// the AVX-512 file's lanes for heads of a whole number of eight but not of sixteen values.
//
// Included by kernels_avx2.cc and kernels_avx512.cc inside their target pragma and anonymous
// namespace, after simd_transpose.h. It includes nothing itself.
#pragma once

// load, store, set1, fma, add and mul of eight floats, eight f16 values widened, and the
// transpose of eight rows of eight f16 values, as attention_lanes.h uses them.
struct EightFloatLanes {
  using Vec = __m256;
  static constexpr size_t kWidth = 8;
  static Vec load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  static Vec set1(float x) { return _mm256_set1_ps(x); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static Vec load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
  // kt[d * 8 + t] = row t's value d, for 8 rows of 8 f16 values (row t at k + t * stride).
  static void transpose_f16(const uint16_t* k, size_t stride, float* kt) {
    Vec r[8];
    for (int i = 0; i < 8; ++i) r[i] = load_f16(k + i * stride);
    transpose8x8(r, kt);
  }
};
