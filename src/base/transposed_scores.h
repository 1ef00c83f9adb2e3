// Scores of queries against transposed keys (internal to base/), for the f16 and the quantised
// attention loops alike.
//
// Included inside an instruction set's anonymous namespace and target pragma, before the loops
// that use it, over that file's Lanes (load, store, set1, fma, add, mul; kWidth floats). It
// includes nothing itself.
#pragma once

// Makes the G sums exist in registers here, before whatever the source computes next: left
// free, the compiler interleaves every lane of a group and spills them all (measured 1.5x slower
// for four queries). One query keeps the compiler's own schedule.
template <int G, class Vec>
inline void settle(Vec (&s)[G]) {
  if constexpr (G > 1) {
    for (int j = 0; j < G; ++j) asm volatile("" : "+v"(s[j]));
  }
}

// Lane l of G queries' single-row dots over kWidth transposed keys (kt[d * kWidth + t]: key t's
// value d), one vector over the keys per query: the products at d = l (mod kWidth) of the even
// and of the odd kWidth-chunks summed by fused multiply-adds in two accumulators, then added.
// Each key vector is loaded once for the G queries. kChunks is hd / kWidth when known at compile
// time (every loop unrolled), else 0.
template <class Lanes, size_t kChunks, int G, size_t kLane>
inline void lane_of_transposed_dots(const float* const* q, const float* kt, size_t chunks,
                                    typename Lanes::Vec (&s)[G]) {
  constexpr size_t kWidth = Lanes::kWidth;
  const size_t n_chunks = kChunks > 0 ? kChunks : chunks;
  typename Lanes::Vec a0[G], a1[G];
  for (int j = 0; j < G; ++j) a0[j] = a1[j] = Lanes::set1(0.0f);
  size_t c = 0;
#pragma GCC unroll 16
  for (; c + 2 <= n_chunks; c += 2) {
    const size_t d = c * kWidth + kLane;
    const typename Lanes::Vec even = Lanes::load(kt + d * kWidth);
    for (int j = 0; j < G; ++j) a0[j] = Lanes::fma(even, Lanes::set1(q[j][d]), a0[j]);
    const typename Lanes::Vec odd = Lanes::load(kt + (d + kWidth) * kWidth);
    for (int j = 0; j < G; ++j) a1[j] = Lanes::fma(odd, Lanes::set1(q[j][d + kWidth]), a1[j]);
  }
  if (c < n_chunks) {
    const size_t d = c * kWidth + kLane;
    const typename Lanes::Vec even = Lanes::load(kt + d * kWidth);
    for (int j = 0; j < G; ++j) a0[j] = Lanes::fma(even, Lanes::set1(q[j][d]), a0[j]);
  }
  for (int j = 0; j < G; ++j) s[j] = Lanes::add(a0[j], a1[j]);
  settle(s);
}

// The single-row dot's horizontal sum, kLevel folds deep, of the lanes from kLane: fold k adds
// lane l and lane l + kWidth / 2^k, as that sum does (halves, then quarters, ...). Each lane is
// a vector over the keys, so every fold is a vertical addition. Evaluated depth first, so each
// query holds one partial sum per level instead of all kWidth lanes.
template <class Lanes, size_t kChunks, int G, int kLevel, size_t kLane>
inline void folded_transposed_dots(const float* const* q, const float* kt, size_t chunks,
                                   typename Lanes::Vec (&s)[G]) {
  if constexpr (kLevel == 0) {
    lane_of_transposed_dots<Lanes, kChunks, G, kLane>(q, kt, chunks, s);
  } else {
    typename Lanes::Vec high[G];
    folded_transposed_dots<Lanes, kChunks, G, kLevel - 1, kLane>(q, kt, chunks, s);
    folded_transposed_dots<Lanes, kChunks, G, kLevel - 1, kLane + (Lanes::kWidth >> kLevel)>(
        q, kt, chunks, high);
    for (int j = 0; j < G; ++j) s[j] = Lanes::add(s[j], high[j]);
    settle(s);
  }
}

// log2 of a vector's width: the folds of its horizontal sum.
constexpr int fold_levels(size_t width) {
  return width > 1 ? 1 + fold_levels(width / 2) : 0;
}

// G queries' scores for the kWidth transposed keys of kt, into out[j] + t0: each the bits of
// its single-row dot (lanes, horizontal sum, then the scale), each key vector read once for all G.
template <class Lanes, size_t kChunks, int G>
void scores_of_transposed_group(const float* const* q, const float* kt, size_t chunks, float scale,
                                float* const* out, size_t t0) {
  typename Lanes::Vec s[G];
  folded_transposed_dots<Lanes, kChunks, G, fold_levels(Lanes::kWidth), 0>(q, kt, chunks, s);
  for (int j = 0; j < G; ++j) Lanes::store(out[j] + t0, Lanes::mul(s[j], Lanes::set1(scale)));
}

// Lane kLane of G queries' single-row dots over two tiles of kWidth transposed keys at once (kt
// and kt + stride), as lane_of_transposed_dots for each tile, into lanes[j][tile][kLane]: each
// query value broadcast serves both tiles, and the lane sums wait in memory for their folds
// instead of holding registers, so that three queries keep twelve chains of multiply-adds.
template <class Lanes, size_t kChunks, int G, size_t kLane>
inline void lane_of_paired_dots(const float* const* q, const float* kt, size_t stride,
                                size_t chunks, typename Lanes::Vec (*lanes)[2][Lanes::kWidth]) {
  constexpr size_t kWidth = Lanes::kWidth;
  const size_t n_chunks = kChunks > 0 ? kChunks : chunks;
  typename Lanes::Vec a0[G][2], a1[G][2];
  for (int j = 0; j < G; ++j) a0[j][0] = a0[j][1] = a1[j][0] = a1[j][1] = Lanes::set1(0.0f);
  // Value d of both tiles' keys times each query's value d, into acc.
  const auto add_products = [&](size_t d, typename Lanes::Vec(&acc)[G][2]) {
    const typename Lanes::Vec k0 = Lanes::load(kt + d * kWidth);
    const typename Lanes::Vec k1 = Lanes::load(kt + stride + d * kWidth);
    for (int j = 0; j < G; ++j) {
      const typename Lanes::Vec b = Lanes::set1(q[j][d]);
      acc[j][0] = Lanes::fma(k0, b, acc[j][0]);
      acc[j][1] = Lanes::fma(k1, b, acc[j][1]);
    }
  };
  size_t c = 0;
#pragma GCC unroll 16
  for (; c + 2 <= n_chunks; c += 2) {
    add_products(c * kWidth + kLane, a0);
    add_products((c + 1) * kWidth + kLane, a1);
  }
  if (c < n_chunks) add_products(c * kWidth + kLane, a0);
  for (int j = 0; j < G; ++j) {
    lanes[j][0][kLane] = Lanes::add(a0[j][0], a1[j][0]);
    lanes[j][1][kLane] = Lanes::add(a0[j][1], a1[j][1]);
  }
}

// lane_of_paired_dots for every lane from kLane on.
template <class Lanes, size_t kChunks, int G, size_t kLane>
inline void lanes_of_paired_dots(const float* const* q, const float* kt, size_t stride,
                                 size_t chunks, typename Lanes::Vec (*lanes)[2][Lanes::kWidth]) {
  if constexpr (kLane < Lanes::kWidth) {
    lane_of_paired_dots<Lanes, kChunks, G, kLane>(q, kt, stride, chunks, lanes);
    lanes_of_paired_dots<Lanes, kChunks, G, kLane + 1>(q, kt, stride, chunks, lanes);
  }
}

// The single-row dot's horizontal sum, kLevel folds deep, of the lanes from kLane (each a
// vector over the keys), folded as folded_transposed_dots folds them.
template <class Lanes, int kLevel, size_t kLane>
inline typename Lanes::Vec fold_lanes(const typename Lanes::Vec* lane) {
  if constexpr (kLevel == 0) {
    return lane[kLane];
  } else {
    return Lanes::add(fold_lanes<Lanes, kLevel - 1, kLane>(lane),
                      fold_lanes<Lanes, kLevel - 1, kLane + (Lanes::kWidth >> kLevel)>(lane));
  }
}

// G queries' scores for the two tiles of kWidth transposed keys at kt and kt + stride, into
// out[j] + t0 and out[j] + t0 + kWidth: the bits of scores_of_transposed_group on each tile.
template <class Lanes, size_t kChunks, int G>
void scores_of_paired_group(const float* const* q, const float* kt, size_t stride, size_t chunks,
                            float scale, float* const* out, size_t t0) {
  constexpr size_t kWidth = Lanes::kWidth;
  typename Lanes::Vec lanes[G][2][kWidth];
  lanes_of_paired_dots<Lanes, kChunks, G, 0>(q, kt, stride, chunks, lanes);
  for (int j = 0; j < G; ++j) {
    for (int t = 0; t < 2; ++t) {
      Lanes::store(
          out[j] + t0 + t * kWidth,
          Lanes::mul(fold_lanes<Lanes, fold_levels(kWidth), 0>(lanes[j][t]), Lanes::set1(scale)));
    }
  }
}

// Queries a transposed tile scores together: their partial sums (one per fold level each), two
// accumulators each and a key vector stay within the registers (32 vectors of sixteen floats,
// 16 of eight on AVX2). Measured on Zen 4, sixteen queries of a head of 64 or 128: 1.4-1.7x
// one query at a time (AVX-512, four), 1.4x (AVX2, three; two gained 0-30%).
template <class Lanes>
constexpr int kTransposedGroup = Lanes::kWidth >= 16 ? 4 : 3;

// Calls f.template operator()<G>(j) for the queries from j on, G at a time, and the last rest
// (fewer than G) together.
template <int G, class F>
inline void in_query_groups(size_t nq, F&& f, size_t j = 0) {
  for (; j + G <= nq; j += G) f.template operator()<G>(j);
  if constexpr (G > 1) {
    if (j < nq) in_query_groups<G - 1>(nq, f, j);
  }
}

// Calls f.template operator()<kChunks>() with kChunks = chunks where a head is one, four or eight
// vectors (every loop unrolled), else 0 (chunks known at run time).
template <class F>
inline void with_unrolled_chunks(size_t chunks, F&& f) {
  if (chunks == 1) {
    f.template operator()<1>();
  } else if (chunks == 4) {
    f.template operator()<4>();
  } else if (chunks == 8) {
    f.template operator()<8>();
  } else {
    f.template operator()<0>();
  }
}

// Every query's scores for the kWidth transposed keys of kt, into out[j] + t0.
template <class Lanes>
void scores_of_transposed_tile(const float* const* q, size_t nq, const float* kt, size_t chunks,
                               float scale, float* const* out, size_t t0) {
  with_unrolled_chunks(chunks, [&]<size_t kChunks>() {
    in_query_groups<kTransposedGroup<Lanes>>(nq, [&]<int G>(size_t j) {
      scores_of_transposed_group<Lanes, kChunks, G>(q + j, kt, chunks, scale, out + j, t0);
    });
  });
}

// Queries that score a pair of tiles together: twelve accumulators (three queries, two tiles,
// even and odd chunks), two key vectors and a broadcast fill AVX2's sixteen registers.
// Measured, 32 queries of a head of 64 from the first-level cache: 39.7 GMAC/s per core against
// 31.5 for one tile at a time (two queries 28, four 33).
constexpr int kPairedGroup = 3;

// Every query's scores for the two tiles of kWidth transposed keys at kt and kt + stride, into
// out[j] + t0 and out[j] + t0 + kWidth.
template <class Lanes>
void scores_of_paired_tiles(const float* const* q, size_t nq, const float* kt, size_t stride,
                            size_t chunks, float scale, float* const* out, size_t t0) {
  with_unrolled_chunks(chunks, [&]<size_t kChunks>() {
    in_query_groups<kPairedGroup>(nq, [&]<int G>(size_t j) {
      scores_of_paired_group<Lanes, kChunks, G>(q + j, kt, stride, chunks, scale, out + j, t0);
    });
  });
}
