// AVX2 + FMA + F16C quantised attention loops, eight values at a time. As in kernels_avx2.cc,
// the target pragma confines these instructions to this file's own functions.
#include <immintrin.h>

#include <algorithm>

#include "base/dtype.h"
#include "base/kv_attention_table.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace kvc::kernels {
namespace {

#include "base/simd_reduce.h"

// Eight values of a group from element e (a multiple of 8), as floats.
inline __m256 lanes(const BlockQ8_0& b, int e) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qs + e));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
}

// The values of a run of `count` (8, 16, 24 or 32) from element `first` of a group, eight
// per vector, as floats: q8_0 widens each eight bytes; q4_0 turns the group's sixteen bytes
// into signed values once (low nibbles, then high) and widens eight of them at a time.
inline void run_lanes(const BlockQ8_0& b, int first, int count, __m256* out) {
  for (int e = 0; e < count; e += 8) out[e / 8] = lanes(b, first + e);
}

inline void run_lanes(const BlockQ4_0& b, int first, int count, __m256* out) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
  const __m128i mask = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
  const __m128i low = _mm_sub_epi8(_mm_and_si128(bytes, mask), eight);
  const __m128i high = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask), eight);
  for (int e = 0; e < count; e += 8) {
    const int at = first + e;  // elements 0..15 are the low nibbles, 16..31 the high
    const __m128i half = at < 16 ? low : high;
    const __m128i eight_bytes = (at & 15) == 0 ? half : _mm_srli_si128(half, 8);
    out[e / 8] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight_bytes));
  }
}

// One key row's 8 lanes of q . k, before the horizontal sum: per group, the lanes of q times
// the group's values, then times the group's scale.
template <class Block>
inline __m256 score_lanes(const Block* b, const float* q, size_t groups, int run, int first) {
  __m256 acc = _mm256_setzero_ps();
  for (size_t g = 0; g < groups; ++g) {
    __m256 values[4];
    run_lanes(b[g], first, run, values);
    __m256 sum = _mm256_setzero_ps();
    for (int e = 0; e < run; e += 8) {
      sum = _mm256_fmadd_ps(values[e / 8], _mm256_loadu_ps(q + g * 32 + e), sum);
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(b[g].d)), sum, acc);
  }
  return acc;
}

template <class Block>
void scores(const float* q, const uint8_t* base, size_t stride, int first, size_t n, size_t hd,
            float scale, float* out) {
  if (hd % 8 != 0) {  // heads of fewer than 8 values: no full lane
    const auto& s = scalar_kv_attention();
    scores_for<Block>(s)(q, base, stride, first, n, hd, scale, out);
    return;
  }
  const size_t groups = hd >= 32 ? hd / 32 : 1;
  const int run = hd >= 32 ? 32 : static_cast<int>(hd);
  const auto row = [&](size_t t) { return reinterpret_cast<const Block*>(base + t * stride); };
  size_t t = 0;
  // Eight keys share one folded horizontal sum (the same bits as each summed alone).
  for (; t + 8 <= n; t += 8) {
    __m256 acc[8];
    for (int k = 0; k < 8; ++k) acc[k] = score_lanes(row(t + k), q, groups, run, first);
    float sums[8];
    hsum256x8(acc, sums);
    for (int k = 0; k < 8; ++k) out[t + k] = sums[k] * scale;
  }
  for (; t < n; ++t) out[t] = hsum256(score_lanes(row(t), q, groups, run, first)) * scale;
}

// out's values of G whole groups (32 values each, from group g0) kept in registers over all n
// rows: the same multiply-adds in the same order as updating out in memory row by row.
template <class Block, int G>
void accumulate_groups(const float* p, const uint8_t* base, size_t stride, size_t n, size_t g0,
                       float* out) {
  __m256 o[4 * G];
  for (int i = 0; i < 4 * G; ++i) o[i] = _mm256_loadu_ps(out + g0 * 32 + i * 8);
  for (size_t t = 0; t < n; ++t) {
    const auto* b = reinterpret_cast<const Block*>(base + t * stride) + g0;
    for (int g = 0; g < G; ++g) {
      const __m256 a = _mm256_set1_ps(p[t] * _cvtsh_ss(b[g].d));
      __m256 values[4];
      run_lanes(b[g], 0, 32, values);
      for (int e = 0; e < 4; ++e) o[4 * g + e] = _mm256_fmadd_ps(a, values[e], o[4 * g + e]);
    }
  }
  for (int i = 0; i < 4 * G; ++i) _mm256_storeu_ps(out + g0 * 32 + i * 8, o[i]);
}

template <class Block>
void accumulate(const float* p, const uint8_t* base, size_t stride, int first, size_t n, size_t hd,
                float* out) {
  if (hd % 8 != 0) {
    const auto& s = scalar_kv_attention();
    accumulate_for<Block>(s)(p, base, stride, first, n, hd, out);
    return;
  }
  if (hd >= 32) {
    // Up to two groups (eight registers) at a time.
    const size_t groups = hd / 32;
    size_t g = 0;
    for (; g + 2 <= groups; g += 2) accumulate_groups<Block, 2>(p, base, stride, n, g, out);
    for (; g < groups; ++g) accumulate_groups<Block, 1>(p, base, stride, n, g, out);
    return;
  }
  for (size_t t = 0; t < n; ++t) {  // a head of 8, 16 or 24 values inside one group
    const auto* b = reinterpret_cast<const Block*>(base + t * stride);
    const __m256 a = _mm256_set1_ps(p[t] * _cvtsh_ss(b->d));
    __m256 v[4];
    run_lanes(*b, first, static_cast<int>(hd), v);
    for (int e = 0; e < static_cast<int>(hd); e += 8) {
      float* o = out + e;
      _mm256_storeu_ps(o, _mm256_fmadd_ps(a, v[e / 8], _mm256_loadu_ps(o)));
    }
  }
}

// Rows whose values are converted once for several queries hold at most this many values.
constexpr size_t kMaxConvertedRow = 256;

// A row's values as floats (group after group, `run` values each, from element `first`) and
// each group's scale: what score_lanes and accumulate convert, kept for several queries.
template <class Block>
inline void convert_row(const Block* b, size_t groups, int run, int first, float* values,
                        float* d) {
  for (size_t g = 0; g < groups; ++g) {
    d[g] = _cvtsh_ss(b[g].d);
    __m256 v[4];
    run_lanes(b[g], first, run, v);
    for (int e = 0; e < run; e += 8) _mm256_store_ps(values + g * run + e, v[e / 8]);
  }
}

// score_lanes over a converted row: the same multiply-adds of the same values.
inline __m256 score_converted(const float* values, const float* d, const float* q, size_t groups,
                              int run) {
  __m256 acc = _mm256_setzero_ps();
  for (size_t g = 0; g < groups; ++g) {
    __m256 sum = _mm256_setzero_ps();
    for (int e = 0; e < run; e += 8) {
      sum = _mm256_fmadd_ps(_mm256_load_ps(values + g * run + e), _mm256_loadu_ps(q + g * 32 + e),
                            sum);
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d[g]), sum, acc);
  }
  return acc;
}

template <class Block>
void scores_queries(const float* const* q, size_t nq, const uint8_t* base, size_t stride, int first,
                    size_t n, size_t hd, float scale, float* const* out) {
  if (hd % 8 != 0) {
    scores_queries_for<Block>(scalar_kv_attention())(q, nq, base, stride, first, n, hd, scale, out);
    return;
  }
  if (nq == 1 || hd > kMaxConvertedRow) {
    scores_each<Block>(*avx2_kv_attention(), q, nq, base, stride, first, n, hd, scale, out);
    return;
  }
  const size_t groups = hd >= 32 ? hd / 32 : 1;
  const int run = hd >= 32 ? 32 : static_cast<int>(hd);
  const auto row = [&](size_t t) { return reinterpret_cast<const Block*>(base + t * stride); };
  alignas(64) float values[8 * kMaxConvertedRow];
  float d[8 * kMaxConvertedRow / 32];
  size_t t = 0;
  // Eight keys converted once, then scored for every query, their sums folded together.
  for (; t + 8 <= n; t += 8) {
    for (int k = 0; k < 8; ++k) {
      convert_row(row(t + k), groups, run, first, values + k * hd, d + k * groups);
    }
    for (size_t j = 0; j < nq; ++j) {
      __m256 acc[8];
      for (int k = 0; k < 8; ++k) {
        acc[k] = score_converted(values + k * hd, d + k * groups, q[j], groups, run);
      }
      float sums[8];
      hsum256x8(acc, sums);
      for (int k = 0; k < 8; ++k) out[j][t + k] = sums[k] * scale;
    }
  }
  for (; t < n; ++t) {
    convert_row(row(t), groups, run, first, values, d);
    for (size_t j = 0; j < nq; ++j) {
      out[j][t] = hsum256(score_converted(values, d, q[j], groups, run)) * scale;
    }
  }
}

template <class Block>
void accumulate_queries(const float* const* p, size_t nq, const uint8_t* base, size_t stride,
                        int first, size_t n, size_t hd, float* const* out) {
  if (hd % 8 != 0) {
    accumulate_queries_for<Block>(scalar_kv_attention())(p, nq, base, stride, first, n, hd, out);
    return;
  }
  if (nq == 1 || hd > kMaxConvertedRow) {
    accumulate_each<Block>(*avx2_kv_attention(), p, nq, base, stride, first, n, hd, out);
    return;
  }
  const size_t groups = hd >= 32 ? hd / 32 : 1;
  const int run = hd >= 32 ? 32 : static_cast<int>(hd);
  alignas(64) float values[8 * kMaxConvertedRow];
  float d[8 * kMaxConvertedRow / 32];
  // Up to eight rows converted once; each query's sums then take them in row order, as
  // accumulate does row by row.
  for (size_t t0 = 0; t0 < n; t0 += 8) {
    const size_t m = std::min<size_t>(8, n - t0);
    for (size_t k = 0; k < m; ++k) {
      const auto* b = reinterpret_cast<const Block*>(base + (t0 + k) * stride);
      convert_row(b, groups, run, first, values + k * hd, d + k * groups);
    }
    for (size_t j = 0; j < nq; ++j) {
      for (size_t g = 0; g < groups; ++g) {
        for (int e = 0; e < run; e += 8) {
          float* o = out[j] + g * 32 + e;
          __m256 sum = _mm256_loadu_ps(o);
          for (size_t k = 0; k < m; ++k) {
            const __m256 a = _mm256_set1_ps(p[j][t0 + k] * d[k * groups + g]);
            sum = _mm256_fmadd_ps(a, _mm256_load_ps(values + k * hd + g * run + e), sum);
          }
          _mm256_storeu_ps(o, sum);
        }
      }
    }
  }
}

}  // namespace

const KvAttentionTable* avx2_kv_attention() {
  static const KvAttentionTable table{scores<BlockQ8_0>,
                                      scores<BlockQ4_0>,
                                      accumulate<BlockQ8_0>,
                                      accumulate<BlockQ4_0>,
                                      scores_queries<BlockQ8_0>,
                                      scores_queries<BlockQ4_0>,
                                      accumulate_queries<BlockQ8_0>,
                                      accumulate_queries<BlockQ4_0>};
  return &table;
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
