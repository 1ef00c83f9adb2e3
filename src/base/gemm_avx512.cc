// AVX-512 (F, BW, VL, DQ, VNNI) GEMM micro-kernels: a tile of activation rows against a tile
// of weight rows, every output summed with exactly the operations, lanes and order of the
// single-row dot in kernels_avx512.cc (f32, f16, bf16; the other types' single row is their
// narrow column or tile of one), so a row's result does not depend on its tile.
#include <immintrin.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "base/dtype.h"
#include "base/gemm_amx.h"
#include "base/gemm_table.h"
#include "base/prefetch_lines.h"
#include "base/quant_blocks.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")

namespace kvc::kernels {
namespace {

#include "base/simd_reduce.h"
#include "base/simd_reduce_avx512.h"

#include "base/gemm_tiles.h"

#include "base/gemm_narrow_rows.h"

#include "base/gather_scales_avx512.h"

#include "base/quant_unpack.h"

// The K tiles load unpacked bytes 64 at a time.
inline void store_q_pair(uint8_t* q, __m256i lo, __m256i hi) {
  _mm512_store_si512(q, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
}

#include "base/gemm_unpacked.h"

inline __mmask16 tail_mask(size_t count) {
  return static_cast<__mmask16>((1u << count) - 1);
}

template <class T>
const T* row_at(const uint8_t* base, size_t stride, int index) {
  return reinterpret_cast<const T*>(base + static_cast<size_t>(index) * stride);
}

// Sixteen f32 weights by one 64-byte load, or by two 32-byte halves for rows that start 32
// bytes into a cache line (a GGUF's data is only 32-byte aligned), where each whole load would
// span two lines (an interleaved measurement of TinyLlama-shaped GEMVs: 1.26x faster aligned
// on one thread, 1.10x on two). The same values either way.
struct WholeLoad {
  static __m512 load(const float* p) { return _mm512_loadu_ps(p); }
};
struct HalvesLoad {
  static __m512 load(const float* p) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(p)), _mm256_loadu_ps(p + 8),
                              1);
  }
};

// f32 weights: four accumulators per output over 64-element steps, as dot_f32_avx512.
template <class WLoad>
struct F32Tile : StreamedColumns<F32Tile<WLoad>> {
  static constexpr int kRows = 2;
  static constexpr int kCols = 3;
  using XRow = float;

  // The tile's sums, each 64 values (256 bytes) of the first weight row requested ahead through
  // stream (empty but in decode).
  template <int MR, int NR>
  static void columns(const uint8_t* w, size_t ws, const float* const (&b)[MR], size_t n, float* y,
                      size_t ys, const RowStream& stream) {
    const float* a[NR];
    for (int j = 0; j < NR; ++j) a[j] = row_at<float>(w, ws, j);
    __m512 acc[MR][NR][4];
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j)
        for (int u = 0; u < 4; ++u) acc[r][j][u] = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
      stream.request_bytes(reinterpret_cast<const uint8_t*>(a[0] + i), 64 * sizeof(float));
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) step(a, b, i + 16 * u, u, acc);
    }
    for (; i + 16 <= n; i += 16) step(a, b, i, 0, acc);
    if (i < n) {
      const __mmask16 m = tail_mask(n - i);
      __m512 av[NR];
      for (int j = 0; j < NR; ++j) av[j] = _mm512_maskz_loadu_ps(m, a[j] + i);
      for (int r = 0; r < MR; ++r) {
        const __m512 bv = _mm512_maskz_loadu_ps(m, b[r] + i);
        for (int j = 0; j < NR; ++j) acc[r][j][1] = _mm512_fmadd_ps(av[j], bv, acc[r][j][1]);
      }
    }
    __m512 total[MR][NR];
    for (int r = 0; r < MR; ++r) {
      for (int j = 0; j < NR; ++j) {
        total[r][j] = _mm512_add_ps(_mm512_add_ps(acc[r][j][0], acc[r][j][1]),
                                    _mm512_add_ps(acc[r][j][2], acc[r][j][3]));
      }
    }
    store_sums<MR, NR>(total, y, ys);
  }

  template <int MR, int NR>
  static inline void step(const float* const (&a)[NR], const float* const (&b)[MR], size_t i, int u,
                          __m512 (&acc)[MR][NR][4]) {
    __m512 av[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) av[j] = WLoad::load(a[j] + i);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 bv = _mm512_loadu_ps(b[r] + i);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[r][j][u] = _mm512_fmadd_ps(av[j], bv, acc[r][j][u]);
    }
  }
};

struct LoadF16 {
  static __m512 full(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m512 masked(__mmask16 m, const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  }
};

struct LoadBf16 {
  static __m512 widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static __m512 full(const uint16_t* p) {
    return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m512 masked(__mmask16 m, const uint16_t* p) {
    return widen(_mm256_maskz_loadu_epi16(m, p));
  }
};

// f16 and bf16 weights: two accumulators per output over 32-element steps, as
// dot_f16_f32_avx512 and dot_w_bf16.
template <class Load>
struct Half16Tile : StreamedColumns<Half16Tile<Load>> {
  static constexpr int kRows = 3;
  static constexpr int kCols = 4;
  using XRow = float;

  // The tile's sums, every kStreamValues values of the first weight row requested ahead
  // through stream (empty but in decode).
  static constexpr size_t kStreamValues = 128;
  template <int MR, int NR>
  static void columns(const uint8_t* w, size_t ws, const float* const (&b)[MR], size_t n, float* y,
                      size_t ys, const RowStream& stream) {
    const uint16_t* a[NR];
    for (int j = 0; j < NR; ++j) a[j] = row_at<uint16_t>(w, ws, j);
    __m512 acc[MR][NR][2];
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) acc[r][j][0] = acc[r][j][1] = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
      if (i % kStreamValues == 0) {
        stream.request_bytes(reinterpret_cast<const uint8_t*>(a[0] + i),
                             kStreamValues * sizeof(uint16_t));
      }
      step(a, b, i, 0, acc);
      step(a, b, i + 16, 1, acc);
    }
    for (; i + 16 <= n; i += 16) step(a, b, i, 0, acc);
    if (i < n) {
      const __mmask16 m = tail_mask(n - i);
      __m512 av[NR];
      for (int j = 0; j < NR; ++j) av[j] = Load::masked(m, a[j] + i);
      for (int r = 0; r < MR; ++r) {
        const __m512 bv = _mm512_maskz_loadu_ps(m, b[r] + i);
        for (int j = 0; j < NR; ++j) acc[r][j][1] = _mm512_fmadd_ps(av[j], bv, acc[r][j][1]);
      }
    }
    __m512 total[MR][NR];
    for (int r = 0; r < MR; ++r) {
      for (int j = 0; j < NR; ++j) total[r][j] = _mm512_add_ps(acc[r][j][0], acc[r][j][1]);
    }
    store_sums<MR, NR>(total, y, ys);
  }

  template <int MR, int NR>
  static inline void step(const uint16_t* const (&a)[NR], const float* const (&b)[MR], size_t i,
                          int u, __m512 (&acc)[MR][NR][2]) {
    __m512 av[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) av[j] = Load::full(a[j] + i);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 bv = _mm512_loadu_ps(b[r] + i);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[r][j][u] = _mm512_fmadd_ps(av[j], bv, acc[r][j][u]);
    }
  }
};

inline __m512i join(__m256i lo, __m256i hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

inline __m256i load256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// Adds the 32 lanes of a and b (a's 16, then b's) in neighbouring pairs: lane i of the result
// is lanes 2i and 2i + 1 of the pair (exact: int32 sums of products that cannot overflow).
inline __m512i fold_pairs(__m512i a, __m512i b) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  return _mm512_add_epi32(_mm512_permutex2var_epi32(a, even, b),
                          _mm512_permutex2var_epi32(a, odd, b));
}

// Sixteen blocks' exact int32 sums, lane i block i, from dpbusd's results over their eight
// pairs (pair p: lanes 0-7 sums of four products of block 2p, lanes 8-15 of block 2p + 1),
// folded four pairs at a time: half[0] holds blocks 0-7 at two lanes each, half[1] blocks 8-15.
inline __m512i fold_four_pairs(const __m512i (&d)[4]) {
  return fold_pairs(fold_pairs(d[0], d[1]), fold_pairs(d[2], d[3]));
}

// The permutes' indices, lane by lane, of Q8Tile::transposed_weights: plain data, built by the
// compiler.
struct TransposeIndex {
  alignas(64) int32_t first[2][16];
  alignas(64) int32_t second[2][16];
  alignas(64) int32_t third[2][16];
};

constexpr TransposeIndex make_transpose_index() {
  TransposeIndex t{};
  for (int a = 0; a < 2; ++a) {
    // lane 4 k2 + 2 p + h <- pair p's dword 8 h + 4 a + k2
    for (int k2 = 0; k2 < 4; ++k2)
      for (int pp = 0; pp < 2; ++pp)
        for (int h = 0; h < 2; ++h) t.first[a][4 * k2 + 2 * pp + h] = 16 * pp + 8 * h + 4 * a + k2;
  }
  for (int b = 0; b < 2; ++b) {
    // lane 8 k3 + 4 q + 2 p + h <- v of pair-pair q: lane 4 (2 b + k3) + 2 p + h
    for (int k3 = 0; k3 < 2; ++k3)
      for (int q = 0; q < 2; ++q)
        for (int pp = 0; pp < 2; ++pp)
          for (int h = 0; h < 2; ++h)
            t.second[b][8 * k3 + 4 * q + 2 * pp + h] = 16 * q + 4 * (2 * b + k3) + 2 * pp + h;
  }
  for (int c = 0; c < 2; ++c) {
    // lane l (block l) <- half l / 8's lane 8 c + l % 8
    for (int l = 0; l < 16; ++l) t.third[c][l] = 16 * (l / 8) + 8 * c + l % 8;
  }
  return t;
}

constexpr TransposeIndex kTranspose = make_transpose_index();

// q8_0 weights against q8_0 activations. Every path sums in one order, documented by the
// reference in gemm_test.cc: block b's 32 products as one exact int32 I_b; lane b % 16 of 16
// float lanes takes fma(d_w * d_x, I_b, lane), blocks in increasing order; the lanes summed as
// hsum512. dpbusd multiplies unsigned by signed bytes: decode's narrow column moves each
// weight's sign onto its activation, the tiles take the weights as u = w + 128 (one xor) and
// add -128 sum(x) through dpbusd's accumulator from the prepared row. AMX (gemm_amx.cc) sums
// each block whole in its tile registers and keeps the same lanes: every path gives the bits
// of every other, whatever the batch.
struct Q8Tile {
  static constexpr int kRows = 4;
  static constexpr int kCols = 4;

  static __m512i pair_signed(const BlockQ8_0& b0, const BlockQ8_0& b1) {
    return join(load256(b0.qs), load256(b1.qs));
  }

  // Blocks b and b + 1 of a row of `blocks`, the second zero when b is the last.
  static __m512i pair_at(const BlockQ8_0* a, size_t b, size_t blocks) {
    return b + 1 < blocks ? pair_signed(a[b], a[b + 1]) : _mm512_castsi256_si512(load256(a[b].qs));
  }

  // A prepared activation row, per group of 16 blocks: eight vectors, vector k's lane l the
  // values 4k..4k+3 of block l of the group; then -128 times each block's sum of values; then
  // the blocks' scales as floats (blocks past the row: zero values, sums and scales). So that
  // eight dpbusd into one accumulator give lane l block l's whole sum, with no folding.
  struct GroupX {
    int8_t values[8][64];
    int32_t bias[16];
    float scales[16];
  };

  static const uint8_t* prepare(const uint8_t* x, size_t x_stride, size_t n_x, size_t n,
                                size_t* stride) {
    const size_t blocks = n / 32;
    const size_t groups = (blocks + 15) / 16;
    *stride = groups * sizeof(GroupX);
    uint8_t* out = gemm_scratch(*stride * n_x);
    for (size_t r = 0; r < n_x; ++r) {
      const auto* b = row_at<BlockQ8_0>(x, x_stride, static_cast<int>(r));
      auto* gx = reinterpret_cast<GroupX*>(out + r * *stride);
      if (blocks % 16 != 0) {  // blocks past the row: zero values, sums and scales
        std::memset(&gx[groups - 1], 0, sizeof(GroupX));
      }
      for (size_t i = 0; i < blocks; ++i) {
        GroupX& group = gx[i / 16];
        const size_t l = i % 16;
        for (size_t k = 0; k < 8; ++k) std::memcpy(&group.values[k][4 * l], b[i].qs + 4 * k, 4);
        const __m256i sums4 =
            _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), load256(b[i].qs));
        group.bias[l] = -128 * _mm512_reduce_add_epi32(_mm512_zextsi256_si512(sums4));
        group.scales[l] = half(b[i].d);
      }
    }
    return out;
  }

  // Sixteen blocks of one weight row from block g on (fewer at a row's end: the rest zero), as
  // GroupX lays values out: t[k] lane l holds values 4k..4k+3 of block g + l, offset to
  // unsigned (+128).
  static void transposed_weights(const BlockQ8_0* a, size_t g, size_t blocks, __m512i (&t)[8]) {
    __m512i p[8];
    for (int i = 0; i < 8; ++i) {
      const size_t b = g + 2 * static_cast<size_t>(i);
      p[i] = b < blocks ? pair_at(a, b, blocks) : _mm512_setzero_si512();
    }
    // p[i] dword d holds block 2i + d / 8, dword d % 8. Three rounds of two-source permutes:
    // by k's high bit, then its middle bit, then its low bit (TransposeIndex).
    __m512i v[8];
    for (int q = 0; q < 4; ++q) {
      for (int a = 0; a < 2; ++a) {
        v[2 * q + a] = _mm512_permutex2var_epi32(p[2 * q], _mm512_load_si512(kTranspose.first[a]),
                                                 p[2 * q + 1]);
      }
    }
    __m512i u[8];  // u[4 s + 2 a + b]
    for (int s2 = 0; s2 < 2; ++s2) {
      for (int a = 0; a < 2; ++a) {
        for (int b = 0; b < 2; ++b) {
          u[4 * s2 + 2 * a + b] = _mm512_permutex2var_epi32(v[2 * (2 * s2) + a],
                                                            _mm512_load_si512(kTranspose.second[b]),
                                                            v[2 * (2 * s2 + 1) + a]);
        }
      }
    }
    const __m512i offset = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int a = 0; a < 2; ++a) {
      for (int b = 0; b < 2; ++b) {
        for (int c = 0; c < 2; ++c) {
          t[4 * a + 2 * b + c] = _mm512_xor_si512(
              _mm512_permutex2var_epi32(u[2 * a + b], _mm512_load_si512(kTranspose.third[c]),
                                        u[4 + 2 * a + b]),
              offset);
        }
      }
    }
  }

  template <int MR, int NR>
  static void tile(const uint8_t* w, size_t ws, const uint8_t* x, size_t xs, size_t n, float* y,
                   size_t ys) {
    const BlockQ8_0* a[NR];
    const GroupX* gx[MR];
    for (int j = 0; j < NR; ++j) a[j] = row_at<BlockQ8_0>(w, ws, j);
    for (int r = 0; r < MR; ++r) gx[r] = row_at<GroupX>(x, xs, r);
    const size_t blocks = n / 32;
    __m512 acc[MR][NR];
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) acc[r][j] = _mm512_setzero_ps();
    for (size_t g = 0; g < blocks; g += 16) {
      const size_t count = blocks - g < 16 ? blocks - g : 16;
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) {
        __m512i wu[8];
        transposed_weights(a[j], g, blocks, wu);
        const __m512 dw = gather_scales(&a[j][g].d, sizeof(BlockQ8_0), count);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          const GroupX& px = gx[r][g / 16];
          // Exact int32 sums of each block: sum (w + 128) x - 128 sum x.
          __m512i sums = _mm512_load_si512(px.bias);
#pragma GCC unroll 8
          for (int k = 0; k < 8; ++k) {
            sums = _mm512_dpbusd_epi32(sums, wu[k], _mm512_load_si512(px.values[k]));
          }
          const __m512 scale = _mm512_mul_ps(dw, _mm512_load_ps(px.scales));
          acc[r][j] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(sums), acc[r][j]);
        }
      }
    }
    store_sums<MR, NR>(acc, y, ys);
  }

  // Decode's few activation rows (at most kGemmNarrowRows) as narrow_column reads them.
  static const uint8_t* narrow_prepare(const uint8_t* x, size_t x_stride, size_t n_x, size_t n,
                                       size_t* stride) {
    return narrow_q8_0_rows(x, x_stride, n_x, n, stride);
  }

  // narrow_prepare()'s rows against one weight row. Each weight's sign moves onto its
  // activation, |w| * +-x, so dpbusd needs no bias; the int32 sums, exact, are the tiles'.
  // (Activations are quantised to [-127, 127], so negating one never overflows; |-128| is 128
  // as dpbusd's unsigned operand.)
  template <int MR>
  static void narrow_column(const uint8_t* w, const uint8_t* const (&x)[MR], size_t n, float* y,
                            size_t ys, const RowStream& stream) {
    const auto* a = reinterpret_cast<const BlockQ8_0*>(w);
    const NarrowQ8_0Rows<MR> rows(x, n);
    const int8_t* const(&xv)[MR] = rows.values;
    const float* const(&xd)[MR] = rows.scales;
    const size_t blocks = n / 32;
    __m512 acc[MR][1];
    for (int r = 0; r < MR; ++r) acc[r][0] = _mm512_setzero_ps();
    for (size_t g = 0; g < blocks; g += 16) {
      const size_t count = blocks - g < 16 ? blocks - g : 16;
      const __mmask16 present = tail_mask(count);
      stream.request_bytes(reinterpret_cast<const uint8_t*>(a + g), count * sizeof(BlockQ8_0));
      __m512i half_sums[MR][2];
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        __m512i wq[4];
        __mmask64 negative[4];
        for (int p = 0; p < 4; ++p) {
          const size_t b = g + 8 * h + 2 * p;
          const __m512i wv = b < blocks ? pair_at(a, b, blocks) : _mm512_setzero_si512();
          negative[p] = _mm512_movepi8_mask(wv);
          wq[p] = _mm512_abs_epi8(wv);
        }
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
          __m512i d[4];
          for (int p = 0; p < 4; ++p) {
            const size_t b = g + 8 * h + 2 * p;
            // A pair past the row, or the upper half of a last block alone, has zero weights:
            // whatever values the (aligned, in-row) load meets there add nothing.
            const __m512i xq =
                b < blocks ? _mm512_load_si512(xv[r] + 32 * b) : _mm512_setzero_si512();
            const __m512i signed_x =
                _mm512_mask_sub_epi8(xq, negative[p], _mm512_setzero_si512(), xq);
            d[p] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[p], signed_x);
          }
          half_sums[r][h] = fold_four_pairs(d);
        }
      }
      const __m512 dw = gather_scales(&a[g].d, sizeof(BlockQ8_0), count);
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) {
        const __m512i sums = fold_pairs(half_sums[r][0], half_sums[r][1]);
        const __m512 dx = _mm512_maskz_loadu_ps(present, xd[r] + g);
        acc[r][0] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(sums), acc[r][0]);
      }
    }
    float sums[MR];
    tile_sums<MR, 1>(acc, sums);
    for (int r = 0; r < MR; ++r) y[r * ys] = sums[r];
  }
};

// The five types whose blocks hold 16 bytes of packed nibbles (q4_0, iq4_nl, q5_0, q4_1, q5_1)
// four blocks at a time: element e < 16 of block b in byte 16 b + e of one register and element
// e + 16 in the same byte of a second, so that two chained dpbusd give each 32-bit lane the
// exact sum of eight products of one block (lane l: block l / 4) and a block's scales meet its
// four lanes once: one conversion and one fused multiply-add per 128 values where pairs of
// blocks took two (one row from the cache, q4_0: 28 -> 48-54 GB/s). A group's fields are gathered
// 16 bits at a time from its bytes (every field starts at an even offset).
struct Q4FourBlocks {
  using Block = BlockQ4_0;
  static constexpr int kBiasShift = 3;  // u = w + 8, the nibble
  static constexpr bool kMinimum = false, kFifthBit = false, kLevels = false;
};
struct IQ4NLFourBlocks {
  using Block = BlockIQ4_NL;
  static constexpr int kBiasShift = 7;  // u = w + 128, the level looked up unsigned
  static constexpr bool kMinimum = false, kFifthBit = false, kLevels = true;
};
struct Q5FourBlocks {
  using Block = BlockQ5_0;
  static constexpr int kBiasShift = 4;  // u = w + 16, the five bits
  static constexpr bool kMinimum = false, kFifthBit = true, kLevels = false;
};
// value = d q + m with q unsigned: q goes in as it is and the minimum is a second term per lane,
// (m dx) times the lane's activation sum.
struct Q41FourBlocks {
  using Block = BlockQ4_1;
  static constexpr int kBiasShift = 0;
  static constexpr bool kMinimum = true, kFifthBit = false, kLevels = false;
};
struct Q51FourBlocks {
  using Block = BlockQ5_1;
  static constexpr int kBiasShift = 0;
  static constexpr bool kMinimum = true, kFifthBit = true, kLevels = false;
};

template <class W>
struct FourBlockTile : StreamedColumns<FourBlockTile<W>> {
  static constexpr int kRows = 4;
  static constexpr int kCols = 4;
  using Block = typename W::Block;
  static constexpr size_t kGroupBytes = 4 * sizeof(Block);
  static_assert(kGroupBytes > 64 && kGroupBytes <= 128 && sizeof(Block) % 2 == 0);

  // A prepared activation row, four blocks at a time (a short last group's absent blocks all
  // zero): the values in the weights' order, block l / 4's scale in lane l, and the sum of each
  // lane's eight values times -bias (with a minimum: the sum itself, as a float).
  struct GroupX {
    int8_t low[64];
    int8_t high[64];
    float scales[16];
    union {
      int32_t bias[16];
      float sum[16];
    };
  };

  // vpermt2w's word indices into a group as load() reads it, word k of the result taking word
  // word(k) of the field at `offset` of block block(k).
  template <class BlockOf, class WordOf>
  static constexpr std::array<uint16_t, 32> gather(size_t offset, BlockOf block, WordOf word) {
    std::array<uint16_t, 32> index{};
    for (int k = 0; k < 32; ++k) {
      const size_t at = block(k) * sizeof(Block) + offset + 2 * word(k);
      index[k] = static_cast<uint16_t>(at < 64 ? at / 2 : 32 + (at - (kGroupBytes - 32)) / 2);
    }
    return index;
  }
  // The blocks' qs in order.
  static constexpr auto kQsWords = gather(
      offsetof(Block, qs), [](int k) { return k / 8; }, [](int k) { return k % 8; });
  // Without a fifth bit, every block's scale (and minimum) lies in the group's first 64 bytes
  // and takes one single-table vpermw (two-table ones cost more, and the qs need one): words
  // 0-15 block k / 4's scale, 16-31 its minimum (the scale again without one).
  static constexpr auto kScaleWords = gather(
      0, [](int k) { return k % 16 / 4; }, [](int k) { return k >= 16 && W::kMinimum ? 1 : 0; });

  // One group's weights: unsigned values as GroupX's, scales (and minima) per lane.
  struct Group {
    __m512i low, high;
    __m512 d, m;
  };

  // The group at p: its first 64 bytes, and its last 32 (a load that ends at the group's end,
  // within the row) as vpermt2w's second table, words 32-47. (A masked load of the bytes past
  // 64 instead ran the GEMV from memory at 15 GB/s, not 25, on one core: AMD's masked loads
  // wait on their misses.)
  static Group load(const uint8_t* p) {
    const __m512i first = _mm512_loadu_si512(p);
    const __m512i second = _mm512_castsi256_si512(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kGroupBytes - 32)));
    Group g;
    const __m512i q = _mm512_permutex2var_epi16(first, _mm512_loadu_si512(kQsWords.data()), second);
    g.low = _mm512_and_si512(q, _mm512_set1_epi8(0x0f));
    g.high = _mm512_and_si512(_mm512_srli_epi16(q, 4), _mm512_set1_epi8(0x0f));
    if constexpr (W::kFifthBit) {
      // The scales, minima and qh share one two-table permute, each block's field once: words
      // 0-3 the scales, 4-7 the minima (the scales again), 8-11 each block's qh bits for
      // elements 0-15, 12-15 for 16-31.
      static constexpr auto kFieldWords = gather(
          0, [](int k) { return k % 4; },
          [](int k) {
            if (k >= 8) return static_cast<int>(offsetof(Block, qh) / 2) + k / 12;
            return k >= 4 && W::kMinimum ? 1 : 0;
          });
      const __m512i fields =
          _mm512_permutex2var_epi16(first, _mm512_loadu_si512(kFieldWords.data()), second);
      const __m512 dm = _mm512_castps256_ps512(_mm256_cvtph_ps(_mm512_castsi512_si128(fields)));
      const __m512i lane_block = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
      g.d = _mm512_permutexvar_ps(lane_block, dm);
      if constexpr (W::kMinimum) {
        g.m = _mm512_permutexvar_ps(_mm512_add_epi32(lane_block, _mm512_set1_epi32(4)), dm);
      }
      const __m128i qh = _mm512_extracti32x4_epi32(fields, 1);
      const __m512i sixteen = _mm512_set1_epi8(16);
      g.low = _mm512_mask_add_epi8(g.low, _cvtu64_mask64(_mm_cvtsi128_si64(qh)), g.low, sixteen);
      g.high =
          _mm512_mask_add_epi8(g.high, _cvtu64_mask64(_mm_extract_epi64(qh, 1)), g.high, sixteen);
    } else {
      static_assert(3 * sizeof(Block) + 2 * W::kMinimum + 2 <= 64);
      const __m512i scales =
          _mm512_permutexvar_epi16(_mm512_loadu_si512(kScaleWords.data()), first);
      g.d = _mm512_cvtph_ps(_mm512_castsi512_si256(scales));
      if constexpr (W::kMinimum) g.m = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(scales, 1));
    }
    if constexpr (W::kLevels) {
      const __m512i levels = _mm512_xor_si512(
          _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlValues))),
          _mm512_set1_epi8(static_cast<char>(0x80)));
      g.low = _mm512_shuffle_epi8(levels, g.low);
      g.high = _mm512_shuffle_epi8(levels, g.high);
    }
    return g;
  }

  // acc += the group's products with one prepared activation group, lane by lane.
  static __m512 accumulate(const Group& g, const GroupX& x, __m512 acc) {
    const __m512i start = W::kMinimum ? _mm512_setzero_si512() : _mm512_load_si512(x.bias);
    const __m512i dot =
        _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(start, g.low, _mm512_load_si512(x.low)), g.high,
                            _mm512_load_si512(x.high));
    const __m512 dx = _mm512_load_ps(x.scales);
    acc = _mm512_fmadd_ps(_mm512_mul_ps(g.d, dx), _mm512_cvtepi32_ps(dot), acc);
    if constexpr (W::kMinimum) {
      acc = _mm512_fmadd_ps(_mm512_mul_ps(g.m, dx), _mm512_load_ps(x.sum), acc);
    }
    return acc;
  }

  static const uint8_t* prepare(const uint8_t* x, size_t x_stride, size_t n_x, size_t n,
                                size_t* stride) {
    const size_t blocks = n / 32;
    const size_t groups = (blocks + 3) / 4;
    *stride = groups * sizeof(GroupX);
    uint8_t* out = gemm_scratch(*stride * n_x);
    for (size_t r = 0; r < n_x; ++r) {
      const auto* b = row_at<BlockQ8_0>(x, x_stride, static_cast<int>(r));
      auto* gx = reinterpret_cast<GroupX*>(out + r * *stride);
      for (size_t g = 0; g < groups; ++g) {
        GroupX& p = gx[g];
        for (size_t k = 0; k < 4; ++k) {
          const size_t i = 4 * g + k;
          const bool present = i < blocks;
          for (int e = 0; e < 16; ++e) {
            p.low[16 * k + e] = present ? b[i].qs[e] : 0;
            p.high[16 * k + e] = present ? b[i].qs[16 + e] : 0;
          }
          for (size_t l = 0; l < 4; ++l) p.scales[4 * k + l] = present ? half(b[i].d) : 0.0f;
        }
        const __m512i ones = _mm512_set1_epi8(1);
        const __m512i sums = _mm512_dpbusd_epi32(
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_load_si512(p.low)), ones,
            _mm512_load_si512(p.high));
        if constexpr (W::kMinimum) {
          _mm512_store_ps(p.sum, _mm512_cvtepi32_ps(sums));
        } else {
          _mm512_store_si512(p.bias, _mm512_sub_epi32(_mm512_setzero_si512(),
                                                      _mm512_slli_epi32(sums, W::kBiasShift)));
        }
      }
    }
    return out;
  }

  using XRow = GroupX;

  // Decode reads prepare()'s rows.
  static const uint8_t* narrow_prepare(const uint8_t* x, size_t x_stride, size_t n_x, size_t n,
                                       size_t* stride) {
    return prepare(x, x_stride, n_x, n, stride);
  }

  // Weight rows one at a time (each group unpacked once for all MR activation rows), every
  // kStreamGroups groups of the first row requested ahead through stream (empty but in decode).
  static constexpr size_t kStreamGroups = 4;
  template <int MR, int NR>
  static void columns(const uint8_t* w, size_t ws, const GroupX* const (&b)[MR], size_t n, float* y,
                      size_t ys, const RowStream& stream) {
    const size_t blocks = n / 32;
    const size_t full = blocks / 4;
    __m512 acc[MR][NR];
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) acc[r][j] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (size_t g = 0; g < full; ++g) {
      if (g % kStreamGroups == 0) {
        stream.request_bytes(w + g * kGroupBytes, kStreamGroups * kGroupBytes);
      }
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) {
        const Group wg = load(w + j * ws + g * kGroupBytes);
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) acc[r][j] = accumulate(wg, b[r][g], acc[r][j]);
      }
    }
    if (full * 4 < blocks) {
      for (int j = 0; j < NR; ++j) {
        // A short last group's absent blocks read as zeros, from a copy.
        alignas(64) uint8_t last[kGroupBytes] = {};
        __builtin_memcpy(last, w + j * ws + full * kGroupBytes,
                         (blocks - full * 4) * sizeof(Block));
        const Group wg = load(last);
        for (int r = 0; r < MR; ++r) acc[r][j] = accumulate(wg, b[r][full], acc[r][j]);
      }
    }
    store_sums<MR, NR>(acc, y, ys);
  }
};

// The most used K types' pairs of groups unpacked in registers, for KQuantTile512: 64 unsigned
// values with no trip through memory (whose small stores a wide load cannot forward from).
// Their scales are gemm_unpacked.h's Direct256; other types take quant_unpack.h's form.
template <class U>
struct Direct512 {
  static constexpr bool kAvailable = false;
};

// Pair p of q4_K or q5_K: the 32 bytes qs[32p..] in both halves, the second shifted down a
// nibble: their low nibbles then their high nibbles.
inline __m512i k4_pair_nibbles(const uint8_t* qs, int p) {
  const __m512i both = _mm512_broadcast_i64x4(load256(qs + 32 * p));
  return _mm512_and_si512(_mm512_srlv_epi64(both, _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0)),
                          _mm512_set1_epi8(0x0f));
}

// The 32 bytes at p in both halves, each byte's bit `lo` (first half) and `hi` (second half,
// both on the same side of bit 4) moved to bit 4, and the next bit of each to bit 5; other
// bits are left as they fall. A 64-bit shift suffices: no bit that lands on 4 or 5 crosses a
// byte.
inline __m512i bits_to_four(const uint8_t* p, int lo, int hi) {
  const __m512i both = _mm512_broadcast_i64x4(load256(p));
  if (hi <= 4) {
    return _mm512_sllv_epi64(
        both, _mm512_set_epi64(4 - hi, 4 - hi, 4 - hi, 4 - hi, 4 - lo, 4 - lo, 4 - lo, 4 - lo));
  }
  return _mm512_srlv_epi64(
      both, _mm512_set_epi64(hi - 4, hi - 4, hi - 4, hi - 4, lo - 4, lo - 4, lo - 4, lo - 4));
}

// low | (high & mask) in one operation.
inline __m512i or_masked(__m512i low, __m512i high, int mask) {
  return _mm512_ternarylogic_epi32(low, high, _mm512_set1_epi8(static_cast<char>(mask)), 0xf8);
}

template <>
struct Direct512<UnpackQ4_K> {
  static constexpr bool kAvailable = true;
  static __m512i pair(const BlockQ4_K& b, int p) { return k4_pair_nibbles(b.qs, p); }
};

template <>
struct Direct512<UnpackQ5_K> {
  static constexpr bool kAvailable = true;
  // q4_K's nibbles plus bits 2p (first 32) and 2p + 1 (second 32) of qh[l] as bit 4.
  static __m512i pair(const BlockQ5_K& b, int p) {
    return or_masked(k4_pair_nibbles(b.qs, p), bits_to_four(b.qh, 2 * p, 2 * p + 1), 0x10);
  }
};

template <>
struct Direct512<UnpackQ6_K> {
  static constexpr bool kAvailable = true;
  // Pair p holds quarters 2 (p % 2) and 2 (p % 2) + 1 of half p / 2: low nibbles (high ones for
  // odd p) of ql's two 32-byte rows, top two bits from qh (bits 4 (p % 2) and 4 (p % 2) + 2).
  static __m512i pair(const BlockQ6_K& b, int p) {
    const int h = p / 2, q = 4 * (p % 2);
    const __m512i low = _mm512_and_si512(
        _mm512_srli_epi16(_mm512_loadu_si512(b.ql + 64 * h), static_cast<unsigned>(q)),
        _mm512_set1_epi8(0x0f));
    return or_masked(low, bits_to_four(b.qh + 32 * h, q, q + 2), 0x30);
  }
};

// K-quant weights (256-element super-blocks) against q8_K activations in 512-bit steps: per
// super-block and output, each pair of groups takes maddubs(q, x) (pairs of products; q < 64
// keeps them below 2^15) and then vpdpwssd with the sub-blocks' integer scales, lane l summing
// elements 64p + 4l..64p + 4l + 3 of every pair p into the exact int32 S_l; the offsets against
// the activations' 16 sums give the exact O_l in lanes 0-7 (offset_sums, 0 above). The
// super-block's partial (d dx) S_l + (unit dx) O_l (one product, one fused multiply-add), or
// (d dx) (S_l + O_l) where the offsets are in units of d (q3_K, q6_K: O_l starts the integer
// sum), joins the output's sum, so the chain carried from one super-block to the next is one
// addition. The same operations for every output whatever the tile's shape.
template <class U, int Rows, int Cols>
struct KQuantTile512 : StreamedColumns<KQuantTile512<U, Rows, Cols>> {
  static_assert(U::kUnit == 256);
  static constexpr int kRows = Rows;
  static constexpr int kCols = Cols;
  using Block = typename U::Block;
  using XRow = BlockQ8_K;

  // The tile's sums, each super-block of the first weight row requested ahead through stream
  // (empty but in decode).
  template <int MR, int NR>
  static void columns(const uint8_t* w, size_t ws, const BlockQ8_K* const (&b)[MR], size_t n,
                      float* y, size_t ys, const RowStream& stream) {
    __m512 acc[MR][NR];
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) acc[r][j] = _mm512_setzero_ps();
    for (size_t s = 0; s < n / 256; ++s) {
      stream.request_bytes(w + s * sizeof(Block), sizeof(Block));
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) {
        const Block& block = reinterpret_cast<const Block*>(w + j * ws)[s];
        UnpackedK up;
        const KScales k = super_block_scales<U>(block, up);
        __m512i wq[4], wscale[4];
#pragma GCC unroll 4
        for (int p = 0; p < 4; ++p) {
          if constexpr (Direct512<U>::kAvailable) {
            wq[p] = Direct512<U>::pair(block, p);
          } else {
            wq[p] = _mm512_load_si512(up.q + 64 * p);
          }
          // Lane m of a pair's 16-bit products covers elements 64p + 2m, 64p + 2m + 1: sub-block
          // 4p + m / 8.
          const __m512i sub =
              _mm512_add_epi16(_mm512_set1_epi16(static_cast<int16_t>(4 * p)),
                               _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1,
                                                1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
          wscale[p] = _mm512_permutexvar_epi16(sub, _mm512_castsi256_si512(k.scale));
        }
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          const BlockQ8_K& px = b[r][s];
          // Offsets in units of d start the integer sum; others are converted on their own.
          __m512i sum = U::kOffsetsInScaleUnits ? _mm512_zextsi256_si512(offset_sums(k, px))
                                                : _mm512_setzero_si512();
#pragma GCC unroll 4
          for (int p = 0; p < 4; ++p) {
            sum = _mm512_dpwssd_epi32(
                sum, _mm512_maddubs_epi16(wq[p], _mm512_loadu_si512(px.qs + 64 * p)), wscale[p]);
          }
          __m512 part = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(k.d * px.d));
          if constexpr (!U::kOffsetsInScaleUnits) {
            part = _mm512_fmadd_ps(_mm512_zextps256_ps512(_mm256_cvtepi32_ps(offset_sums(k, px))),
                                   _mm512_set1_ps(k.unit * px.d), part);
          }
          acc[r][j] = _mm512_add_ps(acc[r][j], part);
        }
      }
    }
    store_sums<MR, NR>(acc, y, ys);
  }
};

// q8_0: the whole groups of 16 weight rows and 16 activation rows on AMX tiles where this CPU
// has them, the rest (and everything elsewhere) on the tiles above; the same bits either way.
void gemm_q8_0(const void* w, size_t w_stride, size_t n_w, const void* x, size_t x_stride,
               size_t n_x, size_t n, float* y, size_t y_stride) {
  const size_t rows = n_x / 16 * 16;
  const size_t cols = n_w / 16 * 16;
  if (rows == 0 || cols == 0 || !amx_enabled()) {
    gemm_tiled<Q8Tile>(w, w_stride, n_w, x, x_stride, n_x, n, y, y_stride);
    return;
  }
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* xb = static_cast<const uint8_t*>(x);
  gemm_q8_0_amx(w, w_stride, cols, x, x_stride, rows, n, y, y_stride);
  if (cols < n_w) {
    gemm_tiled<Q8Tile>(wb + cols * w_stride, w_stride, n_w - cols, x, x_stride, rows, n, y + cols,
                       y_stride);
  }
  if (rows < n_x) {
    gemm_tiled<Q8Tile>(w, w_stride, n_w, xb + rows * x_stride, x_stride, n_x - rows, n,
                       y + rows * y_stride, y_stride);
  }
}

// f32 weights whose rows all start 32 bytes into a line take their loads in halves.
void gemm_f32(const void* w, size_t w_stride, size_t n_w, const void* x, size_t x_stride,
              size_t n_x, size_t n, float* y, size_t y_stride) {
  if (reinterpret_cast<uintptr_t>(w) % 64 == 32 && w_stride % 64 == 0) {
    gemm_tiled<F32Tile<HalvesLoad>>(w, w_stride, n_w, x, x_stride, n_x, n, y, y_stride);
  } else {
    gemm_tiled<F32Tile<WholeLoad>>(w, w_stride, n_w, x, x_stride, n_x, n, y, y_stride);
  }
}

}  // namespace

const GemmTable* avx512_gemm() {
  static const GemmTable table = {{
      gemm_f32,
      gemm_tiled<Half16Tile<LoadF16>>,
      gemm_tiled<Half16Tile<LoadBf16>>,
      gemm_q8_0,
      gemm_tiled<FourBlockTile<Q4FourBlocks>>,
      gemm_tiled<FourBlockTile<Q41FourBlocks>>,
      gemm_tiled<FourBlockTile<Q5FourBlocks>>,
      gemm_tiled<FourBlockTile<Q51FourBlocks>>,
      gemm_tiled<KQuantTile512<UnpackQ2_K, 4, 3>>,
      gemm_tiled<KQuantTile512<UnpackQ3_K, 4, 3>>,
      gemm_tiled<KQuantTile512<UnpackQ4_K, 4, 3>>,
      gemm_tiled<KQuantTile512<UnpackQ5_K, 4, 3>>,
      gemm_tiled<KQuantTile512<UnpackQ6_K, 4, 3>>,
      gemm_tiled<FourBlockTile<IQ4NLFourBlocks>>,
  }};
  return &table;
}

}  // namespace kvc::kernels

#pragma GCC pop_options
#else
namespace kvc::kernels {
const GemmTable* avx512_gemm() {
  return nullptr;
}
}  // namespace kvc::kernels
#endif
