// The per-instruction-set function table behind base/kernels.h (internal to base/).
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"
#include "base/kernels.h"

namespace kvc::kernels {

using DotFn = float (*)(const void* w, const void* x, size_t n);

struct KernelTable {
  // Indexed by DType: one weight row against one prepared activation row.
  DotFn dot[kDTypeCount];
  float (*dot_f32)(const float* a, const float* b, size_t n);
  float (*dot_f16_f32)(const uint16_t* a, const float* b, size_t n);
  void (*axpy_f32)(float alpha, const float* x, float* y, size_t n);
  void (*axpy_f16)(float alpha, const uint16_t* x, float* y, size_t n);
  // Attention over n consecutive key/value rows of hd elements (see kernels.h).
  void (*scores_f32)(const float* q, const float* k, size_t n, size_t hd, float scale, float* out);
  void (*scores_f16)(const float* q, const uint16_t* k, size_t n, size_t hd, float scale,
                     float* out);
  // scores_f16 for nq queries at once (out[j] for q[j]), reading each key row once; the lines
  // of the n rows at ahead (null for none) are requested as these are read (kernels.h).
  void (*scores_f16_queries)(const float* const* q, size_t nq, const uint16_t* k, size_t n,
                             size_t hd, float scale, float* const* out, const uint16_t* ahead);
  void (*accumulate_f32)(const float* p, const float* v, size_t n, size_t hd, float* out);
  void (*accumulate_f16)(const float* p, const uint16_t* v, size_t n, size_t hd, float* out);
  // accumulate_f16 for nq weight rows p[j] into out[j] (each out[j] as accumulate_f16 alone),
  // requesting the rows at ahead as scores_f16_queries does.
  void (*accumulate_f16_queries)(const float* const* p, size_t nq, const uint16_t* v, size_t n,
                                 size_t hd, float* const* out, const uint16_t* ahead);
  // quantize_row to q8_0, q8_K and f16: the same bytes as its scalar code.
  void (*quantize_q8_0)(const float* x, void* out, size_t n);
  void (*quantize_q8_k)(const float* x, void* out, size_t n);
  void (*to_f16)(const float* x, uint16_t* out, size_t n);
  // p[t] = exp(p[t] - max) for t < n, max the largest p[t] (softmax_exp.h's exponential);
  // returns their sum.
  float (*softmax_exp)(float* p, size_t n);
  // gate[i] = silu(gate[i]) * up[i] for i < n (softmax_exp.h's silu_times).
  void (*silu_mul)(float* gate, const float* up, size_t n);
  // The sum of the n 64-bit words at p, read with the instruction set's widest loads (and
  // with request_ahead, requested ahead as its decode kernels request weights).
  uint64_t (*read_sum)(const uint64_t* p, size_t n, bool request_ahead);
  // Independent multiply-adds of one kind (kernels.h multiply_add_burst).
  uint64_t (*multiply_add_burst)(Arithmetic kind, size_t rounds, uint64_t* checksum);
  // The instruction that burst runs for kind.
  const char* (*multiply_add_instruction)(Arithmetic kind);
};

// The AVX2 + F16C row conversions, which the AVX-512 table shares (they are bound by memory).
void quantize_q8_0_avx2(const float* x, void* out, size_t n);
void quantize_q8_k_avx2(const float* x, void* out, size_t n);
void to_f16_avx2(const float* x, uint16_t* out, size_t n);

// The four attention loops, written once over an instruction set's own dot and axpy so that
// the compiler inlines them (a call per key row costs more than an 8-element dot).
#define KVC_ATTENTION_LOOPS(DOT_F32, DOT_F16, AXPY_F32, AXPY_F16)                                 \
  void scores_f32(const float* q, const float* k, size_t n, size_t hd, float scale, float* out) { \
    for (size_t t = 0; t < n; ++t) out[t] = DOT_F32(k + t * hd, q, hd) * scale;                   \
  }                                                                                               \
  void scores_f16(const float* q, const uint16_t* k, size_t n, size_t hd, float scale,            \
                  float* out) {                                                                   \
    for (size_t t = 0; t < n; ++t) out[t] = DOT_F16(k + t * hd, q, hd) * scale;                   \
  }                                                                                               \
  void accumulate_f32(const float* p, const float* v, size_t n, size_t hd, float* out) {          \
    for (size_t t = 0; t < n; ++t) AXPY_F32(p[t], v + t * hd, out, hd);                           \
  }                                                                                               \
  void accumulate_f16(const float* p, const uint16_t* v, size_t n, size_t hd, float* out) {       \
    for (size_t t = 0; t < n; ++t) AXPY_F16(p[t], v + t * hd, out, hd);                           \
  }

const KernelTable& scalar_kernels();
// Null when the compiler cannot target the instruction set.
const KernelTable* avx2_kernels();
const KernelTable* avx512_kernels();

}  // namespace kvc::kernels
