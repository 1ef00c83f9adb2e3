// AVX2 + FMA + F16C GEMM micro-kernels: a tile of activation rows against a tile of weight
// rows, every output summed with exactly the operations, lanes and order of the single-row dot
// in kernels_avx2.cc (the integer types: of this file's narrow column), so a row's result does
// not depend on its tile.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "base/dtype.h"
#include "base/gemm_table.h"
#include "base/prefetch_lines.h"
#include "base/quant_blocks.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace kvc::kernels {
namespace {

#include "base/simd_reduce.h"

#include "base/gemm_tiles.h"

#include "base/gemm_narrow_rows.h"

#include "base/quant_unpack.h"

// Unsigned x signed bytes, four products per int32 lane; exact while each pair stays below
// 2^15 (the integer tiles' magnitudes or values below 32 against activations within 127).
inline __m256i dot_u8s8(__m256i u, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}

// The tiles load unpacked bytes 32 at a time.
inline void store_q_pair(uint8_t* q, __m256i lo, __m256i hi) {
  _mm256_store_si256(reinterpret_cast<__m256i*>(q), lo);
  _mm256_store_si256(reinterpret_cast<__m256i*>(q + 32), hi);
}

#include "base/gemm_unpacked.h"

template <class T>
const T* row_at(const uint8_t* base, size_t stride, int index) {
  return reinterpret_cast<const T*>(base + static_cast<size_t>(index) * stride);
}

struct LoadF32 {
  using T = float;
  static __m256 full(const float* p) { return _mm256_loadu_ps(p); }
  static float one(float v) { return v; }
};

struct LoadF16 {
  using T = uint16_t;
  static __m256 full(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static float one(uint16_t v) { return half(v); }
};

struct LoadBf16 {
  using T = uint16_t;
  static __m256 full(const uint16_t* p) {
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static float one(uint16_t v) { return bf16_to_f32(v); }
};

// Float weights: U accumulators per output over 8 * U-element steps, then 8-element steps into
// the first, their sum, then a scalar tail; as dot_f32_avx2 (U = 4), dot_f16_f32_avx2 and
// dot_w_bf16 (U = 2).
template <class Load, int U, int MRows, int NCols>
struct FloatTile : StreamedColumns<FloatTile<Load, U, MRows, NCols>> {
  static constexpr int kRows = MRows;
  static constexpr int kCols = NCols;
  using T = typename Load::T;
  using XRow = float;

  // The tile's sums, every kStreamBytes of the first weight row requested ahead through stream
  // (empty but in decode).
  static constexpr size_t kStreamBytes = 256;
  static_assert(kStreamBytes / sizeof(T) % (8 * U) == 0);
  template <int MR, int NR>
  static void columns(const uint8_t* w, size_t ws, const float* const (&b)[MR], size_t n, float* y,
                      size_t ys, const RowStream& stream) {
    const T* a[NR];
    for (int j = 0; j < NR; ++j) a[j] = row_at<T>(w, ws, j);
    __m256 acc[MR][NR][U];
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j)
        for (int u = 0; u < U; ++u) acc[r][j][u] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 * U <= n; i += 8 * U) {
      if (i % (kStreamBytes / sizeof(T)) == 0) {
        stream.request_bytes(reinterpret_cast<const uint8_t*>(a[0] + i), kStreamBytes);
      }
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u) step(a, b, i + 8 * u, u, acc);
    }
    for (; i + 8 <= n; i += 8) step(a, b, i, 0, acc);
    __m256 total[MR][NR];
    for (int r = 0; r < MR; ++r) {
      for (int j = 0; j < NR; ++j) {
        if constexpr (U == 4) {
          total[r][j] = _mm256_add_ps(_mm256_add_ps(acc[r][j][0], acc[r][j][1]),
                                      _mm256_add_ps(acc[r][j][2], acc[r][j][3]));
        } else {
          total[r][j] = _mm256_add_ps(acc[r][j][0], acc[r][j][1]);
        }
      }
    }
    float sums[MR * NR];
    tile_sums<MR, NR>(total, sums);
    for (int r = 0; r < MR; ++r) {
      for (int j = 0; j < NR; ++j) {
        float sum = sums[r * NR + j];
        for (size_t k = i; k < n; ++k) sum += Load::one(a[j][k]) * b[r][k];
        y[r * ys + j] = sum;
      }
    }
  }

  template <int MR, int NR>
  static inline void step(const T* const (&a)[NR], const float* const (&b)[MR], size_t i, int u,
                          __m256 (&acc)[MR][NR][U]) {
    __m256 av[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) av[j] = Load::full(a[j] + i);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 bv = _mm256_loadu_ps(b[r] + i);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[r][j][u] = _mm256_fmadd_ps(av[j], bv, acc[r][j][u]);
    }
  }
};

struct Q8Weights {
  using Block = BlockQ8_0;
  static constexpr bool kMinimum = false;
  static constexpr bool kUnsigned = false;
  static __m256i values(const Block& b) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
  }
};

// The 32 nibbles of a q4_0-packed block in element order (low nibbles, then high ones).
inline __m256i nibbles(const uint8_t* qs) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

// The nibbles of two q4_0-packed blocks a and b as the pair path takes them: lo holds values
// 0-15 of a, then of b; hi values 16-31 of each.
inline void nibble_pair(const uint8_t* qs_a, const uint8_t* qs_b, __m256i& lo, __m256i& hi) {
  const __m256i packed = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs_b)),
                                          _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs_a)));
  lo = _mm256_and_si256(packed, _mm256_set1_epi8(0x0f));
  hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), _mm256_set1_epi8(0x0f));
}

// unpack_fifth_bits of two blocks' qh laid as nibble_pair lays their values, or-ed into lo, hi.
inline void add_fifth_bit_pair(const uint8_t* qh_a, const uint8_t* qh_b, __m256i& lo, __m256i& hi) {
  const __m256i bits = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_cvtsi32_si128(static_cast<int>(load_u32_le(qh_a)))),
      _mm_cvtsi32_si128(static_cast<int>(load_u32_le(qh_b))), 1);
  // Values 0-15 read bytes 0-1 of their block's four, values 16-31 bytes 2-3.
  const __m256i low_spread =
      _mm256_shuffle_epi8(bits, _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0,
                                                 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
  const __m256i high_spread =
      _mm256_shuffle_epi8(bits, _mm256_setr_epi8(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 2,
                                                 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  lo = _mm256_or_si256(lo, sixteen_where_bit_set(low_spread));
  hi = _mm256_or_si256(hi, sixteen_where_bit_set(high_spread));
}

// GroupedInt multiplies q4_0's nibbles as they are (w + 8: maddubs cannot saturate below 16)
// and takes 8 times the activations' block sums off each block's int32, one operation per
// block where the sign of every weight would cost one per vector.
struct Q4Weights {
  using Block = BlockQ4_0;
  static constexpr bool kMinimum = false;
  static constexpr bool kUnsigned = true;
  static constexpr int kBias = 8;  // the nibble is w + 8
  static constexpr int kMax = 15;
  static __m256i values(const Block& b) {
    return _mm256_sub_epi8(nibbles(b.qs), _mm256_set1_epi8(8));
  }
  static __m256i unsigned_values(const Block& b) { return nibbles(b.qs); }
  static void pair(const Block& a, const Block& b, __m256i& lo, __m256i& hi) {
    nibble_pair(a.qs, b.qs, lo, hi);
  }
};

// q5_0's values are five bits minus 16: taken unsigned as q4_0's (31 * 127 * 2 < 2^15).
struct Q5Weights {
  using Block = BlockQ5_0;
  static constexpr bool kMinimum = false;
  static constexpr bool kUnsigned = true;
  static constexpr int kBias = 16;  // the five bits are w + 16
  static constexpr int kMax = 31;
  static __m256i values(const Block& b) {
    return _mm256_sub_epi8(unsigned_values(b), _mm256_set1_epi8(16));
  }
  static __m256i unsigned_values(const Block& b) {
    return _mm256_or_si256(nibbles(b.qs), unpack_fifth_bits(b.qh));
  }
  static void pair(const Block& a, const Block& b, __m256i& lo, __m256i& hi) {
    nibble_pair(a.qs, b.qs, lo, hi);
    add_fifth_bit_pair(a.qh, b.qh, lo, hi);
  }
};

// q4_1 and q5_1: value = d q + m, q unsigned (nibbles, five bits) taken as it is; the minimum
// comes in as a second term per block, (m dx) times the block's activation sum (kMinimum).
struct Q41Weights {
  using Block = BlockQ4_1;
  static constexpr bool kUnsigned = true;
  static constexpr bool kMinimum = true;
  static constexpr int kBias = 0;
  static constexpr int kMax = 15;
  static __m256i unsigned_values(const Block& b) { return nibbles(b.qs); }
  static void pair(const Block& a, const Block& b, __m256i& lo, __m256i& hi) {
    nibble_pair(a.qs, b.qs, lo, hi);
  }
};

struct Q51Weights {
  using Block = BlockQ5_1;
  static constexpr bool kUnsigned = true;
  static constexpr bool kMinimum = true;
  static constexpr int kBias = 0;
  static constexpr int kMax = 31;
  static __m256i unsigned_values(const Block& b) {
    return _mm256_or_si256(nibbles(b.qs), unpack_fifth_bits(b.qh));
  }
  static void pair(const Block& a, const Block& b, __m256i& lo, __m256i& hi) {
    nibble_pair(a.qs, b.qs, lo, hi);
    add_fifth_bit_pair(a.qh, b.qh, lo, hi);
  }
};

// A laid-out group's eight minima, for weights that have them (none otherwise).
template <bool kMinimum>
struct GroupMinima {};
template <>
struct GroupMinima<true> {
  float m[8];
};

// iq4_nl: q4_0's nibbles looked up in the table of levels (in both 128-bit lanes).
struct IQ4NLWeights {
  using Block = BlockIQ4_NL;
  static constexpr bool kMinimum = false;
  static constexpr bool kUnsigned = false;
  static __m256i levels() {
    return _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlValues)));
  }
  static __m256i values(const Block& b) { return _mm256_shuffle_epi8(levels(), nibbles(b.qs)); }
  static void pair(const Block& a, const Block& b, __m256i& lo, __m256i& hi) {
    nibble_pair(a.qs, b.qs, lo, hi);
    lo = _mm256_shuffle_epi8(levels(), lo);
    hi = _mm256_shuffle_epi8(levels(), hi);
  }
};

// Integer weights against q8_0 activations, eight weight rows to a vector: the values of eight
// rows are laid side by side (each 32-bit lane one row's four consecutive values), so that the
// products of a block reduce to one exact int32 per row and lane in two integer additions per
// vector, and the float work of a block (convert, scale, add) is shared by eight rows. In a
// row-major tile the block's int32 sums lie across the lanes of each output's own vector and
// every output pays that float work itself: six operations per 32 products where this pays
// about four and a half (sign, maddubs, madd, add and a share of the rest); measured on the
// tile alone, 1.5x the products per second. q4_0 needs no sign (its nibbles go in unsigned and
// each block's bias comes off its int32 once), and its small products add in int16 over a
// whole block before one madd widens them (half a block for five-bit values): about two and a
// quarter (TinyLlama pp256 on 2 threads, alternated: q4_0, q4_1, q5_0, q5_1 1.0-1.18x).
//
// The order every output of these types is summed in, whatever computes it (the tile, the
// narrow column, a single dot): a block's products as one exact int32 I_b (at most
// 32 * 128 * 127 in magnitude, so its float is exact); its term P_b = (d_w * d_x) * I_b, two
// rounded products (for weights with a minimum, fma(m_w * d_x, X_b, that), X_b the block's
// activation sum); the terms of each group of eight blocks summed as hsum256 sums its lanes,
// ((P0 + P4) + (P2 + P6)) + ((P1 + P5) + (P3 + P7)), a missing block's term +0; and the groups'
// sums added in block order to a total that starts at +0.
template <class W>
struct GroupedInt {
  using WBlock = typename W::Block;

  // A block's 32 values as the products take them: unsigned (W::kUnsigned) or signed.
  static __m256i laid(const WBlock& b) {
    if constexpr (W::kUnsigned) {
      return W::unsigned_values(b);
    } else {
      return W::values(b);
    }
  }

  // Eight weight rows' block b: their scales (and minima), and vector l holding values
  // 4l..4l+3 of each row (row c in lane c).
  struct Group : GroupMinima<W::kMinimum> {
    float d[8];
    __m256i v[8];
  };

  // Rows [c, c + cols) of w (cols <= 8; the missing rows zero) as groups, a block per group.
  static void lay_out(const uint8_t* w, size_t ws, int cols, size_t blocks, Group* out) {
    const WBlock* rows[8];
    for (int c = 0; c < cols; ++c) rows[c] = row_at<WBlock>(w, ws, c);
    for (size_t b = 0; b < blocks; ++b) {
      __m256i r[8];
      for (int c = 0; c < 8; ++c) r[c] = c < cols ? laid(rows[c][b]) : _mm256_setzero_si256();
      transpose_lanes(r, out[b].v);
      _mm256_store_ps(out[b].d, eight_scales([&](int c) { return c < cols ? rows[c][b].d : 0; }));
      if constexpr (W::kMinimum) {
        _mm256_store_ps(out[b].m, eight_scales([&](int c) { return c < cols ? rows[c][b].m : 0; }));
      }
    }
  }

  // The eight f16 scales d(0), ..., d(7) as floats.
  template <class Scale>
  [[gnu::always_inline]] static inline __m256 eight_scales(Scale d) {
    __m128i h = _mm_cvtsi32_si128(d(0));
    h = _mm_insert_epi16(h, d(1), 1);
    h = _mm_insert_epi16(h, d(2), 2);
    h = _mm_insert_epi16(h, d(3), 3);
    h = _mm_insert_epi16(h, d(4), 4);
    h = _mm_insert_epi16(h, d(5), 5);
    h = _mm_insert_epi16(h, d(6), 6);
    h = _mm_insert_epi16(h, d(7), 7);
    return _mm256_cvtph_ps(h);
  }

  // The f16 field of blocks a[0..7] as floats: gathered four at a time in a general register,
  // whose shifts and ors run beside the vector work, where eight_scales' inserts queue on the
  // shuffle units with the products' (one row of q4_0 from the cache: 1.07-1.11x).
  [[gnu::always_inline]] static inline __m256 eight_block_scales(const WBlock* a,
                                                                 uint16_t WBlock::*field) {
    const auto four = [&](int c) {
      return static_cast<int64_t>(uint64_t{a[c].*field} | uint64_t{a[c + 1].*field} << 16 |
                                  uint64_t{a[c + 2].*field} << 32 |
                                  uint64_t{a[c + 3].*field} << 48);
    };
    return _mm256_cvtph_ps(_mm_set_epi64x(four(4), four(0)));
  }

  // out[l] lane c = in[c] lane l: the 8 x 8 transpose of 32-bit lanes.
  static inline void transpose_lanes(const __m256i (&in)[8], __m256i (&out)[8]) {
    __m256i a[8], b[8];
    for (int i = 0; i < 8; i += 2) {
      a[i] = _mm256_unpacklo_epi32(in[i], in[i + 1]);
      a[i + 1] = _mm256_unpackhi_epi32(in[i], in[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
      b[i] = _mm256_unpacklo_epi64(a[i], a[i + 2]);
      b[i + 1] = _mm256_unpackhi_epi64(a[i], a[i + 2]);
      b[i + 2] = _mm256_unpacklo_epi64(a[i + 1], a[i + 3]);
      b[i + 3] = _mm256_unpackhi_epi64(a[i + 1], a[i + 3]);
    }
    for (int i = 0; i < 4; ++i) {
      out[i] = _mm256_permute2x128_si256(b[i], b[i + 4], 0x20);
      out[i + 4] = _mm256_permute2x128_si256(b[i], b[i + 4], 0x31);
    }
  }

  // The exact int32 sums of four products w x in each lane (maddubs takes |w| unsigned and x
  // with w's sign; no pair sum exceeds 2 * 128 * 127), or of u x for unsigned weights u, whose
  // bias the caller takes off.
  static inline __m256i products(__m256i wq, __m256i wabs, __m256i xq) {
    if constexpr (W::kUnsigned) {
      return dot_u8s8(wq, xq);
    } else {
      return dot_u8s8(wabs, _mm256_sign_epi8(xq, wq));
    }
  }

  // |w|, which products() needs for signed weights only.
  static inline __m256i magnitude(__m256i wq) {
    if constexpr (W::kUnsigned) {
      return wq;
    } else {
      return _mm256_sign_epi8(wq, wq);
    }
  }

  // How many of a block's eight vectors of unsigned weights sum their maddubs pairs in int16
  // before one madd widens them: each pair is at most 2 * W::kMax * 128 in magnitude.
  static constexpr int span() {
    if constexpr (W::kUnsigned) {
      int n = 8;
      while (n * 2 * W::kMax * 128 > 32767) n /= 2;
      return n;
    } else {
      return 1;
    }
  }

  // p[r] lane c = P_b of weight row c and activation row r.
  template <int MR>
  static inline void terms(const Group& g, const NarrowQ8_0Rows<MR>& x, size_t b, __m256 (&p)[MR]) {
    __m256i sums[MR];
    const auto four_of = [&](int r, int l) {
      int32_t four;
      __builtin_memcpy(&four, x.values[r] + 32 * b + 4 * l, 4);
      return _mm256_set1_epi32(four);
    };
    if constexpr (W::kUnsigned) {
      // The same exact int32 as a madd per vector, with one madd per span of them.
      constexpr int kSpan = span();
      __m256i pairs[MR];
#pragma GCC unroll 8
      for (int l = 0; l < 8; ++l) {
        const __m256i wq = _mm256_load_si256(&g.v[l]);
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
          const __m256i q = _mm256_maddubs_epi16(wq, four_of(r, l));
          pairs[r] = l % kSpan == 0 ? q : _mm256_add_epi16(pairs[r], q);
        }
        if ((l + 1) % kSpan != 0) continue;
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
          const __m256i q = _mm256_madd_epi16(pairs[r], _mm256_set1_epi16(1));
          sums[r] = l + 1 == kSpan ? q : _mm256_add_epi32(sums[r], q);
        }
      }
    } else {
#pragma GCC unroll 8
      for (int l = 0; l < 8; ++l) {
        const __m256i wq = _mm256_load_si256(&g.v[l]);
        const __m256i wabs = magnitude(wq);
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
          const __m256i q = products(wq, wabs, four_of(r, l));
          sums[r] = l == 0 ? q : _mm256_add_epi32(sums[r], q);
        }
      }
    }
    if constexpr (W::kUnsigned && !W::kMinimum) {
      for (int r = 0; r < MR; ++r) {
        sums[r] = _mm256_add_epi32(sums[r], _mm256_set1_epi32(x.sums[r][b]));
      }
    }
    const __m256 dw = _mm256_load_ps(g.d);
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      p[r] = _mm256_mul_ps(_mm256_mul_ps(dw, _mm256_set1_ps(x.scales[r][b])),
                           _mm256_cvtepi32_ps(sums[r]));
    }
    if constexpr (W::kMinimum) {
      const __m256 mw = _mm256_load_ps(g.m);
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) {
        p[r] = _mm256_fmadd_ps(_mm256_mul_ps(mw, _mm256_set1_ps(x.scales[r][b])),
                               _mm256_set1_ps(static_cast<float>(x.sums[r][b])), p[r]);
      }
    }
  }

  // Block b's terms, or +0 past the last block.
  template <int MR>
  static inline void terms_or_zero(const Group* g, const NarrowQ8_0Rows<MR>& x, size_t b,
                                   size_t blocks, __m256 (&p)[MR]) {
    if (b < blocks) return terms<MR>(g[b], x, b, p);
    for (int r = 0; r < MR; ++r) p[r] = _mm256_setzero_ps();
  }

  // y[r * ys + c] for MR activation rows and the cols weight rows of groups g.
  template <int MR>
  static void tile(const Group* g, size_t blocks, const NarrowQ8_0Rows<MR>& x, int cols, float* y,
                   size_t ys) {
    __m256 total[MR];
    for (int r = 0; r < MR; ++r) total[r] = _mm256_setzero_ps();
    for (size_t t = 0; t < blocks; t += 8) {
      __m256 p[MR], q[MR], half0[MR], half1[MR];
      terms_or_zero<MR>(g, x, t, blocks, p);
      terms_or_zero<MR>(g, x, t + 4, blocks, q);
      for (int r = 0; r < MR; ++r) half0[r] = _mm256_add_ps(p[r], q[r]);
      terms_or_zero<MR>(g, x, t + 2, blocks, p);
      terms_or_zero<MR>(g, x, t + 6, blocks, q);
      for (int r = 0; r < MR; ++r) half0[r] = _mm256_add_ps(half0[r], _mm256_add_ps(p[r], q[r]));
      terms_or_zero<MR>(g, x, t + 1, blocks, p);
      terms_or_zero<MR>(g, x, t + 5, blocks, q);
      for (int r = 0; r < MR; ++r) half1[r] = _mm256_add_ps(p[r], q[r]);
      terms_or_zero<MR>(g, x, t + 3, blocks, p);
      terms_or_zero<MR>(g, x, t + 7, blocks, q);
      for (int r = 0; r < MR; ++r) {
        half1[r] = _mm256_add_ps(half1[r], _mm256_add_ps(p[r], q[r]));
        total[r] = _mm256_add_ps(total[r], _mm256_add_ps(half0[r], half1[r]));
      }
    }
    for (int r = 0; r < MR; ++r) {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, total[r]);
      for (int c = 0; c < cols; ++c) y[r * ys + c] = lanes[c];
    }
  }

  // What the activation rows' block sums are multiplied by: -bias where the weights go in
  // unsigned (their value plus the bias), so that adding them corrects each block's int32.
  static constexpr int32_t bias_factor() {
    if constexpr (W::kMinimum) {
      return 1;  // the plain sums, for the minimum's term
    } else if constexpr (W::kUnsigned) {
      return -W::kBias;
    } else {
      return 0;
    }
  }

  // All bits set in lanes 0..count-1, as maskload wants them.
  static inline __m256i lanes_below(int count) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }

  // Whether W lays two blocks' values at once (pair()): the nibble types, whose narrow column
  // then takes its activation rows with paired groups (narrow_q8_0_rows).
  static constexpr bool kPaired = requires(const WBlock& b, __m256i& v) {
    W::pair(b, b, v, v);
  };

  // group_sums' int32 sums of a whole group before the bias, for kPaired weights, two blocks (t+p,
  // t+p+4) to a vector: a 128-bit lane's four int32 are one block's eight products each (unsigned
  // values below 32 add their two maddubs pairs as int16, below 2 * 2 * 31 * 127), so hadd of hadd
  // puts block t+j in lane j. One unpack and one madd per two blocks, three hadd per group, against
  // two and six. One thread, one activation row, rows of 2,048 from the cache: q4_0 18.7 -> 24.3
  // GB/s, q4_1 18.0 -> 22.5, q5_0 15.5 -> 18.0, q5_1 15.2 -> 18.1, iq4_nl 13.3 -> 17.3; 512 MiB
  // of 5,632-wide rows from memory: q4_0 17.2 -> 22.9, q4_1 17.2 -> 21.4, iq4_nl 13.5 -> 17.3.
  template <int MR>
  [[gnu::always_inline]] static inline void paired_group_sums(const WBlock* a,
                                                              const NarrowQ8_0Rows<MR>& x, size_t t,
                                                              __m256i (&sums)[MR]) {
    __m256i v[4][MR];
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      __m256i lo, hi;
      W::pair(a[t + p], a[t + p + 4], lo, hi);
      const __m256i lo_abs = magnitude(lo);
      const __m256i hi_abs = magnitude(hi);
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) {
        const auto* xq = reinterpret_cast<const __m256i*>(x.values[r] + 32 * t + 64 * p);
        const __m256i x_lo = _mm256_load_si256(xq);
        const __m256i x_hi = _mm256_load_si256(xq + 1);
        if constexpr (W::kUnsigned) {
          v[p][r] = _mm256_madd_epi16(
              _mm256_add_epi16(_mm256_maddubs_epi16(lo, x_lo), _mm256_maddubs_epi16(hi, x_hi)),
              _mm256_set1_epi16(1));
        } else {
          v[p][r] = _mm256_add_epi32(products(lo, lo_abs, x_lo), products(hi, hi_abs, x_hi));
        }
      }
    }
    for (int r = 0; r < MR; ++r) {
      sums[r] = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0][r], v[1][r]),
                                  _mm256_hadd_epi32(v[2][r], v[3][r]));
    }
  }

  // group_sums' int32 sums before the bias, each block's eight lanes reduced by pairs of blocks,
  // then pairs of pairs, then the two 128-bit halves.
  template <int MR>
  [[gnu::always_inline]] static inline void unpaired_group_sums(const WBlock* a,
                                                                const NarrowQ8_0Rows<MR>& x,
                                                                size_t t, int count,
                                                                __m256i (&sums)[MR]) {
    __m256i quads[2][MR];
#pragma GCC unroll 2
    for (int quad = 0; quad < 2; ++quad) {
      __m256i pairs[2][MR];
#pragma GCC unroll 2
      for (int pair = 0; pair < 2; ++pair) {
        __m256i v[2][MR];
#pragma GCC unroll 2
        for (int k = 0; k < 2; ++k) {
          const int j = 4 * quad + 2 * pair + k;
          if (j >= count) {
            for (int r = 0; r < MR; ++r) v[k][r] = _mm256_setzero_si256();
            continue;
          }
          const __m256i wq = laid(a[t + j]);
          const __m256i wabs = magnitude(wq);
#pragma GCC unroll 4
          for (int r = 0; r < MR; ++r) {
            const auto* xq = reinterpret_cast<const __m256i*>(x.values[r] + 32 * (t + j));
            v[k][r] = products(wq, wabs, _mm256_load_si256(xq));
          }
        }
        for (int r = 0; r < MR; ++r) pairs[pair][r] = _mm256_hadd_epi32(v[0][r], v[1][r]);
      }
      for (int r = 0; r < MR; ++r) quads[quad][r] = _mm256_hadd_epi32(pairs[0][r], pairs[1][r]);
    }
    for (int r = 0; r < MR; ++r) {
      sums[r] = _mm256_add_epi32(_mm256_permute2x128_si256(quads[0][r], quads[1][r], 0x20),
                                 _mm256_permute2x128_si256(quads[0][r], quads[1][r], 0x31));
    }
  }

  // The int32 sums of blocks t..t+7 of one row-major weight row against MR activation rows,
  // lane j block t + j (0 past count blocks), with the activations' scaled block sums added
  // where the weights go in unsigned with a bias: a whole group of kPaired weights through
  // paired_group_sums, others through unpaired_group_sums.
  template <int MR>
  [[gnu::always_inline]] static inline void group_sums(const WBlock* a, const NarrowQ8_0Rows<MR>& x,
                                                       size_t t, int count, __m256i (&sums)[MR]) {
    if constexpr (kPaired) {
      if (count == 8) {
        paired_group_sums<MR>(a, x, t, sums);
      } else {
        unpaired_group_sums<MR>(a, x, t, count, sums);
      }
    } else {
      unpaired_group_sums<MR>(a, x, t, count, sums);
    }
    if constexpr (W::kUnsigned && !W::kMinimum) {
      const __m256i present = lanes_below(count);
      for (int r = 0; r < MR; ++r) {
        const __m256i block_sums =
            count == 8 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.sums[r] + t))
                       : _mm256_maskload_epi32(x.sums[r] + t, present);
        sums[r] = _mm256_add_epi32(sums[r], block_sums);
      }
    }
  }

  // total[r] += the sum of the terms of blocks t..t+count-1, as hsum256 sums its lanes.
  template <int MR>
  [[gnu::always_inline]] static inline void add_group(const WBlock* a, const NarrowQ8_0Rows<MR>& x,
                                                      size_t t, int count, float (&total)[MR]) {
    __m256i sums[MR];
    group_sums<MR>(a, x, t, count, sums);
    const __m256 dw = count == 8 ? eight_block_scales(a + t, &WBlock::d)
                                 : eight_scales([&](int j) { return j < count ? a[t + j].d : 0; });
    __m256 mw = _mm256_setzero_ps();
    if constexpr (W::kMinimum) {
      mw = count == 8 ? eight_block_scales(a + t, &WBlock::m)
                      : eight_scales([&](int j) { return j < count ? a[t + j].m : 0; });
    }
    const __m256i present = lanes_below(count);
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      const __m256 dx = count == 8 ? _mm256_loadu_ps(x.scales[r] + t)
                                   : _mm256_maskload_ps(x.scales[r] + t, present);
      __m256 p = _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(sums[r]));
      if constexpr (W::kMinimum) {
        const __m256i xsums =
            count == 8 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.sums[r] + t))
                       : _mm256_maskload_epi32(x.sums[r] + t, present);
        p = _mm256_fmadd_ps(_mm256_mul_ps(mw, dx), _mm256_cvtepi32_ps(xsums), p);
      }
      total[r] += hsum256(p);
    }
  }

  // One weight row against MR activation rows, row-major, with the tiles' order: a group's
  // eight blocks reduce to one vector whose lane j is block j's I_b, and hsum256 itself sums
  // the group's terms.
  template <int MR>
  static void narrow_column(const uint8_t* w, const NarrowQ8_0Rows<MR>& x, size_t n, float* y,
                            size_t ys, const RowStream& stream) {
    const auto* a = reinterpret_cast<const WBlock*>(w);
    const size_t blocks = n / 32;
    float total[MR] = {};
    size_t t = 0;
    for (; t + 8 <= blocks; t += 8) {
      stream.request_bytes(reinterpret_cast<const uint8_t*>(a + t), 8 * sizeof(WBlock));
      add_group<MR>(a, x, t, 8, total);
    }
    if (t < blocks) {
      stream.request_bytes(reinterpret_cast<const uint8_t*>(a + t), (blocks - t) * sizeof(WBlock));
      add_group<MR>(a, x, t, static_cast<int>(blocks - t), total);
    }
    for (int r = 0; r < MR; ++r) y[r * ys] = total[r];
  }

  // narrow_column for each of the n_w weight rows, in address order.
  template <int MR>
  static void narrow(const uint8_t* w, size_t ws, size_t n_w, const uint8_t* x, size_t xs, size_t n,
                     float* y, size_t ys) {
    const uint8_t* rows[MR];
    for (int r = 0; r < MR; ++r) rows[r] = x + r * xs;
    const NarrowQ8_0Rows<MR> prepared(rows, n);
    const RowStream stream = {w + n_w * ws};
    for (size_t c = 0; c < n_w; ++c) narrow_column<MR>(w + c * ws, prepared, n, y + c, ys, stream);
  }

  // tile<MR> for MR activation rows against every group of a chunk, pass `pass` of them, each
  // group requesting its slice of the next chunk (NextChunk), which laying that chunk out then
  // reads from the cache instead of stalling on memory with no work to overlap.
  template <int MR>
  static void tile_rows(const Group* groups, size_t n_groups, size_t blocks, size_t cols,
                        const uint8_t* x, size_t xs, size_t n, float* y, size_t ys,
                        const NextChunk& next, size_t pass) {
    const uint8_t* rows[MR];
    for (int r = 0; r < MR; ++r) rows[r] = x + r * xs;
    const NarrowQ8_0Rows<MR> prepared(rows, n);
    for (size_t g = 0; g < n_groups; ++g) {
      const int in_group = cols - 8 * g < 8 ? static_cast<int>(cols - 8 * g) : 8;
      tile<MR>(groups + g * blocks, blocks, prepared, in_group, y + 8 * g, ys);
      next.request(pass * n_groups + g);
    }
  }

  // The largest laid-out group (eight rows) group_major takes: two thirds of a 48 KiB
  // first-level cache, the rest left to the activation rows streaming past it (rows of 3,584
  // values or fewer).
  static constexpr size_t kGroupMajorBytes = 32 * 1024;

  // Whether a call suits group_major: its laid-out group within kGroupMajorBytes and its n_x
  // activation rows (xs bytes apart) within kGemmChunkBytes (batched decode, not prefill).
  static bool group_major_fits(size_t blocks, size_t n_x, size_t xs) {
    return blocks * sizeof(Group) <= kGroupMajorBytes && n_x * xs <= kGemmChunkBytes;
  }

  // Tiles in group-major order: each group of eight weight rows laid out once and every tile run
  // over it while it sits in the first-level cache, the rows of the group two ahead requested
  // meanwhile, a slice with each tile. Against the chunks below (a quarter of a megabyte of
  // weight rows laid out at a time, every tile streaming them from the second-level cache) each
  // tile reads a quarter of the bytes from there: one thread, 768-value rows, 1.06x for 16
  // activation rows, 1.09x for 8; 2,048-value rows 1.05x for 16. Prefill-sized calls, which
  // would lay each group out again for every block of rows that fits, gained nothing in the
  // model and stay in chunks.
  static void group_major(const uint8_t* wb, size_t ws, size_t n_w, const uint8_t* xr, size_t xs,
                          size_t n_x, size_t n, float* y, size_t ys) {
    const size_t blocks = n / 32;
    auto* group = reinterpret_cast<Group*>(gemm_weight_scratch(blocks * sizeof(Group)));
    const size_t n_groups = (n_w + 7) / 8;
    const size_t tiles = (n_x + 1) / 2;
    for (size_t g = 0; g < n_groups; ++g) {
      const int in_group = n_w - 8 * g < 8 ? static_cast<int>(n_w - 8 * g) : 8;
      lay_out(wb + 8 * g * ws, ws, in_group, blocks, group);
      const size_t ahead_row = 8 * (g + 2);
      const uint8_t* ahead = ahead_row < n_w ? wb + ahead_row * ws : nullptr;
      const size_t ahead_bytes = ahead ? std::min<size_t>(8, n_w - ahead_row) * ws : 0;
      size_t r = 0;
      for (; r + 2 <= n_x; r += 2) {
        const uint8_t* rows[2] = {xr + r * xs, xr + (r + 1) * xs};
        tile<2>(group, blocks, NarrowQ8_0Rows<2>(rows, n), in_group, y + r * ys + 8 * g, ys);
        prefetch_lines(ahead, ahead_bytes * (r / 2) / tiles, ahead_bytes * (r / 2 + 1) / tiles);
      }
      if (r < n_x) {
        const uint8_t* rows[1] = {xr + r * xs};
        tile<1>(group, blocks, NarrowQ8_0Rows<1>(rows, n), in_group, y + r * ys + 8 * g, ys);
        prefetch_lines(ahead, ahead_bytes * (r / 2) / tiles, ahead_bytes);
      }
    }
  }

  // The table's GemmFn. Calls of at most kGemmNarrowRows activation rows read each weight row
  // once, in address order; larger ones lay out weight rows as groups and run tiles of two
  // activation rows over them: group by group (group_major) where a group and the activation
  // rows fit the caches, else a chunk of groups at a time (once, for every activation row).
  static void gemm(const void* w, size_t w_stride, size_t n_w, const void* x, size_t x_stride,
                   size_t n_x, size_t n, float* y, size_t y_stride) {
    const auto* wb = static_cast<const uint8_t*>(w);
    size_t xs = 0;
    const uint8_t* xr = narrow_q8_0_rows(static_cast<const uint8_t*>(x), x_stride, n_x, n, &xs,
                                         bias_factor(), kPaired && n_x <= kGemmNarrowRows);
    switch (n_x) {
      case 1:
        return narrow<1>(wb, w_stride, n_w, xr, xs, n, y, y_stride);
      case 2:
        return narrow<2>(wb, w_stride, n_w, xr, xs, n, y, y_stride);
      case 3:
        return narrow<3>(wb, w_stride, n_w, xr, xs, n, y, y_stride);
      case 4:
        return narrow<4>(wb, w_stride, n_w, xr, xs, n, y, y_stride);
      default:
        static_assert(kGemmNarrowRows == 4);
        break;
    }
    const size_t blocks = n / 32;
    if (group_major_fits(blocks, n_x, xs)) {
      return group_major(wb, w_stride, n_w, xr, xs, n_x, n, y, y_stride);
    }
    const size_t chunk_groups = std::max<size_t>(1, kGemmChunkBytes / (8 * w_stride));
    auto* groups =
        reinterpret_cast<Group*>(gemm_weight_scratch(chunk_groups * blocks * sizeof(Group)));
    for (size_t c0 = 0; c0 < n_w; c0 += 8 * chunk_groups) {
      const size_t cols = std::min(n_w - c0, 8 * chunk_groups);
      const size_t n_groups = (cols + 7) / 8;
      for (size_t g = 0; g < n_groups; ++g) {
        const int in_group = cols - 8 * g < 8 ? static_cast<int>(cols - 8 * g) : 8;
        lay_out(wb + (c0 + 8 * g) * w_stride, w_stride, in_group, blocks, groups + g * blocks);
      }
      const size_t next_c0 = c0 + cols;
      const NextChunk next = {next_c0 < n_w ? wb + next_c0 * w_stride : nullptr,
                              std::min(n_w - next_c0, 8 * chunk_groups) * w_stride,
                              (n_x + 1) / 2 * n_groups};
      size_t r = 0;
      for (; r + 2 <= n_x; r += 2) {
        tile_rows<2>(groups, n_groups, blocks, cols, xr + r * xs, xs, n, y + r * y_stride + c0,
                     y_stride, next, r / 2);
      }
      if (r < n_x) {
        tile_rows<1>(groups, n_groups, blocks, cols, xr + r * xs, xs, n, y + r * y_stride + c0,
                     y_stride, next, r / 2);
      }
    }
  }
};

}  // namespace

const GemmTable* avx2_gemm() {
  static const GemmTable table = {{
      gemm_tiled<FloatTile<LoadF32, 4, 3, 1>>,
      gemm_tiled<FloatTile<LoadF16, 2, 2, 3>>,
      gemm_tiled<FloatTile<LoadBf16, 2, 2, 3>>,
      GroupedInt<Q8Weights>::gemm,
      GroupedInt<Q4Weights>::gemm,
      GroupedInt<Q41Weights>::gemm,
      GroupedInt<Q5Weights>::gemm,
      GroupedInt<Q51Weights>::gemm,
      gemm_tiled<KQuantTile256<UnpackQ2_K, 3, 2>>,
      gemm_tiled<KQuantTile256<UnpackQ3_K, 3, 2>>,
      gemm_tiled<KQuantTile256<UnpackQ4_K, 3, 2>>,
      gemm_tiled<KQuantTile256<UnpackQ5_K, 3, 2>>,
      gemm_tiled<KQuantTile256<UnpackQ6_K, 3, 2>>,
      GroupedInt<IQ4NLWeights>::gemm,
  }};
  return &table;
}

}  // namespace kvc::kernels

#pragma GCC pop_options
#else
namespace kvc::kernels {
const GemmTable* avx2_gemm() {
  return nullptr;
}
}  // namespace kvc::kernels
#endif
