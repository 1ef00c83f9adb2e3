// Attention over quantised KV read in place: every instruction set against a double-precision
// reference over the dequantised values, in both groupings (whole groups along a head, and a
// head's run inside a group shared with the token's other heads).
#include "base/kv_attention.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "base/isa_fixtures.h"
#include "base/kernels.h"

namespace kvc {
namespace {

using kernels::Isa;
using namespace isa_fixtures;

// n tokens, each a row of `per_token` values quantised in groups of 32, and the dequantised
// values of the head of hd values starting at element `at` of each row.
struct Rows {
  std::vector<uint8_t> bytes;
  size_t stride = 0;
  std::vector<std::vector<float>> head;
};

Rows make_rows(DType t, size_t n, size_t per_token, size_t at, size_t hd, uint32_t seed) {
  Rows r;
  r.stride = row_bytes(t, per_token);
  r.bytes.resize(n * r.stride);
  const auto x = random_floats(n * per_token, seed);
  std::vector<float> back(per_token);
  for (size_t i = 0; i < n; ++i) {
    quantize_row(t, x.data() + i * per_token, r.bytes.data() + i * r.stride, per_token);
    dequantize_row(t, r.bytes.data() + i * r.stride, back.data(), per_token);
    r.head.emplace_back(back.begin() + at, back.begin() + at + hd);
  }
  return r;
}

struct Layout {
  size_t hd, per_token, at;  // head size, values per token row, where the head starts
};

// Head grouping (hd a multiple of 32) and token grouping (heads of 8 or 16 within a group, at
// every position a head can take).
const Layout kLayouts[] = {{32, 32, 0},  {64, 64, 0}, {96, 96, 0},  {128, 128, 0}, {256, 256, 0},
                           {8, 32, 0},   {8, 32, 8},  {8, 32, 16},  {8, 32, 24},   {16, 32, 0},
                           {16, 32, 16}, {8, 64, 40}, {16, 64, 48}, {4, 32, 20}};

// Tolerance: n products summed in f32 (about n * 2^-24 * sum |q_i k_i|), allowed 4x.
TEST(KvAttention, ScoresMatchTheDequantisedReferenceOnEveryIsa) {
  IsaGuard guard;
  for (Isa isa : supported_isas()) {
    kernels::set_isa(isa);
    for (DType t : {DType::Q8_0, DType::Q4_0}) {
      for (const Layout& l : kLayouts) {
        const size_t n = 19;
        const Rows rows = make_rows(t, n, l.per_token, l.at, l.hd, 3 + l.at);
        const auto q = random_floats(l.hd, 17);
        const size_t group_at = l.at / 32 * block_bytes(t);
        const kernels::KvRows k{t, rows.bytes.data() + group_at, rows.stride,
                                static_cast<int>(l.at % 32)};
        std::vector<float> got(n);
        kernels::kv_scores(k, q.data(), n, l.hd, 0.25f, got.data());
        for (size_t i = 0; i < n; ++i) {
          double want = 0.0, mag = 0.0;
          for (size_t e = 0; e < l.hd; ++e) {
            want += static_cast<double>(q[e]) * rows.head[i][e];
            mag += std::fabs(static_cast<double>(q[e]) * rows.head[i][e]);
          }
          EXPECT_NEAR(got[i], want * 0.25, 4.0 * l.hd * std::ldexp(1.0, -24) * mag + 1e-7)
              << kernels::isa_name(isa) << " " << dtype_name(t) << " hd " << l.hd << " at " << l.at
              << " row " << i;
        }
      }
    }
  }
}

// out += p_t * v_t in order: each lane rounds once or twice per token (fused or not).
TEST(KvAttention, AccumulateMatchesTheDequantisedReferenceOnEveryIsa) {
  IsaGuard guard;
  for (Isa isa : supported_isas()) {
    kernels::set_isa(isa);
    for (DType t : {DType::Q8_0, DType::Q4_0}) {
      for (const Layout& l : kLayouts) {
        const size_t n = 23;
        const Rows rows = make_rows(t, n, l.per_token, l.at, l.hd, 5 + l.at);
        const auto p = random_floats(n, 29);
        const size_t group_at = l.at / 32 * block_bytes(t);
        const kernels::KvRows v{t, rows.bytes.data() + group_at, rows.stride,
                                static_cast<int>(l.at % 32)};
        std::vector<float> got(l.hd, 0.5f);
        kernels::kv_accumulate(v, p.data(), n, l.hd, got.data());
        for (size_t e = 0; e < l.hd; ++e) {
          double want = 0.5, mag = 0.5;
          for (size_t i = 0; i < n; ++i) {
            want += static_cast<double>(p[i]) * rows.head[i][e];
            mag += std::fabs(static_cast<double>(p[i]) * rows.head[i][e]);
          }
          EXPECT_NEAR(got[e], want, 4.0 * n * std::ldexp(1.0, -24) * mag)
              << kernels::isa_name(isa) << " " << dtype_name(t) << " hd " << l.hd << " at " << l.at
              << " element " << e;
        }
      }
    }
  }
}

// A row's score, and the weighted sum over rows, do not depend on how many rows one call takes
// (kernels fold several rows' sums together and keep sums in registers): the bits of each row
// alone.
TEST(KvAttention, ManyRowsAtOnceHaveTheBitsOfEachRowAlone) {
  IsaGuard guard;
  for (Isa isa : supported_isas()) {
    kernels::set_isa(isa);
    for (DType t : {DType::Q8_0, DType::Q4_0}) {
      for (const Layout& l : kLayouts) {
        const size_t n = 21;
        const Rows rows = make_rows(t, n, l.per_token, l.at, l.hd, 7 + l.at);
        const auto q = random_floats(l.hd, 31);
        const auto p = random_floats(n, 37);
        const size_t group_at = l.at / 32 * block_bytes(t);
        const kernels::KvRows kv{t, rows.bytes.data() + group_at, rows.stride,
                                 static_cast<int>(l.at % 32)};
        const auto row = [&](size_t i) {
          return kernels::KvRows{t, kv.base + i * rows.stride, rows.stride, kv.first};
        };
        std::vector<float> together(n), alone(n);
        kernels::kv_scores(kv, q.data(), n, l.hd, 0.3f, together.data());
        for (size_t i = 0; i < n; ++i)
          kernels::kv_scores(row(i), q.data(), 1, l.hd, 0.3f, &alone[i]);
        std::vector<float> sum_together(l.hd, 0.25f), sum_alone(l.hd, 0.25f);
        kernels::kv_accumulate(kv, p.data(), n, l.hd, sum_together.data());
        for (size_t i = 0; i < n; ++i)
          kernels::kv_accumulate(row(i), &p[i], 1, l.hd, sum_alone.data());
        const std::string where = std::string(kernels::isa_name(isa)) + " " +
                                  std::string(dtype_name(t)) + " hd " + std::to_string(l.hd) +
                                  " at " + std::to_string(l.at);
        for (size_t i = 0; i < n; ++i) {
          EXPECT_EQ(std::bit_cast<uint32_t>(together[i]), std::bit_cast<uint32_t>(alone[i]))
              << where << " row " << i;
        }
        for (size_t e = 0; e < l.hd; ++e) {
          EXPECT_EQ(std::bit_cast<uint32_t>(sum_together[e]), std::bit_cast<uint32_t>(sum_alone[e]))
              << where << " element " << e;
        }
      }
    }
  }
}

// Several queries over the same rows (a GQA group, or sequences sharing a block) convert each
// row once for all of them: every query's scores and sums have the bits of that query alone.
TEST(KvAttention, QueriesTogetherHaveTheBitsOfEachAlone) {
  IsaGuard guard;
  for (Isa isa : supported_isas()) {
    kernels::set_isa(isa);
    for (DType t : {DType::Q8_0, DType::Q4_0}) {
      for (const Layout& l : kLayouts) {
        // Query counts that fill the transposed groups (four, or three on AVX2) and leave
        // every rest.
        for (const auto& [n, queries] :
             {std::pair<size_t, size_t>{5, 5}, {16, 5}, {16, 7}, {16, 16}, {27, 5}, {27, 6}}) {
          const Rows rows = make_rows(t, n, l.per_token, l.at, l.hd, 11 + l.at);
          const size_t group_at = l.at / 32 * block_bytes(t);
          const kernels::KvRows kv{t, rows.bytes.data() + group_at, rows.stride,
                                   static_cast<int>(l.at % 32)};
          std::vector<std::vector<float>> q, p, scores, alone(queries), sums, sums_alone;
          std::vector<const float*> q_ptr, p_ptr;
          std::vector<float*> score_ptr, sum_ptr;
          for (size_t j = 0; j < queries; ++j) {
            q.push_back(random_floats(l.hd, 40 + j));
            p.push_back(random_floats(n, 50 + j));
            scores.emplace_back(n);
            sums.emplace_back(l.hd, 0.125f * j);
          }
          sums_alone = sums;
          for (size_t j = 0; j < queries; ++j) {
            q_ptr.push_back(q[j].data());
            p_ptr.push_back(p[j].data());
            score_ptr.push_back(scores[j].data());
            sum_ptr.push_back(sums[j].data());
          }
          kernels::kv_scores_queries(kv, q_ptr.data(), queries, n, l.hd, 0.7f, score_ptr.data());
          kernels::kv_accumulate_queries(kv, p_ptr.data(), queries, n, l.hd, sum_ptr.data());
          const std::string where = std::string(kernels::isa_name(isa)) + " " +
                                    std::string(dtype_name(t)) + " hd " + std::to_string(l.hd) +
                                    " at " + std::to_string(l.at) + " n " + std::to_string(n);
          for (size_t j = 0; j < queries; ++j) {
            alone[j].resize(n);
            kernels::kv_scores(kv, q[j].data(), n, l.hd, 0.7f, alone[j].data());
            kernels::kv_accumulate(kv, p[j].data(), n, l.hd, sums_alone[j].data());
            for (size_t i = 0; i < n; ++i) {
              ASSERT_EQ(std::bit_cast<uint32_t>(scores[j][i]), std::bit_cast<uint32_t>(alone[j][i]))
                  << where << " query " << j << " row " << i;
            }
            for (size_t e = 0; e < l.hd; ++e) {
              ASSERT_EQ(std::bit_cast<uint32_t>(sums[j][e]),
                        std::bit_cast<uint32_t>(sums_alone[j][e]))
                  << where << " query " << j << " element " << e;
            }
          }
        }
      }
    }
  }
}

// Rows requested ahead (the next block's run) change no result: every dtype, instruction set,
// query count and head size gives the bits it gives with nothing ahead.
TEST(KvAttention, RowsRequestedAheadChangeNoBits) {
  IsaGuard guard;
  for (Isa isa : supported_isas()) {
    kernels::set_isa(isa);
    for (DType t : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0}) {
      for (const Layout& l : {Layout{64, 64, 0}, Layout{8, 32, 8}, Layout{128, 128, 0}}) {
        for (size_t n : {size_t{7}, size_t{16}}) {
          const bool plain = t == DType::F32 || t == DType::F16;
          const Rows rows = make_rows(t, n, plain ? l.hd : l.per_token, plain ? 0 : l.at, l.hd, 3);
          const Rows later = make_rows(t, n, plain ? l.hd : l.per_token, plain ? 0 : l.at, l.hd, 4);
          const size_t group_at = plain ? 0 : l.at / 32 * block_bytes(t);
          kernels::KvRows kv{t, rows.bytes.data() + group_at, rows.stride,
                             plain ? 0 : static_cast<int>(l.at % 32)};
          for (size_t queries : {size_t{1}, size_t{2}, size_t{6}}) {
            std::vector<std::vector<float>> q, p;
            std::vector<const float*> q_ptr, p_ptr;
            for (size_t j = 0; j < queries; ++j) {
              q.push_back(random_floats(l.hd, 60 + j));
              p.push_back(random_floats(n, 70 + j));
              q_ptr.push_back(q.back().data());
              p_ptr.push_back(p.back().data());
            }
            std::vector<float> scores[2], sums[2];
            for (int with_ahead = 0; with_ahead < 2; ++with_ahead) {
              kv.ahead = with_ahead != 0 ? later.bytes.data() + group_at : nullptr;
              scores[with_ahead].assign(queries * n, 0.0f);
              sums[with_ahead].assign(queries * l.hd, 0.5f);
              std::vector<float*> score_ptr, sum_ptr;
              for (size_t j = 0; j < queries; ++j) {
                score_ptr.push_back(scores[with_ahead].data() + j * n);
                sum_ptr.push_back(sums[with_ahead].data() + j * l.hd);
              }
              kernels::kv_scores_queries(kv, q_ptr.data(), queries, n, l.hd, 0.3f,
                                         score_ptr.data());
              kernels::kv_accumulate_queries(kv, p_ptr.data(), queries, n, l.hd, sum_ptr.data());
            }
            const std::string where = std::string(kernels::isa_name(isa)) + " " +
                                      std::string(dtype_name(t)) + " hd " + std::to_string(l.hd) +
                                      " n " + std::to_string(n) + " queries " +
                                      std::to_string(queries);
            EXPECT_EQ(std::memcmp(scores[0].data(), scores[1].data(), scores[0].size() * 4), 0)
                << where;
            EXPECT_EQ(std::memcmp(sums[0].data(), sums[1].data(), sums[0].size() * 4), 0) << where;
          }
        }
      }
    }
  }
}

// f32 and f16 rows go to the existing kernels unchanged.
TEST(KvAttention, F16RowsScoreAsTheF16Kernel) {
  const size_t hd = 64, n = 5;
  const auto x = random_floats(n * hd, 7), q = random_floats(hd, 8);
  std::vector<uint16_t> h(n * hd);
  quantize_row(DType::F16, x.data(), h.data(), h.size());
  std::vector<float> got(n), want(n);
  const kernels::KvRows k{DType::F16, reinterpret_cast<const uint8_t*>(h.data()), hd * 2, 0};
  kernels::kv_scores(k, q.data(), n, hd, 0.5f, got.data());
  kernels::attention_scores(DType::F16, q.data(), h.data(), n, hd, 0.5f, want.data());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0);
}

}  // namespace
}  // namespace kvc
