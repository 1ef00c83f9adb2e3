// AVX-512 quantised attention loops, sixteen values at a time; rows whose runs are not a
// multiple of 16 values (heads of 8) take the AVX2 loops, which every AVX-512 CPU runs.
#include <immintrin.h>

#include <algorithm>

#include "base/dtype.h"
#include "base/kv_attention_table.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

namespace kvc::kernels {
namespace {

#include "base/simd_reduce.h"
#include "base/simd_reduce_avx512.h"

// Sixteen values of a group from element e (0 or 16), as floats.
inline __m512 lanes(const BlockQ8_0& b, int e) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + e));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
}

inline __m512 lanes(const BlockQ4_0& b, int e) {
  __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
  if (e >= 16) bytes = _mm_srli_epi16(bytes, 4);  // elements 16..31 are the high nibbles
  bytes = _mm_and_si128(bytes, _mm_set1_epi8(0x0f));
  const __m512i v = _mm512_sub_epi32(_mm512_cvtepu8_epi32(bytes), _mm512_set1_epi32(8));
  return _mm512_cvtepi32_ps(v);
}

// One key row's 16 lanes of q . k, before the horizontal sum: per group, the lanes of q times
// the group's values, then times the group's scale.
template <class Block>
inline __m512 score_lanes(const Block* b, const float* q, size_t groups, int run, int first) {
  __m512 acc = _mm512_setzero_ps();
  for (size_t g = 0; g < groups; ++g) {
    __m512 sum = _mm512_setzero_ps();
    for (int e = 0; e < run; e += 16) {
      sum = _mm512_fmadd_ps(lanes(b[g], first + e), _mm512_loadu_ps(q + g * 32 + e), sum);
    }
    acc = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(b[g].d)), sum, acc);
  }
  return acc;
}

template <class Block>
void scores(const float* q, const uint8_t* base, size_t stride, int first, size_t n, size_t hd,
            float scale, float* out) {
  if (hd % 16 != 0) {
    const KvAttentionTable& t = *avx2_kv_attention();
    scores_for<Block>(t)(q, base, stride, first, n, hd, scale, out);
    return;
  }
  const size_t groups = hd >= 32 ? hd / 32 : 1;
  const int run = hd >= 32 ? 32 : static_cast<int>(hd);
  const auto row = [&](size_t t) { return reinterpret_cast<const Block*>(base + t * stride); };
  size_t t = 0;
  // Eight keys share one folded horizontal sum (the same bits as each summed alone).
  for (; t + 8 <= n; t += 8) {
    __m512 acc[8];
    for (int k = 0; k < 8; ++k) acc[k] = score_lanes(row(t + k), q, groups, run, first);
    float sums[8];
    hsum512x8(acc, sums);
    for (int k = 0; k < 8; ++k) out[t + k] = sums[k] * scale;
  }
  for (; t < n; ++t) out[t] = hsum512(score_lanes(row(t), q, groups, run, first)) * scale;
}

// out's values of G whole groups (32 values each, from group g0) kept in registers over all n
// rows: the same multiply-adds in the same order as updating out in memory row by row.
template <class Block, int G>
void accumulate_groups(const float* p, const uint8_t* base, size_t stride, size_t n, size_t g0,
                       float* out) {
  __m512 o[2 * G];
  for (int i = 0; i < 2 * G; ++i) o[i] = _mm512_loadu_ps(out + g0 * 32 + i * 16);
  for (size_t t = 0; t < n; ++t) {
    const auto* b = reinterpret_cast<const Block*>(base + t * stride) + g0;
    for (int g = 0; g < G; ++g) {
      const __m512 a = _mm512_set1_ps(p[t] * _cvtsh_ss(b[g].d));
      o[2 * g] = _mm512_fmadd_ps(a, lanes(b[g], 0), o[2 * g]);
      o[2 * g + 1] = _mm512_fmadd_ps(a, lanes(b[g], 16), o[2 * g + 1]);
    }
  }
  for (int i = 0; i < 2 * G; ++i) _mm512_storeu_ps(out + g0 * 32 + i * 16, o[i]);
}

template <class Block>
void accumulate(const float* p, const uint8_t* base, size_t stride, int first, size_t n, size_t hd,
                float* out) {
  if (hd % 16 != 0) {
    const KvAttentionTable& t = *avx2_kv_attention();
    accumulate_for<Block>(t)(p, base, stride, first, n, hd, out);
    return;
  }
  if (hd >= 32) {
    // Up to four groups (eight registers) at a time.
    const size_t groups = hd / 32;
    size_t g = 0;
    for (; g + 4 <= groups; g += 4) accumulate_groups<Block, 4>(p, base, stride, n, g, out);
    for (; g + 2 <= groups; g += 2) accumulate_groups<Block, 2>(p, base, stride, n, g, out);
    for (; g < groups; ++g) accumulate_groups<Block, 1>(p, base, stride, n, g, out);
    return;
  }
  __m512 o = _mm512_loadu_ps(out);  // a head of 16 values, half of a group
  for (size_t t = 0; t < n; ++t) {
    const auto* b = reinterpret_cast<const Block*>(base + t * stride);
    o = _mm512_fmadd_ps(_mm512_set1_ps(p[t] * _cvtsh_ss(b->d)), lanes(*b, first), o);
  }
  _mm512_storeu_ps(out, o);
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
    for (int e = 0; e < run; e += 16) _mm512_store_ps(values + g * run + e, lanes(b[g], first + e));
  }
}

// score_lanes over a converted row: the same multiply-adds of the same values.
inline __m512 score_converted(const float* values, const float* d, const float* q, size_t groups,
                              int run) {
  __m512 acc = _mm512_setzero_ps();
  for (size_t g = 0; g < groups; ++g) {
    __m512 sum = _mm512_setzero_ps();
    for (int e = 0; e < run; e += 16) {
      sum = _mm512_fmadd_ps(_mm512_load_ps(values + g * run + e), _mm512_loadu_ps(q + g * 32 + e),
                            sum);
    }
    acc = _mm512_fmadd_ps(_mm512_set1_ps(d[g]), sum, acc);
  }
  return acc;
}

template <class Block>
void scores_queries(const float* const* q, size_t nq, const uint8_t* base, size_t stride, int first,
                    size_t n, size_t hd, float scale, float* const* out) {
  if (hd % 16 != 0) {
    scores_queries_for<Block> (*avx2_kv_attention())(q, nq, base, stride, first, n, hd, scale, out);
    return;
  }
  if (nq == 1 || hd > kMaxConvertedRow) {
    scores_each<Block>(*avx512_kv_attention(), q, nq, base, stride, first, n, hd, scale, out);
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
      __m512 acc[8];
      for (int k = 0; k < 8; ++k) {
        acc[k] = score_converted(values + k * hd, d + k * groups, q[j], groups, run);
      }
      float sums[8];
      hsum512x8(acc, sums);
      for (int k = 0; k < 8; ++k) out[j][t + k] = sums[k] * scale;
    }
  }
  for (; t < n; ++t) {
    convert_row(row(t), groups, run, first, values, d);
    for (size_t j = 0; j < nq; ++j) {
      out[j][t] = hsum512(score_converted(values, d, q[j], groups, run)) * scale;
    }
  }
}

template <class Block>
void accumulate_queries(const float* const* p, size_t nq, const uint8_t* base, size_t stride,
                        int first, size_t n, size_t hd, float* const* out) {
  if (hd % 16 != 0) {
    accumulate_queries_for<Block> (*avx2_kv_attention())(p, nq, base, stride, first, n, hd, out);
    return;
  }
  if (nq == 1 || hd > kMaxConvertedRow) {
    accumulate_each<Block>(*avx512_kv_attention(), p, nq, base, stride, first, n, hd, out);
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
        for (int e = 0; e < run; e += 16) {
          float* o = out[j] + g * 32 + e;
          __m512 sum = _mm512_loadu_ps(o);
          for (size_t k = 0; k < m; ++k) {
            const __m512 a = _mm512_set1_ps(p[j][t0 + k] * d[k * groups + g]);
            sum = _mm512_fmadd_ps(a, _mm512_load_ps(values + k * hd + g * run + e), sum);
          }
          _mm512_storeu_ps(o, sum);
        }
      }
    }
  }
}

}  // namespace

const KvAttentionTable* avx512_kv_attention() {
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
const KvAttentionTable* avx512_kv_attention() {
  return nullptr;
}
}  // namespace kvc::kernels
#endif
