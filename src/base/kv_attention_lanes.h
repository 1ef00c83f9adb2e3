// The quantised attention loops, written once over an instruction set's vectors (internal to
// base/).
//
// Included by kv_attention_avx2.cc and kv_attention_avx512.cc inside their target pragma and
// anonymous namespace, after transposed_scores.h and their Lanes: a vector type Vec of kWidth
// floats with zero, set1, load, store (unaligned), fma, add, mul, hsum and hsum8 (eight sums
// reduced together in hsum's own lane order); transpose(r, kt), kWidth rows of kWidth floats
// stored as columns; run(block, first, count, out), the `count` values (a multiple of kWidth)
// of a group from element `first` as count / kWidth vectors of floats; and narrower(), the
// table for rows whose length is not a multiple of kWidth. kv_attention_table<Lanes>() is
// their table. Each loop's bits are fixed by the order of its fused multiply-adds, which the
// comments state. It includes nothing itself.
#pragma once

template <class Lanes>
const KvAttentionTable& kv_attention_table();

// A row is hd / 32 whole groups, or one run of hd values from element `first` of one group.
struct RowShape {
  size_t groups;
  int run;
};

inline RowShape row_shape(size_t hd) {
  return hd >= 32 ? RowShape{hd / 32, 32} : RowShape{1, static_cast<int>(hd)};
}

// A group's `count` values from element `first` as exact floats: each stored integer times the
// group's f16 scale, a product of at most 19 significant bits, so none rounds. Scores are then
// those of keys stored as these floats.
template <class Lanes, class Block>
inline void exact_run(const Block& b, int first, int count, typename Lanes::Vec* out) {
  constexpr int kWidth = static_cast<int>(Lanes::kWidth);
  Lanes::run(b, first, count, out);
  const typename Lanes::Vec d = Lanes::set1(_cvtsh_ss(b.d));
  for (int e = 0; e < count / kWidth; ++e) out[e] = Lanes::mul(out[e], d);
}

// One key row's lanes of q . k, before the horizontal sum: over the row's exact values, the
// even kWidth-chunks and the odd ones summed by fused multiply-adds in two accumulators, then
// added, lane by lane the arithmetic of folded_transposed_dots, so that a query scored with
// others against transposed keys gets the bits it gets alone.
template <class Lanes, class Block>
inline typename Lanes::Vec score_lanes(const Block* b, const float* q, RowShape s, int first) {
  constexpr int kWidth = static_cast<int>(Lanes::kWidth), kPerGroup = 32 / kWidth;
  typename Lanes::Vec acc[2] = {Lanes::zero(), Lanes::zero()};
  typename Lanes::Vec x[kPerGroup];
  if (s.run == 32) {  // whole groups: an even number of chunks each, so chunk e's parity is e's
    for (size_t g = 0; g < s.groups; ++g) {
      exact_run<Lanes>(b[g], 0, 32, x);
#pragma GCC unroll 4
      for (int e = 0; e < kPerGroup; ++e) {
        acc[e & 1] = Lanes::fma(x[e], Lanes::load(q + g * 32 + e * kWidth), acc[e & 1]);
      }
    }
  } else {  // a head inside one group
    exact_run<Lanes>(b[0], first, s.run, x);
    for (int e = 0; e < s.run / kWidth; ++e) {
      acc[e & 1] = Lanes::fma(x[e], Lanes::load(q + e * kWidth), acc[e & 1]);
    }
  }
  return Lanes::add(acc[0], acc[1]);
}

template <class Lanes, class Block>
void scores(const float* q, const uint8_t* base, size_t stride, int first, size_t n, size_t hd,
            float scale, float* out) {
  if (hd % Lanes::kWidth != 0) {
    scores_for<Block>(Lanes::narrower())(q, base, stride, first, n, hd, scale, out);
    return;
  }
  const RowShape s = row_shape(hd);
  const auto row = [&](size_t t) { return reinterpret_cast<const Block*>(base + t * stride); };
  size_t t = 0;
  // Eight keys share one folded horizontal sum (the same bits as each summed alone).
  for (; t + 8 <= n; t += 8) {
    typename Lanes::Vec acc[8];
    for (int k = 0; k < 8; ++k) acc[k] = score_lanes<Lanes>(row(t + k), q, s, first);
    float sums[8];
    Lanes::hsum8(acc, sums);
    for (int k = 0; k < 8; ++k) out[t + k] = sums[k] * scale;
  }
  for (; t < n; ++t) out[t] = Lanes::hsum(score_lanes<Lanes>(row(t), q, s, first)) * scale;
}

// out's values of G whole groups (32 values each, from group g0) kept in registers over all n
// rows: per value, out += (p[t] * scale) * value in row order, as updating out in memory row
// by row would.
template <class Lanes, class Block, int G>
void accumulate_groups(const float* p, const uint8_t* base, size_t stride, size_t n, size_t g0,
                       float* out) {
  constexpr int kPerGroup = 32 / static_cast<int>(Lanes::kWidth);
  typename Lanes::Vec o[kPerGroup * G];
  for (int i = 0; i < kPerGroup * G; ++i) o[i] = Lanes::load(out + g0 * 32 + i * Lanes::kWidth);
  for (size_t t = 0; t < n; ++t) {
    const auto* b = reinterpret_cast<const Block*>(base + t * stride) + g0;
    for (int g = 0; g < G; ++g) {
      const typename Lanes::Vec a = Lanes::set1(p[t] * _cvtsh_ss(b[g].d));
      typename Lanes::Vec values[kPerGroup];
      Lanes::run(b[g], 0, 32, values);
      for (int e = 0; e < kPerGroup; ++e) {
        o[kPerGroup * g + e] = Lanes::fma(a, values[e], o[kPerGroup * g + e]);
      }
    }
  }
  for (int i = 0; i < kPerGroup * G; ++i) Lanes::store(out + g0 * 32 + i * Lanes::kWidth, o[i]);
}

// Groups from g on, G at a time, then fewer: eight output registers at most.
template <class Lanes, class Block, int G>
void accumulate_group_runs(const float* p, const uint8_t* base, size_t stride, size_t n, size_t g,
                           size_t groups, float* out) {
  for (; g + G <= groups; g += G) accumulate_groups<Lanes, Block, G>(p, base, stride, n, g, out);
  if constexpr (G > 1) {
    accumulate_group_runs<Lanes, Block, G / 2>(p, base, stride, n, g, groups, out);
  }
}

template <class Lanes, class Block>
void accumulate(const float* p, const uint8_t* base, size_t stride, int first, size_t n, size_t hd,
                float* out) {
  constexpr size_t kWidth = Lanes::kWidth;
  if (hd % kWidth != 0) {
    accumulate_for<Block>(Lanes::narrower())(p, base, stride, first, n, hd, out);
    return;
  }
  if (hd >= 32) {
    constexpr int kMaxGroups = static_cast<int>(8 * kWidth / 32);
    accumulate_group_runs<Lanes, Block, kMaxGroups>(p, base, stride, n, 0, hd / 32, out);
    return;
  }
  // A head shorter than a group: a run of hd values inside one group, in registers.
  const int chunks = static_cast<int>(hd / kWidth);
  typename Lanes::Vec o[32 / kWidth];
  for (int c = 0; c < chunks; ++c) o[c] = Lanes::load(out + c * kWidth);
  for (size_t t = 0; t < n; ++t) {
    const auto* b = reinterpret_cast<const Block*>(base + t * stride);
    const typename Lanes::Vec a = Lanes::set1(p[t] * _cvtsh_ss(b->d));
    typename Lanes::Vec values[32 / kWidth];
    Lanes::run(*b, first, static_cast<int>(hd), values);
    for (int c = 0; c < chunks; ++c) o[c] = Lanes::fma(a, values[c], o[c]);
  }
  for (int c = 0; c < chunks; ++c) Lanes::store(out + c * kWidth, o[c]);
}

// Rows whose values are converted once for several queries hold at most this many values.
constexpr size_t kMaxConvertedRow = 256;

// A row's exact values (exact_run), group after group: what score_lanes converts, kept for
// several queries.
template <class Lanes, class Block>
inline void convert_row(const Block* b, RowShape s, int first, float* values) {
  constexpr int kWidth = static_cast<int>(Lanes::kWidth);
  for (size_t g = 0; g < s.groups; ++g) {
    typename Lanes::Vec v[32 / kWidth];
    exact_run<Lanes>(b[g], first, s.run, v);
    for (int e = 0; e < s.run; e += kWidth) Lanes::store(values + g * s.run + e, v[e / kWidth]);
  }
}

// score_lanes over a converted row: the same multiply-adds of the same values.
template <class Lanes>
inline typename Lanes::Vec score_converted(const float* values, const float* q, size_t hd) {
  constexpr size_t kWidth = Lanes::kWidth;
  typename Lanes::Vec a0 = Lanes::zero(), a1 = Lanes::zero();
  size_t d = 0;
  for (; d + 2 * kWidth <= hd; d += 2 * kWidth) {
    a0 = Lanes::fma(Lanes::load(values + d), Lanes::load(q + d), a0);
    a1 = Lanes::fma(Lanes::load(values + d + kWidth), Lanes::load(q + d + kWidth), a1);
  }
  if (d < hd) a0 = Lanes::fma(Lanes::load(values + d), Lanes::load(q + d), a0);
  return Lanes::add(a0, a1);
}

// Scores of nq queries over the same rows, kWidth keys at a time converted to exact values and
// transposed once for all of them, each query's scores then built by folded_transposed_dots
// (score_lanes' arithmetic, every fold a vertical addition); the last n % kWidth keys query by
// query.
template <class Lanes, class Block>
void scores_transposed(const float* const* q, size_t nq, const uint8_t* base, size_t stride,
                       int first, size_t n, size_t hd, float scale, float* const* out) {
  constexpr size_t kWidth = Lanes::kWidth;
  const size_t chunks = hd / kWidth;
  alignas(64) float kt[kMaxConvertedRow * kWidth];  // kt[d * kWidth + t]: key t's value d
  size_t t0 = 0;
  for (; t0 + kWidth <= n; t0 += kWidth) {
    for (size_t c = 0; c < chunks; ++c) {
      const size_t g = c * kWidth / 32;  // 0 for a head inside one group
      const int at = first + static_cast<int>(c * kWidth % 32);
      typename Lanes::Vec r[kWidth];
      for (size_t k = 0; k < kWidth; ++k) {
        const auto* b = reinterpret_cast<const Block*>(base + (t0 + k) * stride) + g;
        exact_run<Lanes>(*b, at, static_cast<int>(kWidth), &r[k]);
      }
      Lanes::transpose(r, kt + c * kWidth * kWidth);
    }
    scores_of_transposed_tile<Lanes>(q, nq, kt, chunks, scale, out, t0);
  }
  if (t0 < n) {
    for (size_t j = 0; j < nq; ++j) {
      scores<Lanes, Block>(q[j], base + t0 * stride, stride, first, n - t0, hd, scale, out[j] + t0);
    }
  }
}

// From four queries on, the keys transposed once for all (scores_transposed); two or three
// share each row's conversion and then score it query by query.
template <class Lanes, class Block>
void scores_queries(const float* const* q, size_t nq, const uint8_t* base, size_t stride, int first,
                    size_t n, size_t hd, float scale, float* const* out) {
  if (hd % Lanes::kWidth != 0) {
    scores_queries_for<Block>(Lanes::narrower())(q, nq, base, stride, first, n, hd, scale, out);
    return;
  }
  if (nq == 1 || hd > kMaxConvertedRow) {
    scores_each<Block>(kv_attention_table<Lanes>(), q, nq, base, stride, first, n, hd, scale, out);
    return;
  }
  if (nq >= 4) {
    scores_transposed<Lanes, Block>(q, nq, base, stride, first, n, hd, scale, out);
    return;
  }
  const RowShape s = row_shape(hd);
  const auto row = [&](size_t t) { return reinterpret_cast<const Block*>(base + t * stride); };
  alignas(64) float values[8 * kMaxConvertedRow];
  size_t t = 0;
  // Eight keys converted once, then scored for every query, their sums folded together.
  for (; t + 8 <= n; t += 8) {
    for (int k = 0; k < 8; ++k) convert_row<Lanes>(row(t + k), s, first, values + k * hd);
    for (size_t j = 0; j < nq; ++j) {
      typename Lanes::Vec acc[8];
      for (int k = 0; k < 8; ++k) acc[k] = score_converted<Lanes>(values + k * hd, q[j], hd);
      float sums[8];
      Lanes::hsum8(acc, sums);
      for (int k = 0; k < 8; ++k) out[j][t + k] = sums[k] * scale;
    }
  }
  for (; t < n; ++t) {
    convert_row<Lanes>(row(t), s, first, values);
    for (size_t j = 0; j < nq; ++j) {
      out[j][t] = Lanes::hsum(score_converted<Lanes>(values, q[j], hd)) * scale;
    }
  }
}

// accumulate for G queries over the same n rows, a panel of kPanel vectors from value c0 (the
// panel is a run inside one group, or whole groups): each row's panel is converted once for
// all G queries, whose outputs stay in registers, and every output lane takes the same fused
// multiply-adds, out += (p[t] * scale) * value in row order, as accumulate alone.
template <class Lanes, class Block, int kPanel, int G>
void accumulate_panel(const float* const* p, const uint8_t* base, size_t stride, size_t n,
                      size_t c0, float* const* out) {
  constexpr int kWidth = static_cast<int>(Lanes::kWidth);
  constexpr int kValues = kPanel * kWidth;
  constexpr int kGroups = kValues >= 32 ? kValues / 32 : 1;
  constexpr int kRun = kValues >= 32 ? 32 : kValues;  // values of one group in the panel
  constexpr int kPerGroup = kRun / kWidth;
  const size_t g0 = c0 / 32;
  const int first = static_cast<int>(c0 % 32);
  typename Lanes::Vec o[G][kPanel];
  for (int j = 0; j < G; ++j)
    for (int c = 0; c < kPanel; ++c) o[j][c] = Lanes::load(out[j] + c0 + kWidth * c);
  for (size_t t = 0; t < n; ++t) {
    const auto* b = reinterpret_cast<const Block*>(base + t * stride) + g0;
    typename Lanes::Vec x[kPanel];
    float d[kGroups];
    for (int g = 0; g < kGroups; ++g) {
      Lanes::run(b[g], first, kRun, x + g * kPerGroup);
      d[g] = _cvtsh_ss(b[g].d);
    }
    for (int j = 0; j < G; ++j) {
      for (int g = 0; g < kGroups; ++g) {
        const typename Lanes::Vec a = Lanes::set1(p[j][t] * d[g]);
        for (int e = 0; e < kPerGroup; ++e) {
          o[j][g * kPerGroup + e] = Lanes::fma(a, x[g * kPerGroup + e], o[j][g * kPerGroup + e]);
        }
      }
    }
  }
  for (int j = 0; j < G; ++j)
    for (int c = 0; c < kPanel; ++c) Lanes::store(out[j] + c0 + kWidth * c, o[j][c]);
}

// The last rest < G queries of a panel as one group of that many.
template <class Lanes, class Block, int kPanel, int G>
void accumulate_panel_rest(size_t rest, const float* const* p, const uint8_t* base, size_t stride,
                           size_t n, size_t c0, float* const* out) {
  if constexpr (G > 1) {
    if (rest == G - 1) {
      accumulate_panel<Lanes, Block, kPanel, G - 1>(p, base, stride, n, c0, out);
    } else {
      accumulate_panel_rest<Lanes, Block, kPanel, G - 1>(rest, p, base, stride, n, c0, out);
    }
  }
}

// Every query over the panel at c0, G at a time.
template <class Lanes, class Block, int kPanel, int G>
void accumulate_panel_queries(const float* const* p, size_t nq, const uint8_t* base, size_t stride,
                              size_t n, size_t c0, float* const* out) {
  size_t j = 0;
  for (; j + G <= nq; j += G)
    accumulate_panel<Lanes, Block, kPanel, G>(p + j, base, stride, n, c0, out + j);
  accumulate_panel_rest<Lanes, Block, kPanel, G>(nq - j, p + j, base, stride, n, c0, out + j);
}

// accumulate for nq weight rows p[j] into out[j] over the same rows, each out[j] with the bits
// of accumulate alone. Rows of whole groups go panel by panel (kPanel vectors, then half that
// for a last narrower one), kGroup queries at a time; a shorter head converts up to eight rows
// once and then takes each query's sums in row order.
template <class Lanes, class Block, int kPanel, int kGroup>
void accumulate_queries(const float* const* p, size_t nq, const uint8_t* base, size_t stride,
                        int first, size_t n, size_t hd, float* const* out) {
  constexpr int kWidth = static_cast<int>(Lanes::kWidth);
  if (hd % kWidth != 0) {
    accumulate_queries_for<Block>(Lanes::narrower())(p, nq, base, stride, first, n, hd, out);
    return;
  }
  if (nq == 1) {
    accumulate_each<Block>(kv_attention_table<Lanes>(), p, nq, base, stride, first, n, hd, out);
    return;
  }
  if (hd >= 32) {
    constexpr size_t kValues = kPanel * kWidth;
    size_t c0 = 0;
    for (; c0 + kValues <= hd; c0 += kValues) {
      accumulate_panel_queries<Lanes, Block, kPanel, kGroup>(p, nq, base, stride, n, c0, out);
    }
    if constexpr (kPanel > 1) {
      for (; c0 < hd; c0 += kValues / 2) {
        accumulate_panel_queries<Lanes, Block, kPanel / 2, kGroup>(p, nq, base, stride, n, c0, out);
      }
    }
    return;
  }
  // A head inside one group: up to eight rows' values (and scales) converted once, then each
  // query's sums take them in row order.
  alignas(64) float values[8 * 32];
  float d[8];
  for (size_t t0 = 0; t0 < n; t0 += 8) {
    const size_t m = std::min<size_t>(8, n - t0);
    for (size_t k = 0; k < m; ++k) {
      const auto* b = reinterpret_cast<const Block*>(base + (t0 + k) * stride);
      typename Lanes::Vec v[32 / kWidth];
      Lanes::run(*b, first, static_cast<int>(hd), v);
      for (size_t e = 0; e < hd; e += kWidth) Lanes::store(values + k * hd + e, v[e / kWidth]);
      d[k] = _cvtsh_ss(b->d);
    }
    for (size_t j = 0; j < nq; ++j) {
      for (size_t e = 0; e < hd; e += kWidth) {
        float* o = out[j] + e;
        typename Lanes::Vec sum = Lanes::load(o);
        for (size_t k = 0; k < m; ++k) {
          const typename Lanes::Vec a = Lanes::set1(p[j][t0 + k] * d[k]);
          sum = Lanes::fma(a, Lanes::load(values + k * hd + e), sum);
        }
        Lanes::store(o, sum);
      }
    }
  }
}

// channel_bias in one 8-lane vector (head_dim a multiple of 8): lane i's fused multiply-adds are
// sum i's, and hsum256 adds the lanes in channel_bias's order.
inline float channel_bias_lanes(const float* q, const uint8_t* slab, DType t, size_t hd) {
  const uint8_t* mins = slab + hd * channel_code_bytes(t);
  __m256 acc = _mm256_setzero_ps();
  for (size_t c = 0; c < hd; c += 8) {
    const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(mins + 2 * c));
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), _mm256_cvtph_ps(halves), acc);
  }
  return hsum256(acc);
}

// Scores of G queries against the keys of one channel-grouped slab (KvChannelScoresFn): each
// channel's codes converted once for all G, whose sums stay in registers.
template <class Lanes, DType kType, int G>
void channel_scores_group(const float* const* q, const uint8_t* slab, size_t n, size_t hd,
                          float scale, float* const* out) {
  constexpr int kWidth = static_cast<int>(Lanes::kWidth), kVecs = kChannelTokens / kWidth;
  const size_t code_bytes = channel_code_bytes(kType);
  typename Lanes::Vec acc[G][kVecs];
  for (int j = 0; j < G; ++j) {
    const typename Lanes::Vec bias = Lanes::set1(channel_bias_lanes(q[j], slab, kType, hd));
    for (int v = 0; v < kVecs; ++v) acc[j][v] = bias;
  }
  for (size_t c = 0; c < hd; ++c) {
    typename Lanes::Vec codes[kVecs];
    Lanes::channel_codes(slab + c * code_bytes, kType == DType::Q4_0, codes);
    const float step = channel_slab_step(slab, kType, hd, c);
    for (int j = 0; j < G; ++j) {
      const typename Lanes::Vec weight = Lanes::set1(q[j][c] * step);
      for (int v = 0; v < kVecs; ++v) acc[j][v] = Lanes::fma(weight, codes[v], acc[j][v]);
    }
  }
  const typename Lanes::Vec scales = Lanes::set1(scale);
  for (int j = 0; j < G; ++j) {
    float all[kChannelTokens];
    for (int v = 0; v < kVecs; ++v) Lanes::store(all + v * kWidth, Lanes::mul(acc[j][v], scales));
    std::copy(all, all + n, out[j]);
  }
}

template <class Lanes, DType kType>
void channel_scores(const float* const* q, size_t nq, const uint8_t* slab, size_t n, size_t hd,
                    float scale, float* const* out) {
  constexpr size_t kMost = Lanes::kChannelQueries;
  size_t j = 0;
  for (; j + kMost <= nq; j += kMost) {
    channel_scores_group<Lanes, kType, kMost>(q + j, slab, n, hd, scale, out + j);
  }
  for (; j < nq; ++j) channel_scores_group<Lanes, kType, 1>(q + j, slab, n, hd, scale, out + j);
}

// The table of these loops for one instruction set.
template <class Lanes>
const KvAttentionTable& kv_attention_table() {
  static const KvAttentionTable table{
      scores<Lanes, BlockQ8_0>,
      scores<Lanes, BlockQ4_0>,
      accumulate<Lanes, BlockQ8_0>,
      accumulate<Lanes, BlockQ4_0>,
      scores_queries<Lanes, BlockQ8_0>,
      scores_queries<Lanes, BlockQ4_0>,
      accumulate_queries<Lanes, BlockQ8_0, Lanes::kPanel, Lanes::kGroup>,
      accumulate_queries<Lanes, BlockQ4_0, Lanes::kPanel, Lanes::kGroup>,
      channel_scores<Lanes, DType::Q8_0>,
      channel_scores<Lanes, DType::Q4_0>};
  return table;
}
