// AVX2 + FMA + F16C GEMM micro-kernels: a tile of activation rows against a tile of weight
// rows, every output summed with exactly the operations, lanes and order of the single-row dot
// in kernels_avx2.cc, so a row's result does not depend on its tile.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"
#include "base/gemm_table.h"
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
// 2^15 (unpacked weights are below 64).
inline __m256i dot_u8s8(__m256i u, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
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
struct FloatTile {
  static constexpr int kRows = MRows;
  static constexpr int kCols = NCols;
  using T = typename Load::T;

  template <int MR, int NR>
  static void tile(const uint8_t* w, size_t ws, const uint8_t* x, size_t xs, size_t n, float* y,
                   size_t ys) {
    const T* a[NR];
    const float* b[MR];
    for (int j = 0; j < NR; ++j) a[j] = row_at<T>(w, ws, j);
    for (int r = 0; r < MR; ++r) b[r] = row_at<float>(x, xs, r);
    __m256 acc[MR][NR][U];
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j)
        for (int u = 0; u < U; ++u) acc[r][j][u] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 * U <= n; i += 8 * U) {
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

struct Q4Weights {
  using Block = BlockQ4_0;
  static __m256i values(const Block& b) {
    return _mm256_sub_epi8(nibbles(b.qs), _mm256_set1_epi8(8));
  }
};

// iq4_nl: q4_0's nibbles looked up in the table of levels (in both 128-bit lanes).
struct IQ4NLWeights {
  using Block = BlockIQ4_NL;
  static __m256i values(const Block& b) {
    const __m256i levels = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlValues)));
    return _mm256_shuffle_epi8(levels, nibbles(b.qs));
  }
};

// One f16 scale as f32 in every lane.
inline __m256 scale(const uint16_t* d) {
  return _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(*d)));
}

// Integer weights against q8_0 activations, one block per register, as dot_w_q8_0 and
// dot_w_q4_0 in kernels_avx2.cc: maddubs takes |w| unsigned and x with w's sign, and madd
// widens the pairs to int32 (exact: no pair sum exceeds 2 * 128 * 127).
template <class W>
struct IntTile {
  static constexpr int kRows = 4;
  static constexpr int kCols = 2;
  using WBlock = typename W::Block;

  // A prepared activation block: its 32 values and its scale as 8 floats.
  struct BlockX {
    int8_t values[32];
    float scales[8];
  };

  static const uint8_t* prepare(const uint8_t* x, size_t x_stride, size_t n_x, size_t n,
                                size_t* stride) {
    const size_t blocks = n / 32;
    *stride = blocks * sizeof(BlockX);
    uint8_t* out = gemm_scratch(*stride * n_x);
    for (size_t r = 0; r < n_x; ++r) {
      const auto* b = row_at<BlockQ8_0>(x, x_stride, static_cast<int>(r));
      auto* p = reinterpret_cast<BlockX*>(out + r * *stride);
      for (size_t i = 0; i < blocks; ++i) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p[i].values),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs)));
        _mm256_storeu_ps(p[i].scales, scale(&b[i].d));
      }
    }
    return out;
  }

  template <int MR, int NR>
  static void tile(const uint8_t* w, size_t ws, const uint8_t* x, size_t xs, size_t n, float* y,
                   size_t ys) {
    const WBlock* a[NR];
    const BlockX* b[MR];
    for (int j = 0; j < NR; ++j) a[j] = row_at<WBlock>(w, ws, j);
    for (int r = 0; r < MR; ++r) b[r] = row_at<BlockX>(x, xs, r);
    __m256 acc[MR][NR];
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) acc[r][j] = _mm256_setzero_ps();
    for (size_t i = 0; i < n / 32; ++i) {
      __m256i wq[NR], wabs[NR];
      __m256 dw[NR];
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) {
        wq[j] = W::values(a[j][i]);
        wabs[j] = _mm256_sign_epi8(wq[j], wq[j]);
        dw[j] = scale(&a[j][i].d);
      }
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[r][i].values));
        const __m256 dx = _mm256_loadu_ps(b[r][i].scales);
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j)
          acc[r][j] = add_block(wq[j], wabs[j], dw[j], xq, dx, acc[r][j]);
      }
    }
    store_sums<MR, NR>(acc, y, ys);
  }

  // The exact int32 sums of eight groups of four products w x of a block, as floats.
  static inline __m256 block_dot(__m256i wq, __m256i wabs, __m256i xq) {
    const __m256i pairs = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(xq, wq));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }

  // acc + (dw * dx) * block_dot(w, x).
  static inline __m256 add_block(__m256i wq, __m256i wabs, __m256 dw, __m256i xq, __m256 dx,
                                 __m256 acc) {
    return _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), block_dot(wq, wabs, xq), acc);
  }

  // Decode's few activation rows (at most kGemmNarrowRows) as narrow_column reads them.
  static const uint8_t* narrow_prepare(const uint8_t* x, size_t x_stride, size_t n_x, size_t n,
                                       size_t* stride) {
    return narrow_q8_0_rows(x, x_stride, n_x, n, stride);
  }

  // narrow_prepare()'s rows against one weight row, with the tile's operations; the scale
  // product is one scalar multiply, broadcast (the same product as the tile's in every lane).
  template <int MR>
  static void narrow_column(const uint8_t* w, const uint8_t* const (&x)[MR], size_t n, float* y,
                            size_t ys) {
    const auto* a = reinterpret_cast<const WBlock*>(w);
    const NarrowQ8_0Rows<MR> rows(x, n);
    const int8_t* const(&xv)[MR] = rows.values;
    const float* const(&xd)[MR] = rows.scales;
    __m256 acc[MR][1];
    for (int r = 0; r < MR; ++r) acc[r][0] = _mm256_setzero_ps();
    for (size_t i = 0; i < n / 32; ++i) {
      const __m256i wq = W::values(a[i]);
      const __m256i wabs = _mm256_sign_epi8(wq, wq);
      const float dw = half(a[i].d);
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) {
        const __m256i xq = _mm256_load_si256(reinterpret_cast<const __m256i*>(xv[r] + 32 * i));
        acc[r][0] =
            _mm256_fmadd_ps(_mm256_set1_ps(dw * xd[r][i]), block_dot(wq, wabs, xq), acc[r][0]);
      }
    }
    store_sums<MR, 1>(acc, y, ys);
  }
};

}  // namespace

const GemmTable* avx2_gemm() {
  static const GemmTable table = {{
      gemm_tiled<FloatTile<LoadF32, 4, 3, 1>>,
      gemm_tiled<FloatTile<LoadF16, 2, 2, 3>>,
      gemm_tiled<FloatTile<LoadBf16, 2, 2, 3>>,
      gemm_tiled<IntTile<Q8Weights>>,
      gemm_tiled<IntTile<Q4Weights>>,
      gemm_tiled<UnpackedTile<UnpackQ4_1, 3, 2>>,
      gemm_tiled<UnpackedTile<UnpackQ5_0, 3, 2>>,
      gemm_tiled<UnpackedTile<UnpackQ5_1, 3, 2>>,
      gemm_tiled<KQuantTile256<UnpackQ2_K, 3, 2>>,
      gemm_tiled<KQuantTile256<UnpackQ3_K, 3, 2>>,
      gemm_tiled<KQuantTile256<UnpackQ4_K, 3, 2>>,
      gemm_tiled<KQuantTile256<UnpackQ5_K, 3, 2>>,
      gemm_tiled<KQuantTile256<UnpackQ6_K, 3, 2>>,
      gemm_tiled<IntTile<IQ4NLWeights>>,
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
