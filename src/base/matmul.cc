#include "base/matmul.h"

#include <algorithm>

#include "base/kernels.h"

namespace kvc {

namespace {
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
  const size_t macs_per_column = w.in_dim * n_rows;
  pool.parallel_for(
      w.out_dim,
      [&](size_t o_begin, size_t o_end) {
        kernels::gemm(w.dtype, w.row(o_begin), w.row_stride(), o_end - o_begin, xq, x_stride,
                      n_rows, w.in_dim, y + o_begin, w.out_dim);
      },
      std::max<size_t>(1, kMinMacsPerThread / macs_per_column));
}

}  // namespace kvc
