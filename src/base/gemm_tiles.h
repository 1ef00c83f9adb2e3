// The loop nest around the register-blocked GEMM micro-kernels (internal to base/).
//
// Included by each instruction set's gemm_*.cc after its target pragma, inside an anonymous
// namespace, so that every file gets its own copy compiled for its own instruction set. It
// includes nothing itself: a standard header first opened under a target pragma would compile
// shared inline functions for that instruction set.
//
// A kernel K provides kRows and kCols (the full tile: activation rows x weight rows) and
// K::tile<MR, NR>(w, w_stride, x, x_stride, n, y, y_stride), which writes
// y[r * y_stride + c] = dot(w_c, x_r) for r < MR, c < NR with the same operations per output
// whatever MR and NR are: a value never depends on which tile computed it. The including file
// defines hsums(const Vec (&)[N], float (&)[N]) for its vectors before including this.
#pragma once

// Weight rows whose bytes fit in about half of a core's L2: the chunk is read from memory once
// and then reused from cache by every activation tile.
constexpr size_t kGemmChunkBytes = 256 * 1024;

// With few activation rows the weights are read from memory about once each, and reading
// several weight rows side by side from memory halves the bandwidth the prefetchers reach
// (measured on Zen 4), so such calls, and the rows left over after the full tiles, take the
// weight rows one at a time, in address order.
constexpr size_t kGemmNarrowRows = 4;

// The weight rows of the chunk after the one the tiles are reading, requested into the
// second-level cache a slice at a time while they run (prefetch_lines.h, which the including
// file includes before its target pragma): with few activation rows (batched decode) each chunk
// serves only a few passes, and its first would otherwise wait on memory.
struct NextChunk {
  const uint8_t* rows;  // null when there is none
  size_t bytes;
  size_t slices;  // the steps the requests are spread over

  // Requests slice `slice` (< slices) of the chunk's bytes; nothing when there is no chunk.
  void request(size_t slice) const {
    if (rows == nullptr) return;
    kvc::kernels::prefetch_lines<2>(rows, bytes * slice / slices, bytes * (slice + 1) / slices);
  }
};

// The weight rows of one call that ends at `end`, read once each in address order (decode's
// narrow columns): requests the bytes kRowStreamAheadBytes (prefetch_lines.h) past those being
// read, within the call's rows. Empty (end null) in the tiles, which read rows more than once
// and where NextChunk requests instead.
struct RowStream {
  const uint8_t* end = nullptr;

  // The lines that start among the `bytes` from `at` (inside the rows), moved on: for kernels
  // that spread their requests over a row as they read it, a few lines at a time, instead of a
  // burst of a row's lines that fills the core's miss buffers ahead of its own loads. Spans
  // that follow each other request each line once.
  void request_bytes(const uint8_t* at, size_t bytes) const {
    if (end == nullptr) return;
    const uintptr_t from = reinterpret_cast<uintptr_t>(at) + kRowStreamAheadBytes;
    const uintptr_t last = reinterpret_cast<uintptr_t>(end);
    const uintptr_t stop = from + bytes < last ? from + bytes : last;
    for (uintptr_t line = (from + 63) & ~uintptr_t{63}; line < stop; line += 64) {
      kvc::kernels::prefetch_line<2>(reinterpret_cast<const char*>(line));
    }
  }
};

// The tile and the narrow column of a kernel K whose tiles read activation rows of K::XRow
// elements, both through K::columns<MR, NR>(w, ws, rows, n, y, ys, stream), which requests
// the first weight row's bytes through stream as it reads them (an empty stream in the tiles):
// decode's spread requests with the very operations of the tiles.
template <class K>
struct StreamedColumns {
  template <int MR, int NR>
  static void tile(const uint8_t* w, size_t ws, const uint8_t* x, size_t xs, size_t n, float* y,
                   size_t ys) {
    const typename K::XRow* rows[MR];
    for (int r = 0; r < MR; ++r) rows[r] = reinterpret_cast<const typename K::XRow*>(x + r * xs);
    K::template columns<MR, NR>(w, ws, rows, n, y, ys, RowStream{});
  }

  template <int MR>
  static void narrow_column(const uint8_t* w, const uint8_t* const (&x)[MR], size_t n, float* y,
                            size_t ys, const RowStream& stream) {
    const typename K::XRow* rows[MR];
    for (int r = 0; r < MR; ++r) rows[r] = reinterpret_cast<const typename K::XRow*>(x[r]);
    K::template columns<MR, 1>(w, 0, rows, n, y, ys, stream);
  }
};

// sums[r * NR + j] = the horizontal sum of acc[r][j], the tile's sums reduced together by the
// including file's hsums (the bits of its one-vector sum).
template <int MR, int NR, class Vec>
inline void tile_sums(const Vec (&acc)[MR][NR], float (&sums)[MR * NR]) {
  Vec flat[MR * NR];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j) flat[r * NR + j] = acc[r][j];
  hsums(flat, sums);
}

// y[r * ys + j] = the horizontal sum of acc[r][j], as tile_sums.
template <int MR, int NR, class Vec>
inline void store_sums(const Vec (&acc)[MR][NR], float* y, size_t ys) {
  float sums[MR * NR];
  tile_sums<MR, NR>(acc, sums);
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j) y[r * ys + j] = sums[r * NR + j];
}

// Weight rows [c_begin, c_end) against MR activation rows, pass `pass` over the chunk: after
// each kCols weight rows, their tile's slice of the next chunk is requested (pass p's tile t
// takes slice p * tiles per pass + t).
template <class K, int MR>
void gemm_tile_row(const uint8_t* w, size_t w_stride, size_t c_begin, size_t c_end,
                   const uint8_t* x, size_t x_stride, size_t n, float* y, size_t y_stride,
                   const NextChunk& next, size_t pass) {
  size_t c = c_begin;
  const size_t first_slice = pass * ((c_end - c_begin + K::kCols - 1) / K::kCols);
  if constexpr (MR == K::kRows) {
    for (; c + K::kCols <= c_end; c += K::kCols) {
      K::template tile<MR, K::kCols>(w + c * w_stride, w_stride, x, x_stride, n, y + c, y_stride);
      next.request(first_slice + (c - c_begin) / K::kCols);
    }
  }
  for (; c < c_end; ++c) {
    K::template tile<MR, 1>(w + c * w_stride, w_stride, x, x_stride, n, y + c, y_stride);
    if ((c - c_begin) % K::kCols == K::kCols - 1 || c + 1 == c_end) {
      next.request(first_slice + (c - c_begin) / K::kCols);
    }
  }
}

// The rows < R left over after the full tiles, as one tile of that many rows.
template <class K, int R>
void gemm_rest_rows(size_t rows, const uint8_t* w, size_t w_stride, size_t c_begin, size_t c_end,
                    const uint8_t* x, size_t x_stride, size_t n, float* y, size_t y_stride,
                    const NextChunk& next, size_t pass) {
  if constexpr (R > 1) {
    if (rows == R - 1) {
      gemm_tile_row<K, R - 1>(w, w_stride, c_begin, c_end, x, x_stride, n, y, y_stride, next, pass);
    } else {
      gemm_rest_rows<K, R - 1>(rows, w, w_stride, c_begin, c_end, x, x_stride, n, y, y_stride, next,
                               pass);
    }
  }
}

// Calls of MR <= kGemmNarrowRows activation rows, weight row after weight row in address order,
// through K::narrow_column<MR>(w_row, x_rows, n, y_column, y_stride, stream), which requests
// its row's bytes ahead through the stream as it reads them: the activation rows as
// given, or as K::narrow_prepare(x, x_stride, n_x, n, &stride) rewrites them where the kernel
// has one (not prepare()'s layout); every value's bits those of the tiles.
template <class K, int MR>
void gemm_narrow(const uint8_t* w, size_t w_stride, size_t n_w, const uint8_t* x, size_t x_stride,
                 size_t n, float* y, size_t y_stride) {
  if constexpr (requires { K::narrow_prepare(x, x_stride, size_t{MR}, n, &x_stride); }) {
    x = K::narrow_prepare(x, x_stride, MR, n, &x_stride);
  }
  const uint8_t* rows[MR];
  for (int r = 0; r < MR; ++r) rows[r] = x + r * x_stride;
  const RowStream stream = {w + n_w * w_stride};
  for (size_t c = 0; c < n_w; ++c) {
    K::template narrow_column<MR>(w + c * w_stride, rows, n, y + c, y_stride, stream);
  }
}

// A kernel may also provide K::prepare(x, x_stride, n_x, n, &stride), which rewrites the
// activation rows once per call into the layout its tiles read (returning the rows and setting
// their stride), so that no tile redoes that work for every weight row; and
// K::narrow_column<MR>, which gemm_narrow then takes for calls of at most kGemmNarrowRows rows.
template <class K>
void gemm_tiled(const void* w, size_t w_stride, size_t n_w, const void* x, size_t x_stride,
                size_t n_x, size_t n, float* y, size_t y_stride) {
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* xb = static_cast<const uint8_t*>(x);
  if constexpr (requires(const uint8_t* const(&one)[1]) {
                  K::template narrow_column<1>(wb, one, n, y, y_stride, RowStream{});
                }) {
    switch (n_x) {
      case 1:
        return gemm_narrow<K, 1>(wb, w_stride, n_w, xb, x_stride, n, y, y_stride);
      case 2:
        return gemm_narrow<K, 2>(wb, w_stride, n_w, xb, x_stride, n, y, y_stride);
      case 3:
        return gemm_narrow<K, 3>(wb, w_stride, n_w, xb, x_stride, n, y, y_stride);
      case 4:
        return gemm_narrow<K, 4>(wb, w_stride, n_w, xb, x_stride, n, y, y_stride);
      default:
        static_assert(kGemmNarrowRows == 4);
        break;
    }
  }
  if constexpr (requires { K::prepare(xb, x_stride, n_x, n, &x_stride); }) {
    xb = K::prepare(xb, x_stride, n_x, n, &x_stride);
  }
  size_t chunk = kGemmChunkBytes / w_stride / K::kCols * K::kCols;
  if (chunk < static_cast<size_t>(K::kCols)) chunk = K::kCols;
  const size_t passes = (n_x + K::kRows - 1) / K::kRows;
  // Only chunks that later passes read again from the cache request the next one: one pass
  // (decode's few rows) reads each weight row once, in address order, where the hardware
  // prefetchers stay ahead by themselves and requests would only repeat theirs.
  const bool request_next = passes > 1;
  for (size_t c0 = 0; c0 < n_w; c0 += chunk) {
    const size_t c1 = n_w - c0 < chunk ? n_w : c0 + chunk;
    const NextChunk next = {c1 < n_w && request_next ? wb + c1 * w_stride : nullptr,
                            (n_w - c1 < chunk ? n_w - c1 : chunk) * w_stride,
                            passes * ((c1 - c0 + K::kCols - 1) / K::kCols)};
    size_t r = 0;
    for (; r + K::kRows <= n_x; r += K::kRows) {
      gemm_tile_row<K, K::kRows>(wb, w_stride, c0, c1, xb + r * x_stride, x_stride, n,
                                 y + r * y_stride, y_stride, next, r / K::kRows);
    }
    gemm_rest_rows<K, K::kRows>(n_x - r, wb, w_stride, c0, c1, xb + r * x_stride, x_stride, n,
                                y + r * y_stride, y_stride, next, r / K::kRows);
  }
}
