#include "base/dtype.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>

#include "base/error.h"
#include "base/ggml_quants.h"
#include "base/quant_blocks.h"

namespace kvc {

int block_elements(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
      return 1;
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::IQ4_NL:
      return 32;
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::Q8_K:
      return kSuperBlock;
  }
  return 1;
}

size_t block_bytes(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::F16:
    case DType::BF16:
      return 2;
    case DType::Q8_0:
      return sizeof(BlockQ8_0);
    case DType::Q4_0:
      return sizeof(BlockQ4_0);
    case DType::Q4_1:
      return sizeof(BlockQ4_1);
    case DType::Q5_0:
      return sizeof(BlockQ5_0);
    case DType::Q5_1:
      return sizeof(BlockQ5_1);
    case DType::Q2_K:
      return sizeof(BlockQ2_K);
    case DType::Q3_K:
      return sizeof(BlockQ3_K);
    case DType::Q4_K:
      return sizeof(BlockQ4_K);
    case DType::Q5_K:
      return sizeof(BlockQ5_K);
    case DType::Q6_K:
      return sizeof(BlockQ6_K);
    case DType::IQ4_NL:
      return sizeof(BlockIQ4_NL);
    case DType::Q8_K:
      return sizeof(BlockQ8_K);
  }
  return 0;
}

size_t row_bytes(DType t, size_t n) {
  return n / block_elements(t) * block_bytes(t);
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::F16:
      return "f16";
    case DType::BF16:
      return "bf16";
    case DType::Q8_0:
      return "q8_0";
    case DType::Q4_0:
      return "q4_0";
    case DType::Q4_1:
      return "q4_1";
    case DType::Q5_0:
      return "q5_0";
    case DType::Q5_1:
      return "q5_1";
    case DType::Q2_K:
      return "q2_K";
    case DType::Q3_K:
      return "q3_K";
    case DType::Q4_K:
      return "q4_K";
    case DType::Q5_K:
      return "q5_K";
    case DType::Q6_K:
      return "q6_K";
    case DType::IQ4_NL:
      return "iq4_nl";
    case DType::Q8_K:
      return "q8_K";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "fp32") return DType::F32;
  if (lower == "fp16") return DType::F16;
  for (int i = 0; i < kDTypeCount; ++i) {
    const auto t = static_cast<DType>(i);
    if (is_activation_only(t)) continue;
    std::string known(dtype_name(t));
    for (char& c : known) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower == known) return t;
  }
  return std::nullopt;
}

uint32_t ggml_type_id(DType t) {
  switch (t) {
    case DType::F32:
      return 0;
    case DType::F16:
      return 1;
    case DType::Q4_0:
      return 2;
    case DType::Q8_0:
      return 8;
    case DType::BF16:
      return 30;
    case DType::Q4_1:
      return 3;
    case DType::Q5_0:
      return 6;
    case DType::Q5_1:
      return 7;
    case DType::Q2_K:
      return 10;
    case DType::Q3_K:
      return 11;
    case DType::Q4_K:
      return 12;
    case DType::Q5_K:
      return 13;
    case DType::Q6_K:
      return 14;
    case DType::IQ4_NL:
      return 20;
    case DType::Q8_K:
      return 15;
  }
  return ~0u;
}

std::optional<DType> dtype_from_ggml(uint32_t id) {
  for (int i = 0; i < kDTypeCount; ++i) {
    const auto t = static_cast<DType>(i);
    if (!is_activation_only(t) && ggml_type_id(t) == id) return t;
  }
  return std::nullopt;
}

std::string_view ggml_type_name(uint32_t id) {
  static constexpr std::string_view names[] = {
      "F32",     "F16",    "Q4_0",    "Q4_1",  "Q4_2",   "Q4_3",  "Q5_0",  "Q5_1",
      "Q8_0",    "Q8_1",   "Q2_K",    "Q3_K",  "Q4_K",   "Q5_K",  "Q6_K",  "Q8_K",
      "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS",
      "I8",      "I16",    "I32",     "I64",   "F64",    "IQ1_M", "BF16"};
  if (id < std::size(names)) return names[id];
  return "unknown";
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mantissa <<= 1;
      } while ((mantissa & 0x400) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mantissa & 0x3ff) << 13;
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | mantissa << 13;
  } else {
    bits = sign | (exponent + 127 - 15) << 23 | mantissa << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 : 0);
  }
  if (abs >= 0x477ff000u) return sign | 0x7c00;  // rounds to infinity
  if (abs < 0x38800000u) {                       // subnormal or zero in f16
    if (abs < 0x33000000u) return sign;          // below half the smallest subnormal
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t value = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (value & 1))) ++value;
    return sign | static_cast<uint16_t>(value);
  }
  uint32_t value = ((abs >> 13) - ((127 - 15) << 10));
  const uint32_t rest = abs & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (value & 1))) ++value;
  return sign | static_cast<uint16_t>(value);
}

uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

void dequantize_row(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::F16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::BF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::Q8_0: {
      const auto* b = static_cast<const BlockQ8_0*>(src);
      for (size_t i = 0; i < n / 32; ++i) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < 32; ++j) dst[i * 32 + j] = d * b[i].qs[j];
      }
      return;
    }
    case DType::Q4_0: {
      const auto* b = static_cast<const BlockQ4_0*>(src);
      for (size_t i = 0; i < n / 32; ++i) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < 16; ++j) {
          dst[i * 32 + j] = d * ((b[i].qs[j] & 0x0f) - 8);
          dst[i * 32 + j + 16] = d * ((b[i].qs[j] >> 4) - 8);
        }
      }
      return;
    }
    case DType::Q8_K: {
      const auto* b = static_cast<const BlockQ8_K*>(src);
      for (size_t i = 0; i < n / 256; ++i) {
        for (int j = 0; j < 256; ++j) dst[i * 256 + j] = b[i].d * b[i].qs[j];
      }
      return;
    }
    case DType::IQ4_NL: {
      const auto* b = static_cast<const BlockIQ4_NL*>(src);
      for (size_t i = 0; i < n / 32; ++i) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < 16; ++j) {
          dst[i * 32 + j] = d * kIq4NlValues[b[i].qs[j] & 0x0f];
          dst[i * 32 + j + 16] = d * kIq4NlValues[b[i].qs[j] >> 4];
        }
      }
      return;
    }
    default:
      dequantize_ggml_blocks(t, src, dst, n);
      return;
  }
}

namespace {

// q[j] = x[j] / d rounded to nearest even for j < count, d = max |x[j]| / 127 (q8_0's and q8_K's
// rounding); returns d.
float round_to_int8(const float* x, int count, int8_t* q) {
  float amax = 0.0f;
  for (int j = 0; j < count; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < count; ++j) q[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
  return d;
}

}  // namespace

void quantize_row(DType t, const float* src, void* dst, size_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::BF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::Q8_0: {
      auto* b = static_cast<BlockQ8_0*>(dst);
      for (size_t i = 0; i < n / 32; ++i)
        b[i].d = f32_to_f16(round_to_int8(src + i * 32, 32, b[i].qs));
      return;
    }
    case DType::Q4_0: {
      auto* b = static_cast<BlockQ4_0*>(dst);
      for (size_t i = 0; i < n / 32; ++i) {
        const float* x = src + i * 32;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; ++j) {
          if (std::fabs(x[j]) > amax) {
            amax = std::fabs(x[j]);
            max = x[j];
          }
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        for (int j = 0; j < 16; ++j) {
          const auto q = [&](float v) {
            return static_cast<uint8_t>(std::min(15.0f, std::nearbyint(v * id) + 8.0f));
          };
          b[i].qs[j] = static_cast<uint8_t>(q(x[j]) | q(x[j + 16]) << 4);
        }
      }
      return;
    }
    case DType::Q8_K: {
      // As q8_0 over 256 values, the scale kept in f32.
      auto* b = static_cast<BlockQ8_K*>(dst);
      for (size_t i = 0; i < n / 256; ++i) {
        b[i].d = round_to_int8(src + i * 256, 256, b[i].qs);
        std::memset(b[i].padding, 0, sizeof b[i].padding);
        for (int k = 0; k < 16; ++k) {
          int sum = 0;
          for (int j = 0; j < 16; ++j) sum += b[i].qs[16 * k + j];
          b[i].bsums[k] = static_cast<int16_t>(sum);
        }
      }
      return;
    }
    case DType::IQ4_NL:
      quantize_iq4_nl(src, static_cast<BlockIQ4_NL*>(dst), n);
      return;
    default:
      quantize_ggml_blocks(t, src, dst, n);
      return;
  }
}

}  // namespace kvc
