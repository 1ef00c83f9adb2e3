// AVX2 + FMA + F16C quantised attention loops (kv_attention_lanes.h), eight values at a time.
// As in kernels_avx2.cc, the target pragma confines these instructions to this file's own
// functions.
#include <immintrin.h>

#include <algorithm>

#include "base/channel_keys.h"
#include "base/dtype.h"
#include "base/kv_attention_table.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace kvc::kernels {
namespace {

#include "base/channel_codes_sse.h"
#include "base/simd_reduce.h"
#include "base/simd_transpose.h"
#include "base/transposed_scores.h"

// The 8-float vectors kv_attention_lanes.h is written over.
struct Lanes {
  using Vec = __m256;
  static constexpr size_t kWidth = 8;
  // Several queries' weighted sums: panels of kPanel vectors, kGroup queries at a time (their
  // outputs, the panel's values and a broadcast fill the registers).
  static constexpr int kPanel = 2, kGroup = 6;
  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec set1(float x) { return _mm256_set1_ps(x); }
  static Vec load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
  static void transpose(Vec r[8], float* kt) { transpose8x8(r, kt); }
  static float hsum(Vec v) { return hsum256(v); }
  static void hsum8(const Vec v[8], float out[8]) { hsum256x8(v, out); }
  // q8_0: each eight bytes widened.
  static void run(const BlockQ8_0& b, int first, int count, Vec* out) {
    for (int e = 0; e < count; e += 8) {
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qs + first + e));
      out[e / 8] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
    }
  }
  // q4_0: the group's sixteen bytes become signed values once (low nibbles are elements
  // 0..15, high nibbles 16..31, each less 8), then eight are widened at a time.
  static void run(const BlockQ4_0& b, int first, int count, Vec* out) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
    const __m128i mask = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    const __m128i low = _mm_sub_epi8(_mm_and_si128(bytes, mask), eight);
    const __m128i high = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask), eight);
    for (int e = 0; e < count; e += 8) {
      const int at = first + e;
      const __m128i half = at < 16 ? low : high;
      const __m128i eight_bytes = (at & 15) == 0 ? half : _mm_srli_si128(half, 8);
      out[e / 8] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight_bytes));
    }
  }
  // Keys grouped per channel: a channel's 32 codes (q4_0: sixteen bytes, low nibbles first) as
  // four vectors of floats; two queries at a time keep their eight sums in registers.
  static constexpr int kChannelQueries = 2;
  static void channel_codes(const uint8_t* codes, bool four, Vec out[4]) {
    __m128i low, high;
    channel_code_halves(codes, four, low, high);
    out[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(low));
    out[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(low, 8)));
    out[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(high));
    out[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(high, 8)));
  }
  // Heads of fewer than 8 values (no full lane): the portable loops.
  static const KvAttentionTable& narrower() { return scalar_kv_attention(); }
};

#include "base/kv_attention_lanes.h"

}  // namespace

const KvAttentionTable* avx2_kv_attention() {
  return &kv_attention_table<Lanes>();
}

}  // namespace kvc::kernels

#pragma GCC pop_options
#else
namespace kvc::kernels {
const KvAttentionTable* avx2_kv_attention() {
  return nullptr;
}
}  // namespace kvc::kernels
#endif
