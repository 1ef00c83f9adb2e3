// Keys grouped per channel: the step codes, the quantiser's bounds, and the scores of every
// instruction set against a double-precision reference over the dequantised keys, with the same
// bits on every instruction set and for any number of queries.
#include "base/channel_keys.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <vector>

#include "base/isa_fixtures.h"
#include "base/kv_attention.h"

namespace kvc {
namespace {

using kernels::kChannelTokens;
using namespace isa_fixtures;

// kChannelTokens f16 keys of hd channels: channel c has offset (c % 3 - 1) * 4 * c and spread
// 1 + c % 5, as keys with outlier channels have.
std::vector<uint16_t> make_keys(size_t hd, uint32_t seed) {
  const auto x = random_floats(kChannelTokens * hd, seed);
  std::vector<uint16_t> keys(x.size());
  for (size_t t = 0; t < kChannelTokens; ++t) {
    for (size_t c = 0; c < hd; ++c) {
      const float offset = static_cast<float>(static_cast<int>(c % 3) - 1) * 4.0f * c;
      keys[t * hd + c] = f32_to_f16(offset + x[t * hd + c] * static_cast<float>(1 + c % 5));
    }
  }
  return keys;
}

float dequantised(const uint8_t* slab, DType t, size_t hd, size_t c, int token) {
  return kernels::channel_min(slab, t, hd, c) +
         kernels::channel_slab_step(slab, t, hd, c) *
             static_cast<float>(kernels::channel_code(slab, t, c, token));
}

TEST(ChannelKeys, StepCodesRiseAndRoundUp) {
  for (int code = 2; code < 256; ++code) {
    EXPECT_LT(kernels::channel_step(static_cast<uint8_t>(code - 1)),
              kernels::channel_step(static_cast<uint8_t>(code)));
  }
  EXPECT_EQ(kernels::channel_step(0), 0.0f);
  EXPECT_EQ(kernels::channel_step(20 << 3), 1.0f);
  EXPECT_EQ(kernels::channel_step((20 << 3) | 4), 1.5f);
  for (float s : {1e-7f, 3e-4f, 0.01f, 0.3f, 1.0f, 1.01f, 7.0f, 1000.0f}) {
    const uint8_t code = kernels::channel_step_code_at_least(s);
    EXPECT_GE(kernels::channel_step(code), s);
    EXPECT_LT(kernels::channel_step(static_cast<uint8_t>(code - 1)), s);
    EXPECT_LE(kernels::channel_step(code), s * 1.125f + 1e-6f);  // within one mantissa step
  }
  EXPECT_EQ(kernels::channel_step_code_at_least(0.0f), 0);
  EXPECT_EQ(kernels::channel_step_code_at_least(1e9f), 255);
}

TEST(ChannelKeys, EveryKeyIsWithinHalfAStepOfItsValue) {
  for (DType t : {DType::Q8_0, DType::Q4_0}) {
    for (size_t hd : {8u, 64u, 128u}) {
      const auto keys = make_keys(hd, static_cast<uint32_t>(hd));
      std::vector<uint8_t> slab(kernels::channel_slab_bytes(t, hd), 0xAB);
      kernels::quantize_channel_keys(t, keys.data(), hd, slab.data());
      for (size_t c = 0; c < hd; ++c) {
        const float step = kernels::channel_slab_step(slab.data(), t, hd, c);
        float lo = INFINITY, hi = -INFINITY;
        for (int tok = 0; tok < kChannelTokens; ++tok) {
          const float v = f16_to_f32(keys[tok * hd + c]);
          lo = std::min(lo, v);
          hi = std::max(hi, v);
          EXPECT_LE(std::fabs(dequantised(slab.data(), t, hd, c, tok) - v), step * 0.5f + 1e-6f)
              << dtype_name(t) << " hd " << hd << " channel " << c << " token " << tok;
        }
        EXPECT_LE(kernels::channel_min(slab.data(), t, hd, c), lo);
        // The step is within one mantissa step of the smallest that reaches the maximum.
        EXPECT_LE(step, (hi - lo) / kernels::channel_max_code(t) * 1.13f + 1e-3f);
      }
    }
  }
}

TEST(ChannelKeys, AConstantChannelIsExact) {
  const size_t hd = 8;
  std::vector<uint16_t> keys(kChannelTokens * hd, f32_to_f16(-2.75f));
  std::vector<uint8_t> slab(kernels::channel_slab_bytes(DType::Q8_0, hd));
  kernels::quantize_channel_keys(DType::Q8_0, keys.data(), hd, slab.data());
  for (size_t c = 0; c < hd; ++c) {
    EXPECT_EQ(kernels::channel_slab_step(slab.data(), DType::Q8_0, hd, c), 0.0f);
    for (int tok = 0; tok < kChannelTokens; ++tok) {
      EXPECT_EQ(dequantised(slab.data(), DType::Q8_0, hd, c, tok), -2.75f);
    }
  }
}

// Scores of nq queries over the first n keys of a slab, through kv_scores_queries.
std::vector<std::vector<float>> scores(DType t, const std::vector<uint8_t>& slab,
                                       const std::vector<std::vector<float>>& q, size_t n,
                                       size_t hd) {
  std::vector<std::vector<float>> out(q.size(), std::vector<float>(n));
  std::vector<const float*> qp;
  std::vector<float*> op;
  for (size_t j = 0; j < q.size(); ++j) {
    qp.push_back(q[j].data());
    op.push_back(out[j].data());
  }
  kernels::KvRows rows{t, slab.data(), 0, 0, true};
  kernels::kv_scores_queries(rows, qp.data(), qp.size(), n, hd, 0.125f, op.data());
  return out;
}

TEST(ChannelKeys, ScoresMatchTheReferenceWithOneSetOfBitsOnEveryIsa) {
  IsaGuard guard;
  for (DType t : {DType::Q8_0, DType::Q4_0}) {
    for (size_t hd : {8u, 16u, 64u, 80u, 128u}) {
      const auto keys = make_keys(hd, 7 + static_cast<uint32_t>(hd));
      std::vector<uint8_t> slab(kernels::channel_slab_bytes(t, hd));
      kernels::quantize_channel_keys(t, keys.data(), hd, slab.data());
      std::vector<std::vector<float>> q;
      for (uint32_t j = 0; j < 11; ++j) q.push_back(random_floats(hd, 100 + j));
      std::vector<std::vector<float>> first;
      for (kernels::Isa isa : supported_isas()) {
        kernels::set_isa(isa);
        for (size_t n : {1u, 7u, 16u, 31u, 32u}) {
          const auto all = scores(t, slab, q, n, hd);
          for (size_t j = 0; j < q.size(); ++j) {
            // One query alone has the bits it has among eleven.
            const auto alone = scores(t, slab, {q[j]}, n, hd);
            ASSERT_EQ(alone[0], all[j]);
            double magnitude = 0.0;
            for (size_t tok = 0; tok < n; ++tok) {
              double ref = 0.0;
              for (size_t c = 0; c < hd; ++c) {
                const double k = dequantised(slab.data(), t, hd, c, static_cast<int>(tok));
                ref += static_cast<double>(q[j][c]) * k;
                magnitude += std::fabs(q[j][c] * k);
              }
              EXPECT_NEAR(all[j][tok], ref * 0.125, 1e-5 * magnitude + 1e-6)
                  << dtype_name(t) << " hd " << hd << " n " << n << " token " << tok;
            }
          }
          if (n == 32) {
            if (first.empty()) {
              first = all;
            } else {
              EXPECT_EQ(first, all) << "instruction set " << static_cast<int>(isa);
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvc
