// AVX-512 quantised attention loops (kv_attention_lanes.h), sixteen values at a time.
#include <immintrin.h>

#include <algorithm>

#include "base/channel_keys.h"
#include "base/dtype.h"
#include "base/kv_attention_table.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

namespace kvc::kernels {
namespace {

#include "base/channel_codes_sse.h"
#include "base/simd_reduce.h"
#include "base/simd_reduce_avx512.h"
#include "base/simd_transpose.h"
#include "base/simd_transpose_avx512.h"
#include "base/transposed_scores.h"

// The 16-float vectors kv_attention_lanes.h is written over.
struct Lanes {
  using Vec = __m512;
  static constexpr size_t kWidth = 16;
  // Several queries' weighted sums: panels of kPanel vectors, kGroup queries at a time (their
  // outputs, the panel's values and a broadcast fill the registers).
  static constexpr int kPanel = 4, kGroup = 6;
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec set1(float x) { return _mm512_set1_ps(x); }
  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  static void transpose(Vec r[16], float* kt) { transpose16x16(r, kt); }
  static float hsum(Vec v) { return hsum512(v); }
  static void hsum8(const Vec v[8], float out[8]) { hsum512x8(v, out); }
  // q8_0: each sixteen bytes widened.
  static void run(const BlockQ8_0& b, int first, int count, Vec* out) {
    for (int e = 0; e < count; e += 16) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + first + e));
      out[e / 16] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
    }
  }
  // q4_0: elements 0..15 are the low nibbles, 16..31 the high, each less 8.
  static void run(const BlockQ4_0& b, int first, int count, Vec* out) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
    const __m128i mask = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    for (int e = 0; e < count; e += 16) {
      const __m128i nibbles = first + e < 16 ? bytes : _mm_srli_epi16(bytes, 4);
      const __m128i values = _mm_sub_epi8(_mm_and_si128(nibbles, mask), eight);
      out[e / 16] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(values));
    }
  }
  // Keys grouped per channel: a channel's 32 codes (q4_0: sixteen bytes, low nibbles first) as
  // two vectors of floats; eight queries at a time keep their sixteen sums in registers.
  static constexpr int kChannelQueries = 8;
  static void channel_codes(const uint8_t* codes, bool four, Vec out[2]) {
    __m128i low, high;
    channel_code_halves(codes, four, low, high);
    out[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(low));
    out[1] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(high));
  }
  // Rows of 8 values (heads of 8): the AVX2 loops, which every AVX-512 CPU runs.
  static const KvAttentionTable& narrower() { return *avx2_kv_attention(); }
};

#include "base/kv_attention_lanes.h"

}  // namespace

const KvAttentionTable* avx512_kv_attention() {
  return &kv_attention_table<Lanes>();
}

}  // namespace kvc::kernels

#pragma GCC pop_options
#else
namespace kvc::kernels {
const KvAttentionTable* avx512_kv_attention() {
  return nullptr;
}
}  // namespace kvc::kernels
#endif
