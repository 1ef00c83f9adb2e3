#include "base/matmul.h"

#include <algorithm>

#include "base/kernels.h"

namespace kvc {

namespace {
// Rows of activations processed against one weight row at a time: keeps a tile of prepared
// activations hot in L1/L2 while the weight row is read from memory once per tile.
constexpr size_t kRowTile = 8;
// Below these amounts of work per thread, waking another thread costs more than it saves.
constexpr size_t kMinMacsPerThread = 1 << 15;
constexpr size_t kMinElementsPerThread = 1 << 14;
}  // namespace

void matmul(ThreadPool& pool, const WeightView& w, const float* x, size_t n_rows, float* y,
            std::vector<uint8_t>& scratch) {
  const size_t x_stride = kernels::activation_row_bytes(w.dtype, w.in_dim);
  scratch.resize(x_stride * n_rows);
  uint8_t* xq = scratch.data();
  pool.parallel_for(
      n_rows,
      [&](size_t begin, size_t end) {
        for (size_t r = begin; r < end; ++r) {
          kernels::prepare_activations(w.dtype, x + r * w.in_dim, xq + r * x_stride, w.in_dim);
        }
      },
      std::max<size_t>(1, kMinElementsPerThread / w.in_dim));
  const size_t row_tile_count = (n_rows + kRowTile - 1) / kRowTile;
  const size_t macs_per_column = w.in_dim * n_rows;
  pool.parallel_for(
      w.out_dim,
      [&](size_t o_begin, size_t o_end) {
        float out[kRowTile];
        for (size_t tile = 0; tile < row_tile_count; ++tile) {
          const size_t r0 = tile * kRowTile;
          const int m = static_cast<int>(std::min(kRowTile, n_rows - r0));
          for (size_t o = o_begin; o < o_end; ++o) {
            kernels::dot_rows(w.dtype, w.row(o), xq + r0 * x_stride, x_stride, m, w.in_dim, out);
            for (int r = 0; r < m; ++r) y[(r0 + r) * w.out_dim + o] = out[r];
          }
        }
      },
      std::max<size_t>(1, kMinMacsPerThread / macs_per_column));
}

}  // namespace kvc
