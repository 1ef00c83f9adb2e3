// Element types of tensors and KV blocks, their storage sizes and scalar conversions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace kvc {

// Values are stable (stored in tier block headers); new types go at the end.
enum class DType : uint8_t {
  F32,
  F16,
  BF16,
  Q8_0,
  Q4_0,
  Q4_1,
  Q5_0,
  Q5_1,
  Q2_K,
  Q3_K,
  Q4_K,
  Q5_K,
  Q6_K,
  IQ4_NL,
  Q8_K
};
constexpr int kDTypeCount = 15;

// Whether t is a type that activations take only (q8_K, for K-quant weights), never that of a
// weight or a KV block: model files and the command line do not name it.
constexpr bool is_activation_only(DType t) {
  return t == DType::Q8_K;
}

// Elements per quantisation block (32 for q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl; 256 for the K
// types and q8_K; 1 otherwise).
int block_elements(DType t);
// Bytes per quantisation block (34 for q8_0, 18 for q4_0, ..., element size otherwise).
size_t block_bytes(DType t);
// Bytes of a row of n elements; n must be a multiple of block_elements(t).
size_t row_bytes(DType t, size_t n);
// Name as used on the command line and by llama.cpp ("f32", "q8_0", "q4_K", ...).
std::string_view dtype_name(DType t);
// Parses a name accepted by dtype_name, in either case (also "fp16", "fp32"); nullopt if
// unknown or activation-only.
std::optional<DType> parse_dtype(std::string_view name);
// GGML tensor type id of t (F32=0, F16=1, Q4_0=2, Q4_1=3, Q5_0=6, Q5_1=7, Q8_0=8, Q2_K=10 ..
// Q6_K=14, Q8_K=15, IQ4_NL=20, BF16=30).
uint32_t ggml_type_id(DType t);
// DType of a GGML type id, nullopt for types kvcache does not support as weights.
std::optional<DType> dtype_from_ggml(uint32_t id);
// Name of any GGML type id, for error messages.
std::string_view ggml_type_name(uint32_t id);

// q8_0: 32 int8 values sharing one f16 scale; value = d * qs[i].
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
static_assert(sizeof(BlockQ8_0) == 34);

// q8_K: 256 int8 values sharing one f32 scale, and the sum of each 16 of them; value = d *
// qs[i]. The K-quant weights' activations: one scale per super-block lets a super-block's
// products, scaled by the weights' integer sub-block scales, sum exactly in int32. GGML's
// fields, laid out on five whole cache lines (the values first, the rest zero-padded), so that
// in a row that starts on a line no wide load of the values spans two.
struct BlockQ8_K {
  int8_t qs[256];
  int16_t bsums[16];
  float d;
  uint8_t padding[28];
};
static_assert(sizeof(BlockQ8_K) == 320);

// q4_0: 32 4-bit values sharing one f16 scale; value = d * (nibble - 8).
// Byte j holds element j in its low nibble and element j + 16 in its high nibble.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_0) == 18);

// iq4_nl: 32 4-bit indices into a fixed non-linear table sharing one f16 scale; value = d *
// kIq4NlValues[index], the indices packed as q4_0's nibbles.
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[16];
};
static_assert(sizeof(BlockIQ4_NL) == 18);
// The levels of iq4_nl (ggml's kvalues_iq4nl), denser near zero where weights cluster.
inline constexpr int8_t kIq4NlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// IEEE binary16 <-> binary32, round to nearest even, exact for all finite values.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// bfloat16 is the top half of a binary32; conversion rounds to nearest even.
inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
uint16_t f32_to_bf16(float f);

// Converts n elements of type t (n a multiple of the block size) to f32.
void dequantize_row(DType t, const void* src, float* dst, size_t n);
// Converts n f32 values to type t (n a multiple of the block size).
void quantize_row(DType t, const float* src, void* dst, size_t n);

}  // namespace kvc
