#include "base/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace kvc {
namespace {

TEST(DType, F16RoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_f16(f), h) << "f16 0x" << std::hex << h;
  }
}

TEST(DType, F16KnownValuesAndRounding) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));             // smallest subnormal
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);                          // rounds up to infinity
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie to even (down)
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie to even (up)
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -26)), 0x0000);  // below half the smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // tie, even stays
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, SizesMatchGgml) {
  EXPECT_EQ(row_bytes(DType::Q8_0, 64), 68u);
  EXPECT_EQ(row_bytes(DType::Q4_0, 64), 36u);
  EXPECT_EQ(row_bytes(DType::F16, 10), 20u);
  EXPECT_EQ(ggml_type_id(DType::Q8_0), 8u);
  EXPECT_EQ(dtype_from_ggml(30), DType::BF16);
  EXPECT_EQ(dtype_from_ggml(12), DType::Q4_K);
  EXPECT_FALSE(dtype_from_ggml(15).has_value());  // q8_K: only llama.cpp's activations use it
  EXPECT_EQ(dtype_from_ggml(20), DType::IQ4_NL);
  EXPECT_FALSE(dtype_from_ggml(23).has_value());  // iq4_xs
  EXPECT_EQ(ggml_type_name(12), "Q4_K");
  EXPECT_EQ(parse_dtype("fp16"), DType::F16);
  EXPECT_EQ(parse_dtype("q5_k"), DType::Q5_K);
  EXPECT_EQ(parse_dtype("Q6_K"), DType::Q6_K);
  EXPECT_FALSE(parse_dtype("q8_k").has_value());
  EXPECT_EQ(row_bytes(DType::Q8_K, 512), 640u);
  EXPECT_EQ(dtype_name(DType::Q8_K), "q8_K");
  EXPECT_TRUE(is_activation_only(DType::Q8_K));
  EXPECT_FALSE(is_activation_only(DType::Q8_0));
}

// q8_K, the K-quant weights' activations: within half a step of each 256 values' scale (kept in
// f32), and each 16 values' sum stored beside them.
TEST(DType, Q8KRowsStayWithinHalfAStepAndCarryTheirSums) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> x(512), back(512);
  for (float& v : x) v = dist(rng);
  std::vector<BlockQ8_K> q(2);
  quantize_row(DType::Q8_K, x.data(), q.data(), x.size());
  dequantize_row(DType::Q8_K, q.data(), back.data(), x.size());
  for (size_t b = 0; b < 2; ++b) {
    float amax = 0.0f;
    for (int j = 0; j < 256; ++j) amax = std::max(amax, std::fabs(x[b * 256 + j]));
    EXPECT_EQ(q[b].d, amax / 127.0f);
    for (int j = 0; j < 256; ++j) {
      EXPECT_NEAR(back[b * 256 + j], x[b * 256 + j], amax / 127.0f * 0.5f * 1.0001f)
          << "element " << b * 256 + j;
    }
    for (int k = 0; k < 16; ++k) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += q[b].qs[16 * k + j];
      EXPECT_EQ(q[b].bsums[k], sum) << "block " << b << " sum " << k;
    }
  }
}

// Quantisation error is bounded by half a step of each block's scale (plus the f16 rounding
// of the scale itself, relative 2^-11). q4_0's range [-8, 7] steps is lopsided: a value on the
// side opposite the block's extreme can be clamped by up to one whole step.
TEST(DType, QuantizedRowsStayWithinHalfAStep) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> x(256), back(256);
  for (float& v : x) v = dist(rng);
  for (DType t : {DType::Q8_0, DType::Q4_0}) {
    std::vector<uint8_t> q(row_bytes(t, x.size()));
    quantize_row(t, x.data(), q.data(), x.size());
    dequantize_row(t, q.data(), back.data(), x.size());
    for (size_t b = 0; b < x.size() / 32; ++b) {
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
      const float step = amax / (t == DType::Q8_0 ? 127.0f : 8.0f);
      for (int j = 0; j < 32; ++j) {
        EXPECT_NEAR(back[b * 32 + j], x[b * 32 + j],
                    (t == DType::Q4_0 ? step : step * 0.5f) + amax * 1e-3f)
            << dtype_name(t) << " element " << b * 32 + j;
      }
    }
  }
}

TEST(DType, AllZeroBlockQuantizesToZero) {
  std::vector<float> x(32, 0.0f), back(32, 1.0f);
  BlockQ8_0 q{};
  quantize_row(DType::Q8_0, x.data(), &q, 32);
  dequantize_row(DType::Q8_0, &q, back.data(), 32);
  for (float v : back) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace kvc
