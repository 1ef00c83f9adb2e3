// Matrix products of weight matrices (any supported dtype) with batches of f32 activations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "base/dtype.h"
#include "base/thread_pool.h"

namespace kvc {

// A weight matrix stored row-major: out_dim rows of in_dim elements of type dtype.
struct WeightView {
  DType dtype = DType::F32;
  const void* data = nullptr;
  size_t out_dim = 0;
  size_t in_dim = 0;

  size_t row_stride() const { return row_bytes(dtype, in_dim); }
  const uint8_t* row(size_t o) const {
    return static_cast<const uint8_t*>(data) + o * row_stride();
  }
};

// y[r][o] = dot(w.row(o), x[r]) for n_rows rows of x (in_dim each) into y (out_dim each).
// Work is split over output columns, so each y value is computed by one thread, in the same
// order whatever the thread count or n_rows. scratch holds the prepared activations.
void matmul(ThreadPool& pool, const WeightView& w, const float* x, size_t n_rows, float* y,
            std::vector<uint8_t>& scratch);

// matmul of the same x by each of ws into ys[i] (a layer's query, key and value projections, or
// its gate and up): where they share dtype and in_dim, x is prepared once and their rows are
// split over the threads as one stacked matrix, so no thread waits at each matrix's end; else
// one matmul each. Every y value has the bits matmul gives it.
void matmul_stacked(ThreadPool& pool, std::span<const WeightView> ws, const float* x, size_t n_rows,
                    std::span<float* const> ys, std::vector<uint8_t>& scratch);

}  // namespace kvc
