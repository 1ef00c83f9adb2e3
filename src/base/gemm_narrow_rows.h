// The layout of decode's q8_0 activation rows for the integer kernels' narrow_column, which
// AVX2's tiles of eight weight rows read too (they broadcast four values at a time) (internal
// to base/).
//
// Included by each instruction set's gemm_*.cc after simd_reduce.h, inside its anonymous
// namespace, as gemm_tiles.h is; it includes nothing itself.
//
// A row's values (a block's 32, or a block pair's 64, in one aligned load; in block order, or
// for AVX2's nibble types in decode, their halves paired as narrow_q8_0_rows says) and then
// its blocks' scales as floats (and, for AVX2's unsigned types q4_0, q5_0, q4_1 and q5_1, each
// block's scaled sum of values as int32): 34 (38) bytes per 32 values, about the quantised row's,
// so that a row of 5,632 values keeps 6 KB of the first-level cache, where the tiles' prepared
// layout (64 or 96 bytes per 32 values) slowed the weight stream beside it (the GEMV of 2,048 x
// 5,632 q8_0 weights on 2 threads, interleaved: 1.2-1.4x).
#pragma once

// Rewrites n_x q8_0 rows of n values (x_stride bytes apart) into the per-thread scratch, and
// where block_sum_factor is not 0, after the scales, that times each block's sum of values as
// int32 (for kernels that multiply unsigned weights and take their bias through them); returns
// the first row, each on a cache line, and sets their stride. With paired_groups, the values of
// each whole group of eight blocks t..t+7 are laid as pairs (t+p, t+p+4), p < 4, each pair 64
// bytes: values 0-15 of block t+p, then of block t+p+4, then values 16-31 of each (the nibble
// types' pair path in AVX2's narrow column); a last group of fewer blocks stays in block order.
inline const uint8_t* narrow_q8_0_rows(const uint8_t* x, size_t x_stride, size_t n_x, size_t n,
                                       size_t* stride, int32_t block_sum_factor = 0,
                                       bool paired_groups = false) {
  const size_t blocks = n / 32;
  const size_t sum_bytes = block_sum_factor != 0 ? sizeof(int32_t) : 0;
  *stride = (n + blocks * (sizeof(float) + sum_bytes) + 63) / 64 * 64;
  uint8_t* out = gemm_scratch(*stride * n_x);
  for (size_t r = 0; r < n_x; ++r) {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(x + r * x_stride);
    uint8_t* values = out + r * *stride;
    auto* scales = reinterpret_cast<float*>(values + n);
    auto* sums = reinterpret_cast<int32_t*>(scales + blocks);
    const size_t paired_blocks = paired_groups ? blocks / 8 * 8 : 0;
    for (size_t i = 0; i < blocks; ++i) {
      if (i < paired_blocks) {
        const size_t p = i % 4;
        uint8_t* pair = values + 32 * (i - i % 8) + 64 * p + (i % 8 < 4 ? 0 : 16);
        __builtin_memcpy(pair, b[i].qs, 16);
        __builtin_memcpy(pair + 32, b[i].qs + 16, 16);
      } else {
        __builtin_memcpy(values + 32 * i, b[i].qs, 32);
      }
      scales[i] = half(b[i].d);
      if (block_sum_factor != 0) {
        int32_t sum = 0;
        for (int8_t v : b[i].qs) sum += v;
        sums[i] = block_sum_factor * sum;
      }
    }
  }
  return out;
}

// MR rewritten rows of n values seen as each row's values, its blocks' scales and (where
// written) the scaled sums.
template <int MR>
struct NarrowQ8_0Rows {
  const int8_t* values[MR];
  const float* scales[MR];
  const int32_t* sums[MR];
  NarrowQ8_0Rows(const uint8_t* const (&rows)[MR], size_t n) {
    for (int r = 0; r < MR; ++r) {
      values[r] = reinterpret_cast<const int8_t*>(rows[r]);
      scales[r] = reinterpret_cast<const float*>(rows[r] + n);
      sums[r] = reinterpret_cast<const int32_t*>(scales[r] + n / 32);
    }
  }
};
