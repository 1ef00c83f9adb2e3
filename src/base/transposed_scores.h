// Scores of one query against transposed keys (internal to base/), for the f16 and the
// quantised attention loops alike.
//
// Included inside an instruction set's anonymous namespace and target pragma, before the loops
// that use it, over that file's Lanes (load, store, set1, fma, add, mul; kWidth floats). It
// includes nothing itself.
#pragma once

// One query's scores for kWidth transposed keys (kt[d * kWidth + t]: key t's value d); kChunks is
// hd / kWidth when known at compile time (every loop unrolled, the lanes kept in registers), else
// 0.
template <class Lanes, size_t kChunks>
void scores_of_transposed_keys(const float* qj, const float* kt, size_t chunks, float scale,
                               float* out) {
  constexpr size_t kWidth = Lanes::kWidth;
  const size_t n_chunks = kChunks > 0 ? kChunks : chunks;
  typename Lanes::Vec s[kWidth];
#pragma GCC unroll 16
  for (size_t l = 0; l < kWidth; ++l) {
    typename Lanes::Vec a0 = Lanes::set1(0.0f), a1 = Lanes::set1(0.0f);
    size_t c = 0;
#pragma GCC unroll 16
    for (; c + 2 <= n_chunks; c += 2) {
      const size_t d = c * kWidth + l;
      a0 = Lanes::fma(Lanes::load(kt + d * kWidth), Lanes::set1(qj[d]), a0);
      a1 = Lanes::fma(Lanes::load(kt + (d + kWidth) * kWidth), Lanes::set1(qj[d + kWidth]), a1);
    }
    if (c < n_chunks) {
      const size_t d = c * kWidth + l;
      a0 = Lanes::fma(Lanes::load(kt + d * kWidth), Lanes::set1(qj[d]), a0);
    }
    s[l] = Lanes::add(a0, a1);
  }
#pragma GCC unroll 8
  for (size_t half = kWidth / 2; half >= 1; half /= 2) {
#pragma GCC unroll 8
    for (size_t l = 0; l < half; ++l) s[l] = Lanes::add(s[l], s[l + half]);
  }
  Lanes::store(out, Lanes::mul(s[0], Lanes::set1(scale)));
}

// Every query's scores for the kWidth transposed keys of kt, into out[j] + t0: the loops
// unrolled where a head is one, four or eight vectors.
template <class Lanes>
void scores_of_transposed_tile(const float* const* q, size_t nq, const float* kt, size_t chunks,
                               float scale, float* const* out, size_t t0) {
  for (size_t j = 0; j < nq; ++j) {
    if (chunks == 1) {
      scores_of_transposed_keys<Lanes, 1>(q[j], kt, chunks, scale, out[j] + t0);
    } else if (chunks == 4) {
      scores_of_transposed_keys<Lanes, 4>(q[j], kt, chunks, scale, out[j] + t0);
    } else if (chunks == 8) {
      scores_of_transposed_keys<Lanes, 8>(q[j], kt, chunks, scale, out[j] + t0);
    } else {
      scores_of_transposed_keys<Lanes, 0>(q[j], kt, chunks, scale, out[j] + t0);
    }
  }
}
