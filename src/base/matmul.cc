#include "base/matmul.h"

#include <algorithm>

#include "base/aligned_buffer.h"
#include "base/kernels.h"

namespace kvc {

namespace {
// Below these amounts of work per thread, waking another thread costs more than it saves.
constexpr size_t kMinMacsPerThread = 1 << 15;
constexpr size_t kMinElementsPerThread = 1 << 14;

// x's rows prepared for weights of w's dtype and in_dim into scratch, from a cache line (so
// that no wide load of them spans two); returns where they start and sets their stride.
const uint8_t* prepare_rows(ThreadPool& pool, const WeightView& w, const float* x, size_t n_rows,
                            std::vector<uint8_t>& scratch, size_t* stride) {
  const size_t x_stride = kernels::activation_row_bytes(w.dtype, w.in_dim);
  *stride = x_stride;
  scratch.resize(line_aligned_size(x_stride * n_rows));
  uint8_t* xq = line_aligned(scratch.data());
  pool.parallel_for(
      n_rows,
      [&](size_t begin, size_t end) {
        for (size_t r = begin; r < end; ++r) {
          kernels::prepare_activations(w.dtype, x + r * w.in_dim, xq + r * x_stride, w.in_dim);
        }
      },
      std::max<size_t>(1, kMinElementsPerThread / w.in_dim));
  return xq;
}

}  // namespace

void matmul(ThreadPool& pool, const WeightView& w, const float* x, size_t n_rows, float* y,
            std::vector<uint8_t>& scratch) {
  matmul_stacked(pool, std::span<const WeightView>(&w, 1), x, n_rows,
                 std::span<float* const>(&y, 1), scratch);
}

void matmul_stacked(ThreadPool& pool, std::span<const WeightView> ws, const float* x, size_t n_rows,
                    std::span<float* const> ys, std::vector<uint8_t>& scratch) {
  if (ws.empty()) return;
  const WeightView& lead = ws.front();
  const bool alike = std::all_of(ws.begin(), ws.end(), [&](const WeightView& w) {
    return w.dtype == lead.dtype && w.in_dim == lead.in_dim;
  });
  if (!alike) {
    for (size_t i = 0; i < ws.size(); ++i) matmul(pool, ws[i], x, n_rows, ys[i], scratch);
    return;
  }
  size_t x_stride = 0;
  const uint8_t* xq = prepare_rows(pool, lead, x, n_rows, scratch, &x_stride);
  size_t stacked = 0;
  for (const WeightView& w : ws) stacked += w.out_dim;
  const size_t macs_per_column = lead.in_dim * n_rows;
  pool.parallel_for(
      stacked,
      [&](size_t begin, size_t end) {
        size_t first = 0;  // the stacked row of ws[i]'s row 0
        for (size_t i = 0; i < ws.size(); first += ws[i].out_dim, ++i) {
          const WeightView& w = ws[i];
          const size_t o_begin = std::max(begin, first) - first;
          const size_t o_end = std::min(end, first + w.out_dim) - std::min(end, first);
          if (o_end <= o_begin) continue;
          kernels::gemm(w.dtype, w.row(o_begin), w.row_stride(), o_end - o_begin, xq, x_stride,
                        n_rows, w.in_dim, ys[i] + o_begin, w.out_dim);
        }
      },
      std::max<size_t>(1, kMinMacsPerThread / macs_per_column));
}

}  // namespace kvc
