#include "base/ggml_quants.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "base/quant_blocks.h"

namespace kvc {
namespace {

#include "base/quant_unpack.h"

// The integer a signed (type-0) format subtracts from its unsigned q; 0 for type-1 formats,
// whose offset is the block minimum.
template <class U>
constexpr int bias_of() {
  if constexpr (std::is_same_v<U, UnpackQ5_0>) return 16;
  if constexpr (std::is_same_v<U, UnpackQ3_K>) return 4;
  if constexpr (std::is_same_v<U, UnpackQ6_K>) return 32;
  return 0;
}

int round_clamp(float v, int lo, int hi) {
  const float r = std::nearbyint(v);
  if (!(r >= static_cast<float>(lo))) return lo;  // also NaN
  return r > static_cast<float>(hi) ? hi : static_cast<int>(r);
}

// Stores f as f16 and returns the value the file will hold.
float store_f16(uint16_t* field, float f) {
  *field = f32_to_f16(f);
  return f16_to_f32(*field);
}

// Range of a type-1 sub-block: value = scale * q + offset, q in 0..levels. With
// nonpositive_min the offset is at most 0 (the K formats store -offset unsigned).
struct Range {
  float scale, offset;
};
Range min_max_range(const float* x, int count, int levels, bool nonpositive_min) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < count; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  if (nonpositive_min) lo = std::min(lo, 0.0f);
  return {(hi - lo) / static_cast<float>(levels), lo};
}

// Scale of a type-0 sub-block whose q runs over -half..half-1: the value of largest magnitude
// maps to -half, as ggml's own reference quantizers do.
float signed_scale(const float* x, int count, int half) {
  float amax = 0.0f, max = 0.0f;
  for (int i = 0; i < count; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  return max / static_cast<float>(-half);
}

// q = round((x - offset) / scale) in 0..levels, for every element of a sub-block.
void quantize_unsigned(const float* x, int count, float scale, float offset, int levels,
                       uint8_t* q) {
  const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
  for (int i = 0; i < count; ++i) {
    q[i] = static_cast<uint8_t>(round_clamp((x[i] - offset) * inv, 0, levels));
  }
}

void pack_low_nibbles_32(const uint8_t* q, uint8_t* qs) {
  for (int j = 0; j < 16; ++j)
    qs[j] = static_cast<uint8_t>((q[j] & 0x0f) | (q[j + 16] & 0x0f) << 4);
}

void pack_fifth_bits_32(const uint8_t* q, uint8_t* qh) {
  uint32_t bits = 0;
  for (int j = 0; j < 32; ++j) bits |= static_cast<uint32_t>(q[j] >> 4) << j;
  for (int i = 0; i < 4; ++i) qh[i] = static_cast<uint8_t>(bits >> (8 * i));
}

void pack_two_bits_256(const uint8_t* q, uint8_t* qs) {
  std::memset(qs, 0, 64);
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 32; ++l) qs[32 * h + l] |= (q[128 * h + 32 * j + l] & 3) << (2 * j);
}

void pack_k4_scales(const int* sc, const int* mn, uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>(sc[j] | (sc[j + 4] >> 4) << 6);
    s[j + 4] = static_cast<uint8_t>(mn[j] | (mn[j + 4] >> 4) << 6);
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0f) | (mn[j + 4] & 0x0f) << 4);
  }
}

// The smallest integer in 0..hi whose multiple of unit reaches v (0 when unit is 0): scales
// rounded up, so that a sub-block's extreme values are never clamped.
int ceil_steps(float v, float unit, int hi) {
  if (!(unit > 0.0f)) return 0;
  return round_clamp(std::ceil(v / unit), 0, hi);
}

// A K super-block of type-1 sub-blocks (q2_K, q4_K, q5_K): per sub-block ranges; the minima
// quantized (rounded up) against the largest, then the scales each sub-block needs from its
// quantized minimum to its maximum, rounded up against the largest; then each element.
template <int Sub, int ScaleLevels>
void quantize_k_type1(const float* x, int levels, uint16_t* d_field, uint16_t* dmin_field, int* sc,
                      int* mn, uint8_t* q) {
  constexpr int kSubs = kSuperBlock / Sub;
  Range r[kSubs];
  float max_min = 0.0f;
  for (int k = 0; k < kSubs; ++k) {
    r[k] = min_max_range(x + k * Sub, Sub, levels, true);
    max_min = std::max(max_min, -r[k].offset);
  }
  const float dmin = store_f16(dmin_field, max_min / ScaleLevels);
  float needed[kSubs], max_scale = 0.0f;
  for (int k = 0; k < kSubs; ++k) {
    mn[k] = ceil_steps(-r[k].offset, dmin, ScaleLevels);
    const float top = r[k].offset + r[k].scale * static_cast<float>(levels);
    needed[k] = (top + dmin * static_cast<float>(mn[k])) / static_cast<float>(levels);
    max_scale = std::max(max_scale, needed[k]);
  }
  const float d = store_f16(d_field, max_scale / ScaleLevels);
  for (int k = 0; k < kSubs; ++k) {
    sc[k] = ceil_steps(needed[k], d, ScaleLevels);
    quantize_unsigned(x + k * Sub, Sub, d * static_cast<float>(sc[k]),
                      -(dmin * static_cast<float>(mn[k])), levels, q + k * Sub);
  }
}

// A K super-block of 16 type-0 sub-blocks of 16 (q3_K, q6_K): q in -half..half-1 stored as
// q + half, sub-block scales as signed integers in -scale_half..scale_half-1, rounded away from
// zero so that each sub-block's extreme maps inside the range.
template <int Half, int ScaleHalf>
void quantize_k_type0(const float* x, uint16_t* d_field, int* sc, uint8_t* q) {
  float s[16];
  float amax = 0.0f, max = 0.0f;
  for (int k = 0; k < 16; ++k) {
    s[k] = signed_scale(x + 16 * k, 16, Half);
    if (std::fabs(s[k]) > amax) {
      amax = std::fabs(s[k]);
      max = s[k];
    }
  }
  const float d = store_f16(d_field, max / -ScaleHalf);
  for (int k = 0; k < 16; ++k) {
    const float ratio = d != 0.0f ? s[k] / d : 0.0f;
    sc[k] =
        round_clamp(ratio < 0.0f ? std::floor(ratio) : std::ceil(ratio), -ScaleHalf, ScaleHalf - 1);
    const float scale = d * static_cast<float>(sc[k]);
    quantize_unsigned(x + 16 * k, 16, scale, -static_cast<float>(Half) * scale, 2 * Half - 1,
                      q + 16 * k);
  }
}

void quantize_block(const float* x, BlockQ4_1& b) {
  uint8_t q[32];
  const Range r = min_max_range(x, 32, 15, false);
  const float d = store_f16(&b.d, r.scale);
  const float m = store_f16(&b.m, r.offset);
  quantize_unsigned(x, 32, d, m, 15, q);
  pack_low_nibbles_32(q, b.qs);
}

void quantize_block(const float* x, BlockQ5_0& b) {
  uint8_t q[32];
  const float d = store_f16(&b.d, signed_scale(x, 32, 16));
  quantize_unsigned(x, 32, d, -16.0f * d, 31, q);
  pack_low_nibbles_32(q, b.qs);
  pack_fifth_bits_32(q, b.qh);
}

void quantize_block(const float* x, BlockQ5_1& b) {
  uint8_t q[32];
  const Range r = min_max_range(x, 32, 31, false);
  const float d = store_f16(&b.d, r.scale);
  const float m = store_f16(&b.m, r.offset);
  quantize_unsigned(x, 32, d, m, 31, q);
  pack_low_nibbles_32(q, b.qs);
  pack_fifth_bits_32(q, b.qh);
}

void quantize_block(const float* x, BlockQ2_K& b) {
  uint8_t q[256];
  int sc[16], mn[16];
  quantize_k_type1<16, 15>(x, 3, &b.d, &b.dmin, sc, mn, q);
  for (int k = 0; k < 16; ++k) b.scales[k] = static_cast<uint8_t>(sc[k] | mn[k] << 4);
  pack_two_bits_256(q, b.qs);
}

void quantize_block(const float* x, BlockQ3_K& b) {
  uint8_t q[256];
  int sc[16];
  quantize_k_type0<4, 32>(x, &b.d, sc, q);
  pack_two_bits_256(q, b.qs);
  std::memset(b.hmask, 0, sizeof b.hmask);
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 32; ++l)
        b.hmask[l] |= ((q[128 * h + 32 * j + l] >> 2) & 1) << (4 * h + j);
  std::memset(b.scales, 0, sizeof b.scales);
  for (int k = 0; k < 16; ++k) {
    const int v = sc[k] + 32;
    b.scales[k < 8 ? k : k - 8] |= static_cast<uint8_t>((v & 0x0f) << (k < 8 ? 0 : 4));
    b.scales[8 + k % 4] |= static_cast<uint8_t>((v >> 4) << (2 * (k / 4)));
  }
}

void quantize_block(const float* x, BlockQ4_K& b) {
  uint8_t q[256];
  int sc[16], mn[16];
  quantize_k_type1<32, 63>(x, 15, &b.d, &b.dmin, sc, mn, q);
  pack_k4_scales(sc, mn, b.scales);
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l)
      b.qs[32 * c + l] = static_cast<uint8_t>(q[64 * c + l] | q[64 * c + 32 + l] << 4);
}

void quantize_block(const float* x, BlockQ5_K& b) {
  uint8_t q[256];
  int sc[16], mn[16];
  quantize_k_type1<32, 63>(x, 31, &b.d, &b.dmin, sc, mn, q);
  pack_k4_scales(sc, mn, b.scales);
  std::memset(b.qh, 0, sizeof b.qh);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t lo = q[64 * c + l], hi = q[64 * c + 32 + l];
      b.qs[32 * c + l] = static_cast<uint8_t>((lo & 0x0f) | (hi & 0x0f) << 4);
      b.qh[l] |= static_cast<uint8_t>((lo >> 4) << (2 * c) | (hi >> 4) << (2 * c + 1));
    }
  }
}

void quantize_block(const float* x, BlockQ6_K& b) {
  uint8_t q[256];
  int sc[16];
  quantize_k_type0<32, 128>(x, &b.d, sc, q);
  for (int k = 0; k < 16; ++k) b.scales[k] = static_cast<int8_t>(sc[k]);
  std::memset(b.ql, 0, sizeof b.ql);
  std::memset(b.qh, 0, sizeof b.qh);
  for (int h = 0; h < 2; ++h) {
    for (int p = 0; p < 4; ++p) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t v = q[128 * h + 32 * p + l];
        b.ql[64 * h + 32 * (p & 1) + l] |= static_cast<uint8_t>((v & 0x0f) << (4 * (p >> 1)));
        b.qh[32 * h + l] |= static_cast<uint8_t>((v >> 4) << (2 * p));
      }
    }
  }
}

}  // namespace

namespace {

// The iq4_nl level nearest v (ties to the lower), by the midpoints between levels.
int nearest_iq4_nl(float v) {
  static const auto midpoints = [] {
    std::array<float, 15> m{};
    for (int i = 0; i < 15; ++i) m[i] = 0.5f * (kIq4NlValues[i] + kIq4NlValues[i + 1]);
    return m;
  }();
  return static_cast<int>(std::upper_bound(midpoints.begin(), midpoints.end(), v) -
                          midpoints.begin());
}

// Indices of x's nearest levels at scale d, and their squared error.
double assign_iq4_nl(const float* x, float d, uint8_t* q) {
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  double err = 0;
  for (int j = 0; j < 32; ++j) {
    q[j] = static_cast<uint8_t>(nearest_iq4_nl(x[j] * id));
    const double e = x[j] - static_cast<double>(d) * kIq4NlValues[q[j]];
    err += e * e;
  }
  return err;
}

void quantize_block(const float* x, BlockIQ4_NL& b) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  uint8_t q[32], best_q[32];
  float best_d = 0.0f;
  double best_err = -1;
  if (amax > 0.0f) {
    // The largest magnitude at the first level (-127) or a little inside it.
    for (int k = 0; k <= 16; k += 2) {
      const float d0 = max / static_cast<float>(kIq4NlValues[0] + k);
      assign_iq4_nl(x, d0, q);
      double xv = 0, vv = 0;
      for (int j = 0; j < 32; ++j) {
        xv += static_cast<double>(x[j]) * kIq4NlValues[q[j]];
        vv += static_cast<double>(kIq4NlValues[q[j]]) * kIq4NlValues[q[j]];
      }
      const float d = f16_to_f32(f32_to_f16(vv > 0 ? static_cast<float>(xv / vv) : d0));
      const double err = assign_iq4_nl(x, d, q);
      if (best_err < 0 || err < best_err) {
        best_err = err;
        best_d = d;
        std::memcpy(best_q, q, 32);
      }
    }
  } else {
    std::memset(best_q, 8, 32);  // the level nearest zero
  }
  b.d = f32_to_f16(best_d);
  pack_low_nibbles_32(best_q, b.qs);
}

}  // namespace

void quantize_iq4_nl(const float* src, BlockIQ4_NL* dst, size_t n) {
  for (size_t i = 0; i < n / 32; ++i) quantize_block(src + i * 32, dst[i]);
}

bool is_ggml_weight_quant(DType t) {
  return with_unpacker(t, [](auto) {});
}

void dequantize_ggml_blocks(DType t, const void* src, float* dst, size_t n) {
  const bool known = with_unpacker(t, [&](auto unpacker) {
    using U = decltype(unpacker);
    constexpr int kUnit = U::kUnit;
    constexpr int kBias = bias_of<U>();
    const auto* blocks = static_cast<const typename U::Block*>(src);
    Unpacked<kUnit> up;
    for (size_t i = 0; i < n / kUnit; ++i) {
      U::unpack(blocks[i], up);
      float* y = dst + i * kUnit;
      for (int e = 0; e < kUnit; ++e) {
        if constexpr (kBias != 0) {
          y[e] = up.scale[e / 16] * static_cast<float>(up.q[e] - kBias);
        } else {
          y[e] = up.scale[e / 16] * static_cast<float>(up.q[e]) + up.offset[e / 16];
        }
      }
    }
  });
  if (!known) fail("dequantize: {} is not a GGML block type handled here", dtype_name(t));
}

void quantize_ggml_blocks(DType t, const float* src, void* dst, size_t n) {
  const bool known = with_unpacker(t, [&](auto unpacker) {
    using U = decltype(unpacker);
    auto* blocks = static_cast<typename U::Block*>(dst);
    for (size_t i = 0; i < n / U::kUnit; ++i) quantize_block(src + i * U::kUnit, blocks[i]);
  });
  if (!known) fail("quantize: {} is not a GGML block type handled here", dtype_name(t));
}

}  // namespace kvc
