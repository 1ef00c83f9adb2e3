// AVX2 + FMA + F16C kernels. The target pragma confines these instructions to this file's
// own functions, so the rest of the program still runs on any x86-64 CPU.
#include <immintrin.h>

#include <algorithm>

#include "base/dtype.h"
#include "base/kernel_table.h"
#include "base/prefetch_lines.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace kvc::kernels {
namespace {

#include "base/multiply_add_burst.h"
#include "base/simd_reduce.h"
#include "base/simd_transpose.h"

inline __m256 load_bf16(const uint16_t* p) {
  __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

float dot_f32_avx2(const float* a, const float* b, size_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), acc3);
  }
  for (; i + 8 <= n; i += 8) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  }
  float sum = hsum256(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// dot_f16_f32_avx2 before its horizontal sum: the lanes whose hsum256 (then a scalar tail from
// element *tail on) is the dot.
inline __m256 dot_f16_f32_lanes(const uint16_t* a, const float* b, size_t n, size_t* tail) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 a0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    __m256 a1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i + 8)));
    acc0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(a1, _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) {
    __m256 a0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    acc0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(b + i), acc0);
  }
  *tail = i;
  return _mm256_add_ps(acc0, acc1);
}

float dot_f16_f32_avx2(const uint16_t* a, const float* b, size_t n) {
  size_t i = 0;
  float sum = hsum256(dot_f16_f32_lanes(a, b, n, &i));
  for (; i < n; ++i) sum += half(a[i]) * b[i];
  return sum;
}

void axpy_f32_avx2(float alpha, const float* x, float* y, size_t n) {
  const __m256 va = _mm256_set1_ps(alpha);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += alpha * x[i];
}

void axpy_f16_avx2(float alpha, const uint16_t* x, float* y, size_t n) {
  const __m256 va = _mm256_set1_ps(alpha);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 vx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, vx, _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += alpha * half(x[i]);
}

float dot_w_f32(const void* w, const void* x, size_t n) {
  return dot_f32_avx2(static_cast<const float*>(w), static_cast<const float*>(x), n);
}

float dot_w_f16(const void* w, const void* x, size_t n) {
  return dot_f16_f32_avx2(static_cast<const uint16_t*>(w), static_cast<const float*>(x), n);
}

float dot_w_bf16(const void* w, const void* x, size_t n) {
  const auto* a = static_cast<const uint16_t*>(w);
  const auto* b = static_cast<const float*>(x);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(load_bf16(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(load_bf16(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load_bf16(a + i), _mm256_loadu_ps(b + i), acc0);
  float sum = hsum256(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) sum += bf16_to_f32(a[i]) * b[i];
  return sum;
}

KVC_ATTENTION_LOOPS(dot_f32_avx2, dot_f16_f32_avx2, axpy_f32_avx2, axpy_f16_avx2)

// dot_f16_f32_avx2(a, b[j], n) for Q query rows b[j] against one f16 row a, converting a once:
// each query's lanes take the same fused multiply-adds in the same order (then the same scalar
// tail), so each result has the same bits as the single dot.
template <int Q>
void dots_f16_f32(const uint16_t* a, const float* const* b, size_t n, float* out) {
  __m256 acc0[Q], acc1[Q];
  for (int j = 0; j < Q; ++j) acc0[j] = acc1[j] = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    const __m256 a1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i + 8)));
    for (int j = 0; j < Q; ++j) {
      acc0[j] = _mm256_fmadd_ps(a0, _mm256_loadu_ps(b[j] + i), acc0[j]);
      acc1[j] = _mm256_fmadd_ps(a1, _mm256_loadu_ps(b[j] + i + 8), acc1[j]);
    }
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 a0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    for (int j = 0; j < Q; ++j) acc0[j] = _mm256_fmadd_ps(a0, _mm256_loadu_ps(b[j] + i), acc0[j]);
  }
  for (int j = 0; j < Q; ++j) {
    float sum = hsum256(_mm256_add_ps(acc0[j], acc1[j]));
    for (size_t e = i; e < n; ++e) sum += half(a[e]) * b[j][e];
    out[j] = sum;
  }
}

// Several queries against one key row at a time, in register tiles of four queries (on AVX2
// this beats scoring eight keys per query: the conversion of each key row is shared).
void scores_f16_queries(const float* const* q, size_t nq, const uint16_t* k, size_t n, size_t hd,
                        float scale, float* const* out, const uint16_t* ahead) {
  float dots[4];
  for (size_t t = 0; t < n; ++t) {
    const uint16_t* row = k + t * hd;
    prefetch_lines(ahead, t * hd * sizeof(uint16_t), (t + 1) * hd * sizeof(uint16_t));
    size_t j = 0;
    for (; j + 4 <= nq; j += 4) {
      dots_f16_f32<4>(row, q + j, hd, dots);
      for (int e = 0; e < 4; ++e) out[j + e][t] = dots[e] * scale;
    }
    for (; j < nq; ++j) {
      dots_f16_f32<1>(row, q + j, hd, dots);
      out[j][t] = dots[0] * scale;
    }
  }
}

#include "base/eight_float_lanes.h"

// The 8-float vectors attention_lanes.h is written over, with this file's single-row dot.
struct Lanes : EightFloatLanes {
  static Vec dot_f16(const uint16_t* a, const float* b, size_t n, size_t* tail) {
    return dot_f16_f32_lanes(a, b, n, tail);
  }
  static void hsum8(const Vec v[8], float out[8]) { hsum256x8(v, out); }
};

#include "base/attention_lanes.h"

// From four queries on, the keys transposed once for all of them (no horizontal sums left);
// two or three take the register tiles of scores_f16_queries, one its eight-key loop.
void scores_f16_queries_transposed(const float* const* q, size_t nq, const uint16_t* k, size_t n,
                                   size_t hd, float scale, float* const* out,
                                   const uint16_t* ahead) {
  if (nq >= 4 && hd % 8 == 0 && hd <= 256) {
    prefetch_lines(ahead, 0, n * hd * sizeof(uint16_t));
    scores_f16_transposed<Lanes>(q, nq, k, n, hd, scale, out);
    return;
  }
  // One query shares no conversion: eight keys at a time, their horizontal sums reduced
  // together, are 1.13x its register tile (two or three queries lose 8-18% that way).
  if (nq == 1) return scores_f16_by_eight<Lanes>(q[0], k, n, hd, scale, out[0], ahead);
  scores_f16_queries(q, nq, k, n, hd, scale, out, ahead);
}

// accumulate_f16_queries, one query alone in panels of eight vectors: eight chains of
// multiply-adds instead of the two a panel of two leaves it, each waiting on its last
// (measured 1.6x for a head of 64); the lanes' operations, and so the bits, are the same.
void accumulate_f16_queries_avx2(const float* const* p, size_t nq, const uint16_t* v, size_t n,
                                 size_t hd, float* const* out, const uint16_t* ahead) {
  if (nq == 1 && hd % 64 == 0)
    return accumulate_f16_queries<Lanes, 8, 1>(p, nq, v, n, hd, out, ahead);
  accumulate_f16_queries<Lanes, 2, 6>(p, nq, v, n, hd, out, ahead);
}

#include "base/softmax_exp.h"

// The largest of the 8 lanes (exact in any order).
inline float hmax256(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

struct ExpLanes {
  using Vec = __m256;
  static Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static Vec round(Vec a) {
    return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static Vec set1(float a) { return _mm256_set1_ps(a); }
  // As Scalar's x > limit ? x : limit, NaN included (max returns its second operand then).
  static Vec at_least(Vec x, float limit) { return _mm256_max_ps(x, set1(limit)); }
  static Vec scale(Vec y, Vec n) {
    return _mm256_castsi256_ps(
        _mm256_add_epi32(_mm256_castps_si256(y), _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23)));
  }
  static Vec zero_below(Vec v, Vec x, float limit) {
    return _mm256_blendv_ps(v, _mm256_setzero_ps(), _mm256_cmp_ps(x, set1(limit), _CMP_LT_OQ));
  }
  static Vec div(Vec a, Vec b) { return _mm256_div_ps(a, b); }
  static Vec min(Vec a, Vec b) { return _mm256_min_ps(a, b); }
  static Vec if_nonnegative(Vec g, Vec a, Vec b) {
    return _mm256_blendv_ps(b, a, _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_GE_OQ));
  }
};

// Eight lanes at a time, then the last n % 8 elements one by one with the same steps.
void silu_mul_avx2(float* gate, const float* up, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(gate + i, softmax_exp::silu_times<ExpLanes>(_mm256_loadu_ps(gate + i),
                                                                 _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) gate[i] = softmax_exp::silu_times<softmax_exp::Scalar>(gate[i], up[i]);
}

// Eight lanes of sums, then the last n % 8 elements one by one.
float softmax_exp_avx2(float* p, size_t n) {
  // Four running maxima, so that each waits on its own last; the maximum is the same in any
  // order (a zero's sign aside, which no difference from it sees).
  __m256 top[4];
  for (__m256& t : top) t = _mm256_set1_ps(p[0]);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int u = 0; u < 4; ++u) top[u] = _mm256_max_ps(_mm256_loadu_ps(p + i + 8 * u), top[u]);
  }
  for (; i + 8 <= n; i += 8) top[0] = _mm256_max_ps(_mm256_loadu_ps(p + i), top[0]);
  float max = hmax256(_mm256_max_ps(_mm256_max_ps(top[0], top[1]), _mm256_max_ps(top[2], top[3])));
  for (; i < n; ++i) max = std::max(max, p[i]);
  __m256 acc = _mm256_setzero_ps();
  const __m256 m = _mm256_set1_ps(max);
  size_t t = 0;
  for (; t + 8 <= n; t += 8) {
    const __m256 e = softmax_exp::exp<ExpLanes>(_mm256_sub_ps(_mm256_loadu_ps(p + t), m));
    _mm256_storeu_ps(p + t, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = hsum256(acc);
  for (; t < n; ++t) {
    p[t] = softmax_exp::exp<softmax_exp::Scalar>(p[t] - max);
    sum += p[t];
  }
  return sum;
}

// 32 int32 values (each in [-127, 127]) as 32 int8 in order.
inline __m256i pack_i8(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_packs_epi32(a, b);  // lanes: a0-3 b0-3 | a4-7 b4-7
  const __m256i cd = _mm256_packs_epi32(c, d);
  const __m256i all = _mm256_packs_epi16(ab, cd);  // a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 ...
  return _mm256_permutevar8x32_epi32(all, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// The sum of v's 64-bit lanes, unsigned (so that it wraps).
inline uint64_t sum_words(__m256i v) {
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), v);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

// Four independent sums of 256-bit loads keep several lines in flight.
uint64_t read_sum_avx2(const uint64_t* p, size_t n, bool request_ahead) {
  __m256i a[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                  _mm256_setzero_si256()};
  constexpr size_t kAhead = kRowStreamAheadBytes / sizeof(uint64_t);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    if (request_ahead && i + kAhead + 16 <= n) prefetch_lines<2>(p + i + kAhead, 0, 128);
    a[0] = _mm256_add_epi64(a[0], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 0)));
    a[1] = _mm256_add_epi64(a[1], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    a[2] = _mm256_add_epi64(a[2], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    a[3] = _mm256_add_epi64(a[3], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  uint64_t total =
      sum_words(_mm256_add_epi64(_mm256_add_epi64(a[0], a[1]), _mm256_add_epi64(a[2], a[3])));
  for (; i < n; ++i) total += p[i];
  return total;
}

// multiply_add_burst's steps: vpmaddubsw, 32 byte products summed in pairs into int16 lanes.
struct Int8Burst {
  using Vec = __m256i;
  static constexpr const char* kInstruction = "vpmaddubsw ymm";
  static constexpr uint64_t kMultiplyAdds = 32;
  static Vec start(uint64_t seed) { return _mm256_set1_epi64x(static_cast<long long>(seed)); }
  static Vec step(Vec acc, Vec operand) { return _mm256_maddubs_epi16(acc, operand); }
  static uint64_t fold(Vec acc) { return sum_words(acc); }
};

// vfmadd on 8 floats (acc * m + m, m from burst_multiplier).
struct F32Burst {
  using Vec = __m256;
  static constexpr const char* kInstruction = "vfmadd ymm";
  static constexpr uint64_t kMultiplyAdds = 8;
  static Vec start(uint64_t seed) { return _mm256_set1_ps(burst_multiplier(seed)); }
  static Vec step(Vec acc, Vec operand) { return _mm256_fmadd_ps(acc, operand, operand); }
  static uint64_t fold(Vec acc) { return sum_words(_mm256_castps_si256(acc)); }
};

}  // namespace

// The 32 values at x times scale, rounded to nearest even (the default rounding mode, as
// std::nearbyint) and packed as int8 in order.
inline __m256i round_32(const float* x, __m256 scale) {
  __m256i q[4];
  for (int k = 0; k < 4; ++k)
    q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), scale));
  return pack_i8(q[0], q[1], q[2], q[3]);
}

// As quantize_row's q8_0: the block's largest magnitude over 127 is its scale, and each value
// times the scale's reciprocal is rounded to nearest even (the default rounding mode, as
// std::nearbyint) with the same float operations.
void quantize_q8_0_avx2(const float* x, void* out, size_t n) {
  auto* b = static_cast<BlockQ8_0*>(out);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (size_t i = 0; i < n / 32; ++i) {
    const float* xi = x + i * 32;
    __m256 v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_ps(xi + 8 * k);
    const __m256 m01 = _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1]));
    const __m256 m23 = _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3]));
    const float d = hmax256(_mm256_max_ps(m01, m23)) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = f32_to_f16(d);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(b[i].qs), round_32(xi, _mm256_set1_ps(id)));
  }
}

// As quantize_row's q8_K: q8_0's operations over 256 values, the scale kept in f32; each 16
// values' sum from the packed bytes (biased to unsigned, summed by psadbw).
void quantize_q8_k_avx2(const float* x, void* out, size_t n) {
  auto* b = static_cast<BlockQ8_K*>(out);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (size_t i = 0; i < n / 256; ++i) {
    const float* xi = x + i * 256;
    // Four running maxima, so that the 32 vectors' comparisons are not one chain.
    __m256 m[4];
    for (int k = 0; k < 4; ++k) m[k] = _mm256_andnot_ps(sign, _mm256_loadu_ps(xi + 8 * k));
    for (int k = 4; k < 32; ++k) {
      m[k % 4] = _mm256_max_ps(m[k % 4], _mm256_andnot_ps(sign, _mm256_loadu_ps(xi + 8 * k)));
    }
    const float d =
        hmax256(_mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]))) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = d;
    __builtin_memset(b[i].padding, 0, sizeof b[i].padding);
    const __m256 scale = _mm256_set1_ps(id);
    for (int g = 0; g < 8; ++g) {
      const __m256i bytes = round_32(xi + 32 * g, scale);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(b[i].qs + 32 * g), bytes);
      // Four sums of eight (each byte plus 128), the two of each 16 added in lanes 0 and 2.
      const __m256i eights =
          _mm256_sad_epu8(_mm256_xor_si256(bytes, _mm256_set1_epi8(-128)), _mm256_setzero_si256());
      const __m256i sixteens = _mm256_add_epi64(eights, _mm256_srli_si256(eights, 8));
      b[i].bsums[2 * g] = static_cast<int16_t>(_mm256_extract_epi64(sixteens, 0) - 16 * 128);
      b[i].bsums[2 * g + 1] = static_cast<int16_t>(_mm256_extract_epi64(sixteens, 2) - 16 * 128);
    }
  }
}

// F16C rounds to nearest even as f32_to_f16 does; a NaN keeps f32_to_f16's own bits.
void to_f16_avx2(const float* x, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) {
      for (size_t e = i; e < i + 8; ++e) out[e] = f32_to_f16(x[e]);
      continue;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) out[i] = f32_to_f16(x[i]);
}

const KernelTable* avx2_kernels() {
  static const KernelTable table = {
      // The integer types have no single-row dot here: the GEMM's narrow column is it (their
      // sums run across eight weight rows at once in its tiles, in an order of their own).
      {dot_w_f32, dot_w_f16, dot_w_bf16},
      dot_f32_avx2,
      dot_f16_f32_avx2,
      axpy_f32_avx2,
      axpy_f16_avx2,
      scores_f32,
      scores_f16_eights<Lanes>,
      scores_f16_queries_transposed,
      accumulate_f32,
      accumulate_f16_panels<Lanes>,
      accumulate_f16_queries_avx2,
      quantize_q8_0_avx2,
      quantize_q8_k_avx2,
      to_f16_avx2,
      softmax_exp_avx2,
      silu_mul_avx2,
      read_sum_avx2,
      multiply_add_burst_of<Int8Burst, F32Burst>,
      multiply_add_instruction_of<Int8Burst, F32Burst>,
  };
  return &table;
}

}  // namespace kvc::kernels

#pragma GCC pop_options
#else
namespace kvc::kernels {
const KernelTable* avx2_kernels() {
  return nullptr;
}
}  // namespace kvc::kernels
#endif
