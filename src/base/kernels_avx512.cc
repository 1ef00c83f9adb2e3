// AVX-512 (F, BW, VL, DQ, VNNI) kernels. As in kernels_avx2.cc, the target pragma confines
// these instructions to this file's own functions.
#include <immintrin.h>

#include <algorithm>

#include "base/dtype.h"
#include "base/kernel_table.h"
#include "base/prefetch_lines.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")

namespace kvc::kernels {
namespace {

#include "base/multiply_add_burst.h"
#include "base/simd_reduce.h"
#include "base/simd_reduce_avx512.h"
#include "base/simd_transpose.h"
#include "base/simd_transpose_avx512.h"

inline __m512 load_f16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

inline __m512 load_bf16(const uint16_t* p) {
  __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

float dot_f32_avx512(const float* a, const float* b, size_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  __m512 acc2 = _mm512_setzero_ps(), acc3 = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
    acc2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), acc2);
    acc3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), acc3);
  }
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
  }
  if (i < n) {  // masked tail keeps short head dimensions (8, 64, 80) on the vector path
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    acc1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc1);
  }
  return hsum512(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

// dot_f16_f32_avx512 before its horizontal sum: the lanes whose hsum512 is the dot.
inline __m512 dot_f16_f32_lanes(const uint16_t* a, const float* b, size_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(load_f16(a + i), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(load_f16(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
  }
  for (; i + 16 <= n; i += 16)
    acc0 = _mm512_fmadd_ps(load_f16(a + i), _mm512_loadu_ps(b + i), acc0);
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 va = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, a + i));
    acc1 = _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, b + i), acc1);
  }
  return _mm512_add_ps(acc0, acc1);
}

float dot_f16_f32_avx512(const uint16_t* a, const float* b, size_t n) {
  return hsum512(dot_f16_f32_lanes(a, b, n));
}

void axpy_f32_avx512(float alpha, const float* x, float* y, size_t n) {
  const __m512 va = _mm512_set1_ps(alpha);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 r =
        _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i));
    _mm512_mask_storeu_ps(y + i, m, r);
  }
}

void axpy_f16_avx512(float alpha, const uint16_t* x, float* y, size_t n) {
  const __m512 va = _mm512_set1_ps(alpha);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, load_f16(x + i), _mm512_loadu_ps(y + i)));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 vx = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i));
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, vx, _mm512_maskz_loadu_ps(m, y + i)));
  }
}

float dot_w_f32(const void* w, const void* x, size_t n) {
  return dot_f32_avx512(static_cast<const float*>(w), static_cast<const float*>(x), n);
}

float dot_w_f16(const void* w, const void* x, size_t n) {
  return dot_f16_f32_avx512(static_cast<const uint16_t*>(w), static_cast<const float*>(x), n);
}

float dot_w_bf16(const void* w, const void* x, size_t n) {
  const auto* a = static_cast<const uint16_t*>(w);
  const auto* b = static_cast<const float*>(x);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(load_bf16(a + i), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(load_bf16(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
  }
  for (; i + 16 <= n; i += 16)
    acc0 = _mm512_fmadd_ps(load_bf16(a + i), _mm512_loadu_ps(b + i), acc0);
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, a + i));
    const __m512 va = _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
    acc1 = _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, b + i), acc1);
  }
  return hsum512(_mm512_add_ps(acc0, acc1));
}

KVC_ATTENTION_LOOPS(dot_f32_avx512, dot_f16_f32_avx512, axpy_f32_avx512, axpy_f16_avx512)

// The 16-float vectors attention_lanes.h is written over.
struct Lanes {
  using Vec = __m512;
  static constexpr size_t kWidth = 16;
  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static Vec set1(float x) { return _mm512_set1_ps(x); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec load_f16(const uint16_t* p) { return ::kvc::kernels::load_f16(p); }
  static Vec dot_f16(const uint16_t* a, const float* b, size_t n, size_t*) {
    return dot_f16_f32_lanes(a, b, n);  // no scalar tail: masked lanes take the rest
  }
  static void hsum8(const Vec v[8], float out[8]) { hsum512x8(v, out); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  // kt[d * 16 + t] = row t's value d, for 16 rows of 16 f16 values (row t at k + t * stride).
  static void transpose_f16(const uint16_t* k, size_t stride, float* kt) {
    Vec r[16];
    for (int i = 0; i < 16; ++i) r[i] = load_f16(k + i * stride);
    transpose16x16(r, kt);
  }
};

#include "base/attention_lanes.h"

#include "base/eight_float_lanes.h"

// Heads of a whole number of eight but not of sixteen values (stories260K's 8), where
// sixteen-float lanes would leave half of every vector empty, take eight-float lanes with the
// bits of the sixteen-lane loops (see scores_f16_queries and accumulate_f16_queries below).
using HalfLanes = EightFloatLanes;

#include "base/softmax_exp.h"

struct ExpLanes {
  using Vec = __m512;
  static Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec round(Vec a) {
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static Vec set1(float a) { return _mm512_set1_ps(a); }
  // As Scalar's x > limit ? x : limit, NaN included (max returns its second operand then).
  static Vec at_least(Vec x, float limit) { return _mm512_max_ps(x, set1(limit)); }
  static Vec scale(Vec y, Vec n) {
    return _mm512_castsi512_ps(
        _mm512_add_epi32(_mm512_castps_si512(y), _mm512_slli_epi32(_mm512_cvtps_epi32(n), 23)));
  }
  static Vec zero_below(Vec v, Vec x, float limit) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, set1(limit), _CMP_LT_OQ), v,
                                _mm512_setzero_ps());
  }
  static Vec div(Vec a, Vec b) { return _mm512_div_ps(a, b); }
  static Vec min(Vec a, Vec b) { return _mm512_min_ps(a, b); }
  static Vec if_nonnegative(Vec g, Vec a, Vec b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_GE_OQ), b, a);
  }
};

// Sixteen lanes at a time, the last n % 16 elements in masked lanes.
void silu_mul_avx512(float* gate, const float* up, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(gate + i, softmax_exp::silu_times<ExpLanes>(_mm512_loadu_ps(gate + i),
                                                                 _mm512_loadu_ps(up + i)));
  }
  if (i < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(gate + i, mask,
                          softmax_exp::silu_times<ExpLanes>(_mm512_maskz_loadu_ps(mask, gate + i),
                                                            _mm512_maskz_loadu_ps(mask, up + i)));
  }
}

// Sixteen lanes of sums, the last n % 16 elements in masked lanes.
float softmax_exp_avx512(float* p, size_t n) {
  __m512 top = _mm512_set1_ps(p[0]);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) top = _mm512_max_ps(_mm512_loadu_ps(p + i), top);
  if (i < n) {
    top = _mm512_mask_max_ps(
        top, static_cast<__mmask16>((1u << (n - i)) - 1),
        _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << (n - i)) - 1), p + i), top);
  }
  const float max = _mm512_reduce_max_ps(top);
  __m512 acc = _mm512_setzero_ps();
  const __m512 m = _mm512_set1_ps(max);
  size_t t = 0;
  for (; t + 16 <= n; t += 16) {
    const __m512 e = softmax_exp::exp<ExpLanes>(_mm512_sub_ps(_mm512_loadu_ps(p + t), m));
    _mm512_storeu_ps(p + t, e);
    acc = _mm512_add_ps(acc, e);
  }
  if (t < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - t)) - 1);
    const __m512 e =
        softmax_exp::exp<ExpLanes>(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, p + t), m));
    _mm512_mask_storeu_ps(p + t, mask, e);
    acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(mask, e));
  }
  return hsum512(acc);
}

// Several queries against the same keys: from four queries on, the keys transposed once for
// all of them; fewer queries take eight keys at a time each (the shared horizontal sums gain
// more than sharing each key row's conversion). A head of 8 is transposed eight keys at a time:
// its single-row dot has its eight products in the low lanes and zeros above, so the sixteen-
// lane sum folds to the eight-lane one, whose order the eight-float transposed loop keeps.
void scores_f16_queries(const float* const* q, size_t nq, const uint16_t* k, size_t n, size_t hd,
                        float scale, float* const* out, const uint16_t* ahead) {
  if (nq >= 4) prefetch_lines(ahead, 0, n * hd * sizeof(uint16_t));
  if (nq >= 4 && hd % 16 == 0 && hd <= 256) {
    scores_f16_transposed<Lanes>(q, nq, k, n, hd, scale, out);
    return;
  }
  if (nq >= 4 && hd == 8) {
    scores_f16_transposed<HalfLanes>(q, nq, k, n, hd, scale, out);
    return;
  }
  for (size_t j = 0; j < nq; ++j) {
    scores_f16_by_eight<Lanes>(q[j], k, n, hd, scale, out[j], j == 0 && nq < 4 ? ahead : nullptr);
  }
}

// Several queries' weighted sums over the same value rows. Every lane takes one fused
// multiply-add per row, whatever the vector width, so a head of a whole number of eight but not
// of sixteen values takes eight-float panels with the bits of sixteen-float ones.
void accumulate_f16_queries_avx512(const float* const* p, size_t nq, const uint16_t* v, size_t n,
                                   size_t hd, float* const* out, const uint16_t* ahead) {
  if (hd % 16 != 0 && hd % 8 == 0) {
    accumulate_f16_queries<HalfLanes, 1, 8>(p, nq, v, n, hd, out, ahead);
    return;
  }
  accumulate_f16_queries<Lanes, 4, 6>(p, nq, v, n, hd, out, ahead);
}

// The sum of v's 64-bit lanes as unsigned words, so that it wraps (_mm512_reduce_add_epi64 adds
// signed ones, whose wrap is undefined).
inline uint64_t sum_words(__m512i v) {
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, v);
  uint64_t total = 0;
  for (uint64_t w : lanes) total += w;
  return total;
}

// Four independent sums of 512-bit loads keep several lines in flight.
uint64_t read_sum_avx512(const uint64_t* p, size_t n, bool request_ahead) {
  __m512i a[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                  _mm512_setzero_si512()};
  constexpr size_t kAhead = kRowStreamAheadBytes / sizeof(uint64_t);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    if (request_ahead && i + kAhead + 32 <= n) prefetch_lines<2>(p + i + kAhead, 0, 256);
    a[0] = _mm512_add_epi64(a[0], _mm512_loadu_si512(p + i + 0));
    a[1] = _mm512_add_epi64(a[1], _mm512_loadu_si512(p + i + 8));
    a[2] = _mm512_add_epi64(a[2], _mm512_loadu_si512(p + i + 16));
    a[3] = _mm512_add_epi64(a[3], _mm512_loadu_si512(p + i + 24));
  }
  uint64_t total =
      sum_words(_mm512_add_epi64(_mm512_add_epi64(a[0], a[1]), _mm512_add_epi64(a[2], a[3])));
  for (; i < n; ++i) total += p[i];
  return total;
}

// multiply_add_burst's steps: vpdpbusd, 64 byte products summed into 16 int32 lanes.
struct Int8Burst {
  using Vec = __m512i;
  static constexpr const char* kInstruction = "vpdpbusd zmm";
  static constexpr uint64_t kMultiplyAdds = 64;
  static Vec start(uint64_t seed) { return _mm512_set1_epi64(static_cast<long long>(seed)); }
  static Vec step(Vec acc, Vec operand) { return _mm512_dpbusd_epi32(acc, operand, operand); }
  static uint64_t fold(Vec acc) { return sum_words(acc); }
};

// vfmadd on 16 floats (acc * m + m, m from burst_multiplier).
struct F32Burst {
  using Vec = __m512;
  static constexpr const char* kInstruction = "vfmadd zmm";
  static constexpr uint64_t kMultiplyAdds = 16;
  static Vec start(uint64_t seed) { return _mm512_set1_ps(burst_multiplier(seed)); }
  static Vec step(Vec acc, Vec operand) { return _mm512_fmadd_ps(acc, operand, operand); }
  static uint64_t fold(Vec acc) { return sum_words(_mm512_castps_si512(acc)); }
};

}  // namespace

const KernelTable* avx512_kernels() {
  static const KernelTable table = {
      // The unpacked types have no single-row dot here: their one-by-one GEMM tile is it.
      // q8_0 has no single-row dot here: the GEMM's narrow column is it (its blocks' sums meet
      // 16 at a time in the order of its tiles and AMX's).
      {dot_w_f32, dot_w_f16, dot_w_bf16},
      dot_f32_avx512,
      dot_f16_f32_avx512,
      axpy_f32_avx512,
      axpy_f16_avx512,
      scores_f32,
      scores_f16_eights<Lanes>,
      scores_f16_queries,
      accumulate_f32,
      accumulate_f16_panels<Lanes>,
      accumulate_f16_queries_avx512,
      quantize_q8_0_avx2,
      quantize_q8_k_avx2,
      to_f16_avx2,
      softmax_exp_avx512,
      silu_mul_avx512,
      read_sum_avx512,
      multiply_add_burst_of<Int8Burst, F32Burst>,
      multiply_add_instruction_of<Int8Burst, F32Burst>,
  };
  return &table;
}

}  // namespace kvc::kernels

#pragma GCC pop_options
#else
namespace kvc::kernels {
const KernelTable* avx512_kernels() {
  return nullptr;
}
}  // namespace kvc::kernels
#endif
