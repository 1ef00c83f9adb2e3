// Plain C++ kernels: the fallback on any CPU and the reference the SIMD kernels are tested
// against.
#include <algorithm>
#include <bit>

#include "base/dtype.h"
#include "base/kernel_table.h"
#include "base/prefetch_lines.h"
#include "base/quant_blocks.h"

namespace kvc::kernels {
namespace {

#include "base/multiply_add_burst.h"

float dot_f32_scalar(const float* a, const float* b, size_t n) {
  float sum = 0.0f;
  for (size_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

float dot_f16_f32_scalar(const uint16_t* a, const float* b, size_t n) {
  float sum = 0.0f;
  for (size_t i = 0; i < n; ++i) sum += f16_to_f32(a[i]) * b[i];
  return sum;
}

void axpy_f32_scalar(float alpha, const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void axpy_f16_scalar(float alpha, const uint16_t* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += alpha * f16_to_f32(x[i]);
}

float dot_w_f32(const void* w, const void* x, size_t n) {
  return dot_f32_scalar(static_cast<const float*>(w), static_cast<const float*>(x), n);
}

float dot_w_f16(const void* w, const void* x, size_t n) {
  return dot_f16_f32_scalar(static_cast<const uint16_t*>(w), static_cast<const float*>(x), n);
}

float dot_w_bf16(const void* w, const void* x, size_t n) {
  const auto* a = static_cast<const uint16_t*>(w);
  const auto* b = static_cast<const float*>(x);
  float sum = 0.0f;
  for (size_t i = 0; i < n; ++i) sum += bf16_to_f32(a[i]) * b[i];
  return sum;
}

float dot_w_q8_0(const void* w, const void* x, size_t n) {
  const auto* a = static_cast<const BlockQ8_0*>(w);
  const auto* b = static_cast<const BlockQ8_0*>(x);
  float sum = 0.0f;
  for (size_t i = 0; i < n / 32; ++i) {
    int isum = 0;
    for (int j = 0; j < 32; ++j) isum += a[i].qs[j] * b[i].qs[j];
    sum += static_cast<float>(isum) * (f16_to_f32(a[i].d) * f16_to_f32(b[i].d));
  }
  return sum;
}

int q4_0_level(int code) {
  return code - 8;
}

int iq4_nl_level(int code) {
  return kIq4NlValues[code];
}

// Blocks of 32 4-bit codes in q4_0's packing (q4_0, iq4_nl) against q8_0 activations; level
// gives a code's integer value.
template <class Block, int (*level)(int)>
float dot_w_nibbles(const void* w, const void* x, size_t n) {
  const auto* a = static_cast<const Block*>(w);
  const auto* b = static_cast<const BlockQ8_0*>(x);
  float sum = 0.0f;
  for (size_t i = 0; i < n / 32; ++i) {
    int isum = 0;
    for (int j = 0; j < 16; ++j) {
      isum += level(a[i].qs[j] & 0x0f) * b[i].qs[j];
      isum += level(a[i].qs[j] >> 4) * b[i].qs[j + 16];
    }
    sum += static_cast<float>(isum) * (f16_to_f32(a[i].d) * f16_to_f32(b[i].d));
  }
  return sum;
}

#include "base/quant_unpack.h"

// Weights of quant_unpack.h's 32-element types against q8_0 activations: per 16 elements, the
// scale times the integer dot plus the offset times the integer sum of the activations.
template <class U>
float dot_w_unpacked(const void* w, const void* x, size_t n) {
  static_assert(U::kUnit == 32);
  const auto* a = static_cast<const typename U::Block*>(w);
  const auto* b = static_cast<const BlockQ8_0*>(x);
  Unpacked<32> up;
  float sum = 0.0f;
  for (size_t i = 0; i < n / 32; ++i) {
    U::unpack(a[i], up);
    const float dx = f16_to_f32(b[i].d);
    for (int k = 0; k < 2; ++k) {
      const int8_t* xs = b[i].qs + 16 * k;
      int dot = 0, xsum = 0;
      for (int e = 0; e < 16; ++e) {
        dot += up.q[16 * k + e] * xs[e];
        xsum += xs[e];
      }
      sum +=
          up.scale[k] * dx * static_cast<float>(dot) + up.offset[k] * dx * static_cast<float>(xsum);
    }
  }
  return sum;
}

// K-quant weights against q8_K activations: per super-block, the exact int32 sums S of each
// 16 elements' integer dot times their integer scale and O of each offset times the 16
// activations' sum, then (d * dx) * S + (offset_unit * dx) * O joins the row's sum, or
// (d * dx) * (S + O) where the offsets are in units of d.
template <class U>
float dot_w_super_blocks(const void* w, const void* x, size_t n) {
  static_assert(U::kUnit == 256);
  const auto* a = static_cast<const typename U::Block*>(w);
  const auto* b = static_cast<const BlockQ8_K*>(x);
  UnpackedK up;
  float sum = 0.0f;
  for (size_t i = 0; i < n / 256; ++i) {
    U::unpack(a[i], up);
    int32_t scaled = 0, offsets = 0;
    for (int k = 0; k < 16; ++k) {
      int32_t dot = 0;
      for (int e = 0; e < 16; ++e) dot += up.q[16 * k + e] * b[i].qs[16 * k + e];
      scaled += up.scale[k] * dot;
      offsets += up.offset[k] * b[i].bsums[k];
    }
    if constexpr (U::kOffsetsInScaleUnits) {
      sum += (up.d * b[i].d) * static_cast<float>(scaled + offsets);
    } else {
      sum += (up.d * b[i].d) * static_cast<float>(scaled) +
             (up.offset_unit * b[i].d) * static_cast<float>(offsets);
    }
  }
  return sum;
}

KVC_ATTENTION_LOOPS(dot_f32_scalar, dot_f16_f32_scalar, axpy_f32_scalar, axpy_f16_scalar)

void scores_f16_queries(const float* const* q, size_t nq, const uint16_t* k, size_t n, size_t hd,
                        float scale, float* const* out, const uint16_t* ahead) {
  prefetch_lines(ahead, 0, n * hd * sizeof(uint16_t));
  for (size_t j = 0; j < nq; ++j) scores_f16(q[j], k, n, hd, scale, out[j]);
}

#include "base/softmax_exp.h"

void accumulate_f16_queries(const float* const* p, size_t nq, const uint16_t* v, size_t n,
                            size_t hd, float* const* out, const uint16_t* ahead) {
  prefetch_lines(ahead, 0, n * hd * sizeof(uint16_t));
  for (size_t j = 0; j < nq; ++j) accumulate_f16(p[j], v, n, hd, out[j]);
}

float softmax_exp_scalar(float* p, size_t n) {
  float max = p[0];
  for (size_t t = 1; t < n; ++t) max = std::max(max, p[t]);
  float sum = 0.0f;
  for (size_t t = 0; t < n; ++t) {
    p[t] = softmax_exp::exp<softmax_exp::Scalar>(p[t] - max);
    sum += p[t];
  }
  return sum;
}

void quantize_q8_0_scalar(const float* x, void* out, size_t n) {
  quantize_row(DType::Q8_0, x, out, n);
}

void quantize_q8_k_scalar(const float* x, void* out, size_t n) {
  quantize_row(DType::Q8_K, x, out, n);
}

void to_f16_scalar(const float* x, uint16_t* out, size_t n) {
  quantize_row(DType::F16, x, out, n);
}

void silu_mul_scalar(float* gate, const float* up, size_t n) {
  for (size_t i = 0; i < n; ++i)
    gate[i] = softmax_exp::silu_times<softmax_exp::Scalar>(gate[i], up[i]);
}

// Eight independent sums keep several loads in flight.
uint64_t read_sum_scalar(const uint64_t* p, size_t n, bool /*request_ahead*/) {
  uint64_t a[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) a[j] += p[i + j];
  }
  for (; i < n; ++i) a[0] += p[i];
  uint64_t s = 0;
  for (uint64_t v : a) s += v;
  return s;
}

// multiply_add_burst's steps without vectors: one 32-bit multiply and add (wrapping)...
struct Int8Burst {
  using Vec = uint32_t;
  static constexpr const char* kInstruction = "32-bit multiply and add";
  static constexpr uint64_t kMultiplyAdds = 1;
  static Vec start(uint64_t seed) { return static_cast<uint32_t>(seed); }
  static Vec step(Vec acc, Vec operand) { return acc * operand + operand; }
  static uint64_t fold(Vec acc) { return acc; }
};

// ...and one float multiply and add (acc * m + m, m from burst_multiplier).
struct F32Burst {
  using Vec = float;
  static constexpr const char* kInstruction = "float multiply and add";
  static constexpr uint64_t kMultiplyAdds = 1;
  static Vec start(uint64_t seed) { return burst_multiplier(seed); }
  static Vec step(Vec acc, Vec operand) { return acc * operand + operand; }
  static uint64_t fold(Vec acc) { return std::bit_cast<uint32_t>(acc); }
};

}  // namespace

const KernelTable& scalar_kernels() {
  static const KernelTable table = {
      {dot_w_f32, dot_w_f16, dot_w_bf16, dot_w_q8_0, dot_w_nibbles<BlockQ4_0, q4_0_level>,
       dot_w_unpacked<UnpackQ4_1>, dot_w_unpacked<UnpackQ5_0>, dot_w_unpacked<UnpackQ5_1>,
       dot_w_super_blocks<UnpackQ2_K>, dot_w_super_blocks<UnpackQ3_K>,
       dot_w_super_blocks<UnpackQ4_K>, dot_w_super_blocks<UnpackQ5_K>,
       dot_w_super_blocks<UnpackQ6_K>, dot_w_nibbles<BlockIQ4_NL, iq4_nl_level>},
      dot_f32_scalar,
      dot_f16_f32_scalar,
      axpy_f32_scalar,
      axpy_f16_scalar,
      scores_f32,
      scores_f16,
      scores_f16_queries,
      accumulate_f32,
      accumulate_f16,
      accumulate_f16_queries,
      quantize_q8_0_scalar,
      quantize_q8_k_scalar,
      to_f16_scalar,
      softmax_exp_scalar,
      silu_mul_scalar,
      read_sum_scalar,
      multiply_add_burst_of<Int8Burst, F32Burst>,
      multiply_add_instruction_of<Int8Burst, F32Burst>,
  };
  return table;
}

}  // namespace kvc::kernels
