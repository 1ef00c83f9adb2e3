// q8_0 and q4_0 as KV storage: quantize_row / dequantize_row against a reference written here
// from the GGUF format's definition, and the round-trip error bounds attention relies on.
//
// The definition (ggml's reference quantizers): a group holds 32 values and an f16 scale d.
//   q8_0: d = amax / 127, q_i = round(x_i / d) in [-127, 127], x_i ~ d * q_i.
//   q4_0: m = the value of largest magnitude (with its sign), d = m / -8,
//         q_i = min(15, trunc(x_i / d + 8.5)) in [0, 15], x_i ~ d * (q_i - 8); byte j holds
//         element j in its low nibble and element j + 16 in its high nibble.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/dtype.h"

namespace kvc {
namespace {

// Little-endian bytes of one group, as a GGUF file or a KV block stores them.
std::vector<uint8_t> reference_quantize(DType t, const float* x) {
  std::vector<uint8_t> out(block_bytes(t));
  float amax = 0.0f, max = 0.0f;
  for (int i = 0; i < 32; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  const float d = t == DType::Q8_0 ? amax / 127.0f : max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const uint16_t h = f32_to_f16(d);
  out[0] = static_cast<uint8_t>(h & 0xff);
  out[1] = static_cast<uint8_t>(h >> 8);
  for (int i = 0; i < 32; ++i) {
    if (t == DType::Q8_0) {
      out[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[i] * id)));
    } else {
      const int q = std::min(15, static_cast<int>(x[i] * id + 8.5f));
      out[2 + i % 16] |= static_cast<uint8_t>(i < 16 ? q : q << 4);
    }
  }
  return out;
}

float reference_value(DType t, const uint8_t* group, int i) {
  const float d = f16_to_f32(static_cast<uint16_t>(group[0] | group[1] << 8));
  if (t == DType::Q8_0) return d * static_cast<float>(static_cast<int8_t>(group[2 + i]));
  const int nibble = i < 16 ? group[2 + i] & 0x0f : group[2 + i - 16] >> 4;
  return d * static_cast<float>(nibble - 8);
}

std::vector<float> normal_values(size_t n, uint32_t seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  // Keys have outlier channels: a few values far outside the rest.
  for (size_t i = 5; i < n; i += 97) x[i] *= 12.0f;
  return x;
}

// Whether x * id lies so close to a rounding boundary that float evaluation order may decide.
bool near_tie(float v) {
  const float frac = v - std::floor(v);
  return std::fabs(frac - 0.5f) < 1e-4f;
}

TEST(KvQuantization, EncodesAsTheFormatDefines) {
  const auto x = normal_values(32 * 64, 5, 1.5f);
  for (DType t : {DType::Q8_0, DType::Q4_0}) {
    std::vector<uint8_t> got(row_bytes(t, x.size()));
    quantize_row(t, x.data(), got.data(), x.size());
    size_t ties = 0;
    for (size_t g = 0; g < x.size() / 32; ++g) {
      const float* xs = x.data() + g * 32;
      const std::vector<uint8_t> want = reference_quantize(t, xs);
      const uint8_t* have = got.data() + g * block_bytes(t);
      ASSERT_EQ(have[0], want[0]) << dtype_name(t) << " group " << g << " scale";
      ASSERT_EQ(have[1], want[1]) << dtype_name(t) << " group " << g << " scale";
      const float d = f16_to_f32(static_cast<uint16_t>(want[0] | want[1] << 8));
      for (int i = 0; i < 32; ++i) {
        const float a = reference_value(t, have, i), b = reference_value(t, want.data(), i);
        if (a == b) continue;
        // Only an exact tie may round either way (ggml rounds halves away from zero).
        ASSERT_TRUE(near_tie(xs[i] / d)) << dtype_name(t) << " group " << g << " element " << i;
        EXPECT_LE(std::fabs(a - b), std::fabs(d) * 1.001f);
        ++ties;
      }
    }
    EXPECT_LE(ties, 2u) << dtype_name(t);
  }
}

TEST(KvQuantization, DecodesEveryCodeAsTheFormatDefines) {
  std::mt19937 rng(9);
  for (DType t : {DType::Q8_0, DType::Q4_0}) {
    std::vector<uint8_t> bytes(block_bytes(t) * 64);
    for (size_t g = 0; g < 64; ++g) {
      uint8_t* b = bytes.data() + g * block_bytes(t);
      // Finite scales of every magnitude and sign; codes uniformly random.
      const uint16_t h = static_cast<uint16_t>(rng() % 0x7c00) | (g % 2 ? 0x8000 : 0);
      b[0] = static_cast<uint8_t>(h & 0xff);
      b[1] = static_cast<uint8_t>(h >> 8);
      for (size_t i = 2; i < block_bytes(t); ++i) b[i] = static_cast<uint8_t>(rng());
    }
    std::vector<float> got(64 * 32);
    dequantize_row(t, bytes.data(), got.data(), got.size());
    for (size_t g = 0; g < 64; ++g) {
      for (int i = 0; i < 32; ++i) {
        const float want = reference_value(t, bytes.data() + g * block_bytes(t), i);
        ASSERT_EQ(std::memcmp(&got[g * 32 + i], &want, 4), 0)
            << dtype_name(t) << " group " << g << " element " << i;
      }
    }
  }
}

// Bounds, with d the group's scale before f16 rounding (q8_0: amax / 127; q4_0: amax / 8):
//   q8_0: |x - x'| <= d / 2 + 127 * |d - f16(d)| <= 0.5625 d (f16 keeps 11 significant bits).
//   q4_0: |x - x'| <= d / 2 + 8 * |d - f16(d)| <= 0.51 d, except values on the side opposite the
//         extreme beyond 7.5 d, which clamp to 7 d: within d + 8 * 2^-11 d.
// Over normal data with one 12x outlier per 97 values (about a third of the groups scaled by
// one) the RMS error is 1.0% (q8_0) and 15% (q4_0) of the RMS value; checked below 1.2% / 18%.
TEST(KvQuantization, RoundTripErrorStaysWithinItsBound) {
  const auto x = normal_values(32 * 512, 11, 0.8f);
  for (DType t : {DType::Q8_0, DType::Q4_0}) {
    std::vector<uint8_t> q(row_bytes(t, x.size()));
    std::vector<float> back(x.size());
    quantize_row(t, x.data(), q.data(), x.size());
    dequantize_row(t, q.data(), back.data(), x.size());
    double err2 = 0.0, x2 = 0.0;
    for (size_t g = 0; g < x.size() / 32; ++g) {
      float amax = 0.0f, max = 0.0f;
      for (int i = 0; i < 32; ++i) {
        if (std::fabs(x[g * 32 + i]) > amax) {
          amax = std::fabs(x[g * 32 + i]);
          max = x[g * 32 + i];
        }
      }
      const float d = amax / (t == DType::Q8_0 ? 127.0f : 8.0f);
      for (int i = 0; i < 32; ++i) {
        const float v = x[g * 32 + i];
        const float err = std::fabs(v - back[g * 32 + i]);
        const bool clamped = t == DType::Q4_0 && v * max < 0 && std::fabs(v) > 7.5f * d;
        const float bound = t == DType::Q8_0 ? 0.5625f * d : clamped ? 1.004f * d : 0.51f * d;
        ASSERT_LE(err, bound) << dtype_name(t) << " element " << g * 32 + i << " of " << v;
        err2 += static_cast<double>(err) * err;
        x2 += static_cast<double>(v) * v;
      }
    }
    EXPECT_LT(std::sqrt(err2 / x2), t == DType::Q8_0 ? 0.012 : 0.18) << dtype_name(t);
  }
}

}  // namespace
}  // namespace kvc
