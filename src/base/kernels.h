// SIMD compute kernels with runtime dispatch (AVX-512, AVX2, scalar).
//
// Every kernel computes each output from its own inputs only, in a fixed order, so a row's
// result never depends on which other rows share the batch or on the thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/dtype.h"

namespace kvc::kernels {

enum class Isa : uint8_t { kScalar, kAvx2, kAvx512 };

// The best instruction set this CPU supports.
Isa best_isa();
// The instruction set in use (best_isa() unless KVCACHE_ISA or set_isa() chose another).
Isa active_isa();
// Selects an instruction set; throws Error if the CPU lacks it.
void set_isa(Isa isa);
// Names the arithmetic of the active kernels, "ISA/VERSION": results are bit-identical under one
// name only (instruction sets sum in other orders, and VERSION changes whenever a kernel's
// results do), so cached keys and values are shared under one name only.
std::string arithmetic_identity();
std::string_view isa_name(Isa isa);
// Whether the q8_0 matrix products of 16 rows and more run on AMX tiles: the AVX-512 kernels
// are active, this CPU has AMX-INT8, and neither KVCACHE_AMX=0 nor set_amx(false) turned them
// off. The same bits as without (so arithmetic_identity() does not name it).
bool amx_active();
// Turns the AMX tiles on (where the CPU has them) or off, for side-by-side runs and tests.
void set_amx(bool enabled);
// isa_name(active_isa()), with "+amx" where amx_active().
std::string kernels_name();
std::optional<Isa> parse_isa(std::string_view name);

// Type that activations take when multiplied by weights of type w (integer dot products for
// the quantised types): q8_K for the K-quants, q8_0 for the other quantised types, f32 otherwise.
DType activation_type(DType w);
// Bytes of one activation row of n elements for weights of type w.
size_t activation_row_bytes(DType w, size_t n);
// Converts n f32 activations into activation_type(w), written to out.
void prepare_activations(DType w, const float* x, void* out, size_t n);
// p[t] = exp(p[t] - max) for t < n, max the largest p[t] (n > 0), each exponential within 2 ulp
// and with the same bits on every instruction set (0 below exp(-87)); returns their sum, in an
// order that depends on n only.
float softmax_exp(float* p, size_t n);
// gate[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i] for i < n (SwiGLU),
// through softmax_exp's exponential: within a few ulp, with the same bits on every instruction
// set and wherever an element falls in the array.
void silu_mul(float* gate, const float* up, size_t n);
// The sum (mod 2^64) of the n 64-bit words at p, read with the active instruction set's widest
// loads, as the kernels read weights: the bandwidth probe that decode is measured against. With
// request_ahead, each line is also requested into the second-level cache kRowStreamAheadBytes
// (prefetch_lines.h) before it is read, as decode's vector kernels request their weight rows
// (the scalar kernels request nothing).
uint64_t read_sum(const uint64_t* p, size_t n, bool request_ahead = false);

// The arithmetic a weight type's matrix products run on: 8-bit integer products summed exactly
// in int32 (the quantised types, against q8_0 or q8_K activations) or f32 fused multiply-adds
// (f32, f16 and bf16, widened to f32).
enum class Arithmetic : uint8_t { kInt8, kF32 };
// The arithmetic of wtype's matrix products.
Arithmetic gemm_arithmetic(DType wtype);
// Runs `rounds` rounds of independent multiply-adds of `kind` on the calling thread, with the
// active instruction set's widest instruction for it (AVX-512: vpdpbusd on 64 byte pairs or
// vfmadd on 16 floats; AVX2: vpmaddubsw on 32 byte pairs or vfmadd on 8 floats; scalar: one
// multiply and add); returns the multiply-adds run, and adds a fold of the results to
// *checksum (which also seeds them). The compute ceiling prefill is measured against: no tile
// of the instruction set multiplies faster.
uint64_t multiply_add_burst(Arithmetic kind, size_t rounds, uint64_t* checksum);
// The instruction multiply_add_burst runs for kind on the active instruction set, for reports.
std::string_view multiply_add_instruction(Arithmetic kind);
// quantize_row(t, x, out, n) through the active instruction set where it has a kernel for t
// (f16, q8_0, q8_K): the same bytes on every instruction set.
void quantize(DType t, const float* x, void* out, size_t n);

// out[r] = dot(w, x_r) for r < m, where w is one weight row of n elements of type wtype and
// x_r = x + r * x_stride bytes is a prepared activation row. out[r] depends on w and x_r only.
void dot_rows(DType wtype, const void* w, const void* x, size_t x_stride, int m, size_t n,
              float* out);

// y[r * y_stride + c] = dot(w_c, x_r) for r < n_x, c < n_w, where w_c = w + c * w_stride bytes
// is a weight row of n elements of type wtype and x_r = x + r * x_stride bytes a prepared
// activation row. Computed in register tiles; every value is bit-identical to dot_rows' for
// the same pair, so it depends on w_c and x_r only.
void gemm(DType wtype, const void* w, size_t w_stride, size_t n_w, const void* x, size_t x_stride,
          size_t n_x, size_t n, float* y, size_t y_stride);
// Makes gemm() take one dot product at a time (false) instead of register tiles (true, the
// default): the same values, slower; kept for side-by-side benchmarks.
void set_gemm_tiles(bool tiles);
bool gemm_tiles();

// dot(a, b) over n f32 values.
float dot_f32(const float* a, const float* b, size_t n);
// dot(a, b) where a holds n f16 values.
float dot_f16_f32(const uint16_t* a, const float* b, size_t n);
// y += alpha * x over n values.
void axpy_f32(float alpha, const float* x, float* y, size_t n);
// y += alpha * x where x holds n f16 values.
void axpy_f16(float alpha, const uint16_t* x, float* y, size_t n);

// out[t] = dot(q, k_t) * scale for n key rows k_t = k + t * hd of type kv (f32 or f16).
void attention_scores(DType kv, const float* q, const void* k, size_t n, size_t hd, float scale,
                      float* out);
// attention_scores for nq queries q[j] into out[j], each key row read once for all of them; every
// out[j] has the same bits as attention_scores(kv, q[j], ...) alone. Where ahead is not null, the
// cache lines of the n rows there (read by a later call) are requested while these are read, a
// few at a time where the loop can spread them.
void attention_scores_queries(DType kv, const float* const* q, size_t nq, const void* k, size_t n,
                              size_t hd, float scale, float* const* out,
                              const void* ahead = nullptr);
// out += p[t] * v_t for t = 0..n-1 in order, for n value rows v_t = v + t * hd of type kv.
void attention_accumulate(DType kv, const float* p, const void* v, size_t n, size_t hd, float* out);
// attention_accumulate for nq weight rows p[j] into out[j] over the same value rows, each row
// read once for several of them; every out[j] has the same bits as attention_accumulate alone.
// The rows at ahead are requested as in attention_scores_queries.
void attention_accumulate_queries(DType kv, const float* const* p, size_t nq, const void* v,
                                  size_t n, size_t hd, float* const* out,
                                  const void* ahead = nullptr);

}  // namespace kvc::kernels
