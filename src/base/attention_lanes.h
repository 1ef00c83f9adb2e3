// Attention's blocked loops, written once over an instruction set's vectors (internal to base/).
//
// Included by kernels_avx2.cc and kernels_avx512.cc after their attention loops, inside their
// target pragma and anonymous namespace, like simd_reduce.h, and instantiated over each one's
// Lanes: a vector type Vec of kWidth floats with load, store, set1, fma and load_f16; dot_f16,
// the lanes of its single-row f16 dot before the horizontal sum (and where its scalar tail
// starts); and hsum8, eight such sums reduced together in hsum's own lane order. Each loop
// keeps the bits of the row-at-a-time loop it replaces. It includes only transposed_scores.h,
// written under the same rules.
#pragma once

#include "base/transposed_scores.h"

// accumulate_f16 with out held in registers across the n rows, a panel of up to eight vectors
// at a time: each lane takes the same fused multiply-adds in row order, so the bits are those
// of the row-by-row loop, without a load and a store of out per row.
template <class Lanes>
void accumulate_f16_panels(const float* p, const uint16_t* v, size_t n, size_t hd, float* out) {
  constexpr size_t kWidth = Lanes::kWidth;
  if (hd % kWidth != 0) {
    accumulate_f16(p, v, n, hd, out);
    return;
  }
  for (size_t c0 = 0; c0 < hd; c0 += 8 * kWidth) {
    const size_t chunks = std::min<size_t>(8, (hd - c0) / kWidth);
    typename Lanes::Vec o[8];
    for (size_t c = 0; c < chunks; ++c) o[c] = Lanes::load(out + c0 + kWidth * c);
    for (size_t t = 0; t < n; ++t) {
      const typename Lanes::Vec a = Lanes::set1(p[t]);
      const uint16_t* row = v + t * hd + c0;
      for (size_t c = 0; c < chunks; ++c) {
        o[c] = Lanes::fma(a, Lanes::load_f16(row + kWidth * c), o[c]);
      }
    }
    for (size_t c = 0; c < chunks; ++c) Lanes::store(out + c0 + kWidth * c, o[c]);
  }
}

// accumulate_f16 for G queries over the same rows, panel of kPanel vectors starting at c0: each
// row's conversion serves them all while their outputs stay in registers. The same panel of row
// t at ahead (unless null) is requested as row t is read.
template <class Lanes, int kPanel, int G>
void accumulate_f16_group(const float* const* p, const uint16_t* v, size_t n, size_t hd, size_t c0,
                          float* const* out, const uint16_t* ahead) {
  constexpr size_t kWidth = Lanes::kWidth;
  typename Lanes::Vec o[G][kPanel];
  for (int j = 0; j < G; ++j)
    for (int c = 0; c < kPanel; ++c) o[j][c] = Lanes::load(out[j] + c0 + kWidth * c);
  for (size_t t = 0; t < n; ++t) {
    const uint16_t* row = v + t * hd + c0;
    prefetch_lines(ahead, (t * hd + c0) * sizeof(uint16_t),
                   (t * hd + c0 + kPanel * kWidth) * sizeof(uint16_t));
    typename Lanes::Vec x[kPanel];
    for (int c = 0; c < kPanel; ++c) x[c] = Lanes::load_f16(row + kWidth * c);
    for (int j = 0; j < G; ++j) {
      const typename Lanes::Vec a = Lanes::set1(p[j][t]);
      for (int c = 0; c < kPanel; ++c) o[j][c] = Lanes::fma(a, x[c], o[j][c]);
    }
  }
  for (int j = 0; j < G; ++j)
    for (int c = 0; c < kPanel; ++c) Lanes::store(out[j] + c0 + kWidth * c, o[j][c]);
}

// The last rest < G queries as one group of that many.
template <class Lanes, int kPanel, int G>
void accumulate_f16_rest(size_t rest, const float* const* p, const uint16_t* v, size_t n, size_t hd,
                         size_t c0, float* const* out, const uint16_t* ahead) {
  if constexpr (G > 1) {
    if (rest == G - 1) {
      accumulate_f16_group<Lanes, kPanel, G - 1>(p, v, n, hd, c0, out, ahead);
    } else {
      accumulate_f16_rest<Lanes, kPanel, G - 1>(rest, p, v, n, hd, c0, out, ahead);
    }
  }
}

// accumulate_f16_group over every panel of kPanel vectors of hd and every group of kGroup
// queries (the last group smaller); each panel of the rows at ahead requested by its first group.
template <class Lanes, int kPanel, int kGroup>
void accumulate_f16_groups(const float* const* p, size_t nq, const uint16_t* v, size_t n, size_t hd,
                           float* const* out, const uint16_t* ahead) {
  for (size_t c0 = 0; c0 < hd; c0 += kPanel * Lanes::kWidth) {
    size_t j = 0;
    for (; j + kGroup <= nq; j += kGroup) {
      accumulate_f16_group<Lanes, kPanel, kGroup>(p + j, v, n, hd, c0, out + j,
                                                  j == 0 ? ahead : nullptr);
    }
    accumulate_f16_rest<Lanes, kPanel, kGroup>(nq - j, p + j, v, n, hd, c0, out + j,
                                               j == 0 ? ahead : nullptr);
  }
}

// accumulate_f16 for nq queries p[j] into out[j] over the same n rows, kGroup queries at a
// time: every lane of every out[j] takes the same fused multiply-adds in row order as
// accumulate_f16_panels alone, so the same bits, with each row converted once per group. A head
// that is whole vectors but not whole panels (stories260K's 8 on AVX2) takes panels of one
// vector for eight queries at a time, so that eight chains of multiply-adds hide each one's
// latency.
template <class Lanes, int kPanel, int kGroup>
void accumulate_f16_queries(const float* const* p, size_t nq, const uint16_t* v, size_t n,
                            size_t hd, float* const* out, const uint16_t* ahead) {
  if (hd % (kPanel * Lanes::kWidth) == 0) {
    accumulate_f16_groups<Lanes, kPanel, kGroup>(p, nq, v, n, hd, out, ahead);
  } else if (hd % Lanes::kWidth == 0) {
    accumulate_f16_groups<Lanes, 1, 8>(p, nq, v, n, hd, out, ahead);
  } else {
    prefetch_lines(ahead, 0, n * hd * sizeof(uint16_t));
    for (size_t j = 0; j < nq; ++j) accumulate_f16_panels<Lanes>(p[j], v, n, hd, out[j]);
  }
}

// Scores of nq queries against the same n keys, kWidth keys to a vector, for hd a multiple of
// kWidth up to 256. Each kWidth keys are converted and transposed once for all the queries, then
// each query's scores are built with its single-row dot's arithmetic: lane l of that dot sums
// with fused multiply-adds, in order, the products at d = l (mod kWidth) of the even and of the
// odd kWidth-chunks in two accumulators, adds the two, and the horizontal sum folds halves
// (lane l + lane l + kWidth/2, then a quarter, ...). Here each lane's value is a vector over the
// keys, so every fold is a vertical addition and no horizontal sum is left: the same bits as
// attention_scores, each key row converted once per call instead of once per query.
template <class Lanes>
void scores_f16_transposed(const float* const* q, size_t nq, const uint16_t* k, size_t n, size_t hd,
                           float scale, float* const* out) {
  constexpr size_t kWidth = Lanes::kWidth;
  // Eight-float vectors score two tiles at a time (scores_of_paired_tiles), the second's keys
  // transposed at kt + hd * kWidth.
  constexpr bool kPaired = kWidth == 8;
  alignas(64) float kt[(kPaired ? 2 : 1) * 256 * kWidth];  // kt[d * kWidth + t]: key t's value d
  const size_t chunks = hd / kWidth;
  size_t t0 = 0;
  if constexpr (kPaired) {
    for (; t0 + 2 * kWidth <= n; t0 += 2 * kWidth) {
      for (size_t d0 = 0; d0 < hd; d0 += kWidth) {
        Lanes::transpose_f16(k + t0 * hd + d0, hd, kt + d0 * kWidth);
        Lanes::transpose_f16(k + (t0 + kWidth) * hd + d0, hd, kt + (hd + d0) * kWidth);
      }
      scores_of_paired_tiles<Lanes>(q, nq, kt, hd * kWidth, chunks, scale, out, t0);
    }
  }
  for (; t0 + kWidth <= n; t0 += kWidth) {
    for (size_t d0 = 0; d0 < hd; d0 += kWidth) {
      Lanes::transpose_f16(k + t0 * hd + d0, hd, kt + d0 * kWidth);
    }
    scores_of_transposed_tile<Lanes>(q, nq, kt, chunks, scale, out, t0);
  }
  if (t0 < n) {
    for (size_t j = 0; j < nq; ++j) scores_f16(q[j], k + t0 * hd, n - t0, hd, scale, out[j] + t0);
  }
}

// Scores of eight keys at a time, their horizontal sums reduced together: the bits of one dot
// per key (the vector lanes, their sum, then the scalar tail, then the scale). Row t at ahead
// (unless null) is requested as row t is read.
template <class Lanes>
void scores_f16_by_eight(const float* q, const uint16_t* k, size_t n, size_t hd, float scale,
                         float* out, const uint16_t* ahead) {
  const size_t row_bytes = hd * sizeof(uint16_t);
  size_t t = 0;
  for (; t + 8 <= n; t += 8) {
    typename Lanes::Vec v[8];
    size_t tail = hd;
    for (int r = 0; r < 8; ++r) {
      prefetch_lines(ahead, (t + r) * row_bytes, (t + r + 1) * row_bytes);
      v[r] = Lanes::dot_f16(k + (t + r) * hd, q, hd, &tail);
    }
    float sums[8];
    Lanes::hsum8(v, sums);
    for (int r = 0; r < 8; ++r) {
      const uint16_t* row = k + (t + r) * hd;
      for (size_t e = tail; e < hd; ++e) sums[r] += half(row[e]) * q[e];
      out[t + r] = sums[r] * scale;
    }
  }
  prefetch_lines(ahead, t * row_bytes, n * row_bytes);
  scores_f16(q, k + t * hd, n - t, hd, scale, out + t);  // the last n % 8 one at a time
}

// scores_f16_by_eight with nothing to request: the table's single-query loop.
template <class Lanes>
void scores_f16_eights(const float* q, const uint16_t* k, size_t n, size_t hd, float scale,
                       float* out) {
  scores_f16_by_eight<Lanes>(q, k, n, hd, scale, out, nullptr);
}
