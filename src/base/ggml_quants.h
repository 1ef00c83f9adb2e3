// Conversion of GGML's weight block types beyond q8_0/q4_0 (q4_1, q5_0, q5_1, q2_K..q6_K) to and
// from f32, and iq4_nl's quantizer; dequantize_row and quantize_row in base/dtype.h call these
// for those types.
#pragma once

#include <cstddef>

#include "base/dtype.h"

namespace kvc {

// True for the types handled here.
bool is_ggml_weight_quant(DType t);
// n elements of type t to f32, with ggml's dequantize_row_* arithmetic (bit-identical values).
void dequantize_ggml_blocks(DType t, const void* src, float* dst, size_t n);
// n f32 values to type t. A simple range quantizer (min/max or max-abs per sub-block, then the
// sub-block scales quantized against the block's largest): no iterative search as llama.cpp's
// quantize does, so its error is somewhat larger but bounded by about half a step per element.
void quantize_ggml_blocks(DType t, const float* src, void* dst, size_t n);
// n f32 values to iq4_nl: per block, a few scales that map the value of largest magnitude near
// the table's end, each refitted by least squares to its nearest levels; the one of least
// squared error is kept (at its f16 value).
void quantize_iq4_nl(const float* src, BlockIQ4_NL* dst, size_t n);

}  // namespace kvc
