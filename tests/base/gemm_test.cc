// The register-tiled GEMM must give every output the exact bits of the single-row dot, on every
// instruction set, for every weight type, tile shape and remainder.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <random>
#include <tuple>
#include <vector>

#include "base/aligned_buffer.h"
#include "base/gemm_amx.h"
#include "base/isa_fixtures.h"
#include "base/kernels.h"
#include "base/matmul.h"
#include "base/quant_blocks.h"

namespace kvc {
namespace {

using kernels::Isa;
using namespace isa_fixtures;

#include "base/quant_unpack.h"  // the scalar unpacking, as the kernel files take it

constexpr DType kWeightTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0,  DType::Q4_0,
                                  DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q2_K,  DType::Q3_K,
                                  DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL};

// Row lengths for type t: whole blocks only, short and long, odd and even block counts.
std::vector<size_t> lengths_for(DType t) {
  if (block_elements(t) == 256) return {256, 512, 768, 2304};
  std::vector<size_t> lengths = {32, 64, 96, 160, 2080};
  if (block_elements(t) == 1) lengths.insert(lengths.end(), {8, 13, 72, 100, 2087});
  return lengths;
}

// Weights and prepared activations of one shape, filled from a seed.
struct Operands {
  DType wt;
  size_t n, n_w, n_x, w_stride, x_stride;
  std::vector<uint8_t> w, x;

  Operands(DType type, size_t elements, size_t weight_rows, size_t act_rows, uint32_t seed)
      : wt(type), n(elements), n_w(weight_rows), n_x(act_rows) {
    w_stride = row_bytes(wt, n);
    x_stride = kernels::activation_row_bytes(wt, n);
    w.resize(w_stride * n_w);
    x.resize(x_stride * n_x);
    const auto wf = random_floats(n * n_w, seed);
    const auto xf = random_floats(n * n_x, seed + 1);
    for (size_t c = 0; c < n_w; ++c) quantize_row(wt, &wf[c * n], &w[c * w_stride], n);
    for (size_t r = 0; r < n_x; ++r) {
      kernels::prepare_activations(wt, &xf[r * n], &x[r * x_stride], n);
    }
  }

  // One dot product per call: the single-row path every tile must reproduce.
  float single(size_t r, size_t c) const {
    float out = 0.0f;
    kernels::dot_rows(wt, &w[c * w_stride], &x[r * x_stride], x_stride, 1, n, &out);
    return out;
  }

  std::vector<float> gemm() const {
    std::vector<float> y(n_x * n_w);
    kernels::gemm(wt, w.data(), w_stride, n_w, x.data(), x_stride, n_x, n, y.data(), n_w);
    return y;
  }
};

std::string describe(DType wt, size_t n, size_t n_w, size_t n_x, size_t r, size_t c) {
  return std::string(kernels::isa_name(kernels::active_isa())) + " " + std::string(dtype_name(wt)) +
         " n=" + std::to_string(n) + " " + std::to_string(n_x) + "x" + std::to_string(n_w) +
         " at (" + std::to_string(r) + "," + std::to_string(c) + ")";
}

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

class GemmTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (GetParam() > kernels::best_isa()) {
      GTEST_SKIP() << "this CPU lacks " << kernels::isa_name(GetParam()) << " (best is "
                   << kernels::isa_name(kernels::best_isa()) << "): its kernels are not tested";
    }
    kernels::set_isa(GetParam());
    kernels::set_gemm_tiles(true);
  }
  IsaGuard guard_;
};

// Every shape up to a few full tiles in both directions, so each tile kind (full, short in
// rows, short in columns, both) meets every length kind (whole steps, remainders, odd blocks).
TEST_P(GemmTest, EveryOutputEqualsTheSingleRowDot) {
  for (DType wt : kWeightTypes) {
    for (size_t n : lengths_for(wt)) {
      for (size_t n_x : {1u, 2u, 3u, 4u, 5u, 9u}) {
        for (size_t n_w : {1u, 2u, 3u, 4u, 5u, 7u, 13u}) {
          const Operands ops(wt, n, n_w, n_x, static_cast<uint32_t>(n * 131 + n_x * 7 + n_w));
          const std::vector<float> y = ops.gemm();
          for (size_t r = 0; r < n_x; ++r) {
            for (size_t c = 0; c < n_w; ++c) {
              ASSERT_TRUE(same_bits(y[r * n_w + c], ops.single(r, c)))
                  << describe(wt, n, n_w, n_x, r, c) << ": " << y[r * n_w + c]
                  << " != " << ops.single(r, c);
            }
          }
        }
      }
    }
  }
}

// Weight rows wider than the cache chunk the loop nest splits them into.
TEST_P(GemmTest, ChunkedWeightRowsEqualTheSingleRowDot) {
  for (DType wt : kWeightTypes) {
    const Operands ops(wt, 4096, 70, 6, 77);
    const std::vector<float> y = ops.gemm();
    for (size_t r = 0; r < ops.n_x; ++r) {
      for (size_t c = 0; c < ops.n_w; ++c) {
        ASSERT_TRUE(same_bits(y[r * ops.n_w + c], ops.single(r, c)))
            << describe(wt, ops.n, ops.n_w, ops.n_x, r, c);
      }
    }
  }
}

// Weight rows at any alignment a file may give them (a GGUF's data is only 32-byte aligned, and
// the AVX-512 f32 kernel loads rows that start 32 bytes into a line in halves): the same bits.
TEST_P(GemmTest, WeightRowsAtAnyAlignmentEqualTheSingleRowDot) {
  for (DType wt : {DType::F32, DType::F16, DType::BF16, DType::Q8_0}) {
    for (size_t offset : {0u, 4u, 16u, 32u, 48u}) {
      for (size_t n_x : {1u, 6u}) {
        const Operands ops(wt, 256, 9, n_x, static_cast<uint32_t>(offset + n_x));
        std::vector<uint8_t> buffer(line_aligned_size(ops.w.size() + offset));
        uint8_t* rows = line_aligned(buffer.data()) + offset;
        std::memcpy(rows, ops.w.data(), ops.w.size());
        std::vector<float> y(n_x * ops.n_w);
        kernels::gemm(wt, rows, ops.w_stride, ops.n_w, ops.x.data(), ops.x_stride, n_x, ops.n,
                      y.data(), ops.n_w);
        for (size_t r = 0; r < n_x; ++r) {
          for (size_t c = 0; c < ops.n_w; ++c) {
            ASSERT_TRUE(same_bits(y[r * ops.n_w + c], ops.single(r, c)))
                << describe(wt, ops.n, ops.n_w, n_x, r, c) << " with rows " << offset
                << " bytes into a line";
          }
        }
      }
    }
  }
}

// Prefill-sized calls (16 activation rows or more): long rows over several weight chunks, short
// rows, odd and even block counts, with full and partial tiles both ways (AVX2's group-major
// tiles at their widest group, 3,584-value rows, with an odd row left).
TEST_P(GemmTest, PrefillSizedCallsEqualTheSingleRowDot) {
  for (DType wt : kWeightTypes) {
    for (const auto& [n, n_w, n_x] : {std::tuple<size_t, size_t, size_t>{4096, 70, 18},
                                      {256, 13, 17},
                                      {768, 9, 16},
                                      {3584, 11, 33}}) {
      const size_t length = block_elements(wt) == 256 || n % 64 != 0 ? n : n + 32;
      for (size_t len : {n, length}) {
        const Operands ops(wt, len, n_w, n_x, static_cast<uint32_t>(len + n_x));
        const std::vector<float> y = ops.gemm();
        for (size_t r = 0; r < ops.n_x; ++r) {
          for (size_t c = 0; c < ops.n_w; ++c) {
            ASSERT_TRUE(same_bits(y[r * ops.n_w + c], ops.single(r, c)))
                << describe(wt, ops.n, ops.n_w, ops.n_x, r, c);
          }
        }
      }
    }
  }
}

// Sets every activation to value() and checks every tile output against the single-row dot.
template <class Value>
void expect_activations_equal_the_single_row_dot(Operands& ops, Value value) {
  for (size_t r = 0; r < ops.n_x; ++r) {
    if (kernels::activation_type(ops.wt) == DType::Q8_K) {
      auto* q = reinterpret_cast<BlockQ8_K*>(&ops.x[r * ops.x_stride]);
      for (size_t b = 0; b < ops.n / 256; ++b) {
        for (int8_t& v : q[b].qs) v = value();
        for (int k = 0; k < 16; ++k) {
          int sum = 0;
          for (int e = 0; e < 16; ++e) sum += q[b].qs[16 * k + e];
          q[b].bsums[k] = static_cast<int16_t>(sum);
        }
      }
      continue;
    }
    auto* q = reinterpret_cast<BlockQ8_0*>(&ops.x[r * ops.x_stride]);
    for (size_t b = 0; b < ops.n / 32; ++b) {
      for (int8_t& v : q[b].qs) v = value();
    }
  }
  const std::vector<float> y = ops.gemm();
  for (size_t r = 0; r < ops.n_x; ++r) {
    for (size_t c = 0; c < ops.n_w; ++c) {
      ASSERT_TRUE(same_bits(y[r * ops.n_w + c], ops.single(r, c)))
          << describe(ops.wt, ops.n, ops.n_w, ops.n_x, r, c);
    }
  }
}

// Sets every activation to +-127 and checks every tile output against the single-row dot.
void expect_extreme_activations_equal_the_single_row_dot(Operands& ops, std::mt19937& rng) {
  expect_activations_equal_the_single_row_dot(
      ops, [&] { return static_cast<int8_t>((rng() & 1) ? -127 : 127); });
}

// Activation rows of a decode call (at most four, which take the narrow path) and of a tiled
// one.
constexpr size_t kNarrowAndTiledRows[] = {1, 3, 5};

// The int8 kernels rewrite the sign handling of the single-row dot (the tiles add a bias, the
// narrow path moves each weight's sign onto its activation); extreme values (-128 in a weight,
// which no quantizer writes but a file may hold, and +-127 everywhere) must still give the same
// exact sums.
TEST_P(GemmTest, ExtremeInt8ValuesEqualTheSingleRowDot) {
  for (DType wt : {DType::Q8_0, DType::Q4_0}) {
    for (size_t n_x : kNarrowAndTiledRows) {
      Operands ops(wt, 96, 5, n_x, 3);
      std::mt19937 rng(9);
      for (size_t c = 0; c < ops.n_w; ++c) {
        auto* blocks = &ops.w[c * ops.w_stride];
        for (size_t b = 0; b < ops.n / 32; ++b) {
          if (wt == DType::Q8_0) {
            auto* q = reinterpret_cast<BlockQ8_0*>(blocks) + b;
            for (int8_t& v : q->qs) v = (rng() & 1) ? -128 : 127;
          } else {
            auto* q = reinterpret_cast<BlockQ4_0*>(blocks) + b;
            for (uint8_t& v : q->qs) v = (rng() & 1) ? 0x0f : 0x00;
          }
        }
      }
      expect_extreme_activations_equal_the_single_row_dot(ops, rng);
    }
  }
}

// Byte offsets of the f16 fields in a block of an unpacked type or iq4_nl (the rest is
// integers).
std::vector<size_t> f16_fields(DType t);

// Every integer byte of every block at 0xff or 0x80 (each type's largest unsigned values, or
// -1 and -128), against activations all +127 or all -127: products of one sign, the largest
// sums any int16 or int32 stage of a kernel can meet (the unsigned types sum several maddubs
// pairs in int16 before widening them), still give the single-row dot's bits.
TEST_P(GemmTest, SameSignExtremesEqualTheSingleRowDot) {
  for (DType wt : kWeightTypes) {
    if (block_elements(wt) == 1) continue;  // the float types have no integer bytes
    for (uint8_t byte : {uint8_t{0xff}, uint8_t{0x80}}) {
      for (int8_t x : {int8_t{127}, int8_t{-127}}) {
        for (size_t n_x : kNarrowAndTiledRows) {
          Operands ops(wt, block_elements(wt) == 256 ? 768 : 256, 9, n_x, 5);
          std::fill(ops.w.begin(), ops.w.end(), byte);
          std::vector<size_t> scales = f16_fields(wt);
          if (wt == DType::Q8_0 || wt == DType::Q4_0) scales = {0};  // d leads their blocks
          const uint16_t d = f32_to_f16(0.01f);
          for (size_t b = 0; b < ops.w.size() / block_bytes(wt); ++b) {
            for (size_t offset : scales) std::memcpy(&ops.w[b * block_bytes(wt) + offset], &d, 2);
          }
          SCOPED_TRACE(std::string(dtype_name(wt)) + " weight bytes " + std::to_string(byte) +
                       ", activations " + std::to_string(x));
          expect_activations_equal_the_single_row_dot(ops, [&] { return x; });
        }
      }
    }
  }
}

std::vector<size_t> f16_fields(DType t) {
  switch (t) {
    case DType::Q4_1:
      return {offsetof(BlockQ4_1, d), offsetof(BlockQ4_1, m)};
    case DType::Q5_0:
      return {offsetof(BlockQ5_0, d)};
    case DType::Q5_1:
      return {offsetof(BlockQ5_1, d), offsetof(BlockQ5_1, m)};
    case DType::Q2_K:
      return {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)};
    case DType::Q3_K:
      return {offsetof(BlockQ3_K, d)};
    case DType::Q4_K:
      return {offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, dmin)};
    case DType::Q5_K:
      return {offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, dmin)};
    case DType::Q6_K:
      return {offsetof(BlockQ6_K, d)};
    case DType::IQ4_NL:
      return {offsetof(BlockIQ4_NL, d)};
    default:
      return {};
  }
}

// Every bit pattern a file may hold (all quants and packed scales at their extremes, which a
// quantizer may never write), with activations at +-127: the tiles still give the single-row
// dot's bits.
TEST_P(GemmTest, RandomBlockBytesEqualTheSingleRowDot) {
  for (DType wt : kWeightTypes) {
    if (f16_fields(wt).empty()) continue;
    for (size_t n_x : kNarrowAndTiledRows) {
      Operands ops(wt, block_elements(wt) == 256 ? 768 : 96, 5, n_x, 3);
      std::mt19937 rng(11);
      for (size_t i = 0; i < ops.w.size(); ++i) ops.w[i] = static_cast<uint8_t>(rng());
      std::uniform_real_distribution<float> scale(-0.1f, 0.1f);
      for (size_t b = 0; b < ops.w.size() / block_bytes(wt); ++b) {
        for (size_t offset : f16_fields(wt)) {
          const uint16_t h = f32_to_f16(scale(rng));
          std::memcpy(&ops.w[b * block_bytes(wt) + offset], &h, sizeof h);
        }
      }
      expect_extreme_activations_equal_the_single_row_dot(ops, rng);
    }
  }
}

// Every bit pattern a file may hold, against a double-precision dot of the rows as
// dequantize_row writes them (its own scalar unpacking, not the kernels'): each product of the
// kernels' block unpacking (vector instructions for several types) is checked value by value,
// where the test above checks only that tiles and single rows agree. Tolerance as in
// Kernels.DotMatchesReferenceOnEveryIsa.
TEST_P(GemmTest, RandomBlockBytesMatchTheDequantizedRows) {
  for (DType wt : kWeightTypes) {
    if (f16_fields(wt).empty()) continue;
    const size_t n = block_elements(wt) == 256 ? 768 : 160;
    Operands ops(wt, n, 6, 2, 17);
    std::mt19937 rng(23);
    for (uint8_t& b : ops.w) b = static_cast<uint8_t>(rng());
    std::uniform_real_distribution<float> scale(-0.1f, 0.1f);
    for (size_t b = 0; b < ops.w.size() / block_bytes(wt); ++b) {
      for (size_t offset : f16_fields(wt)) {
        const uint16_t h = f32_to_f16(scale(rng));
        std::memcpy(&ops.w[b * block_bytes(wt) + offset], &h, sizeof h);
      }
    }
    const std::vector<float> y = ops.gemm();
    std::vector<float> wf(n), xf(n);
    for (size_t r = 0; r < ops.n_x; ++r) {
      dequantize_row(kernels::activation_type(wt), &ops.x[r * ops.x_stride], xf.data(), n);
      for (size_t c = 0; c < ops.n_w; ++c) {
        dequantize_row(wt, &ops.w[c * ops.w_stride], wf.data(), n);
        double want = 0.0, magnitude = 0.0;
        for (size_t i = 0; i < n; ++i) {
          want += static_cast<double>(wf[i]) * xf[i];
          magnitude += std::fabs(static_cast<double>(wf[i]) * xf[i]);
        }
        EXPECT_NEAR(y[r * ops.n_w + c], want, 4.0 * n * std::ldexp(1.0, -24) * magnitude + 1e-6)
            << describe(wt, n, ops.n_w, ops.n_x, r, c);
      }
    }
  }
}

// The integer value of element e of a 32-element block of weight type t.
int weight_value(DType t, const uint8_t* block, int e) {
  if (t == DType::Q8_0) return reinterpret_cast<const BlockQ8_0*>(block)->qs[e];
  if (t == DType::Q5_0 || t == DType::Q5_1) {
    const uint8_t* qs = t == DType::Q5_0 ? reinterpret_cast<const BlockQ5_0*>(block)->qs
                                         : reinterpret_cast<const BlockQ5_1*>(block)->qs;
    const uint8_t* qh = t == DType::Q5_0 ? reinterpret_cast<const BlockQ5_0*>(block)->qh
                                         : reinterpret_cast<const BlockQ5_1*>(block)->qh;
    const int nibble = e < 16 ? qs[e] & 0x0f : qs[e - 16] >> 4;
    return (nibble | ((qh[e / 8] >> (e % 8)) & 1) << 4) - (t == DType::Q5_0 ? 16 : 0);
  }
  if (t == DType::Q4_1) {
    const uint8_t* qs = reinterpret_cast<const BlockQ4_1*>(block)->qs;
    return e < 16 ? qs[e] & 0x0f : qs[e - 16] >> 4;
  }
  const uint8_t* qs = t == DType::Q4_0 ? reinterpret_cast<const BlockQ4_0*>(block)->qs
                                       : reinterpret_cast<const BlockIQ4_NL*>(block)->qs;
  const int nibble = e < 16 ? qs[e] & 0x0f : qs[e - 16] >> 4;
  return t == DType::Q4_0 ? nibble - 8 : kIq4NlValues[nibble];
}

// The order AVX2 sums the integer types in (gemm_avx2.cc), written out one scalar at a time: a
// block's exact integer sum times the product of its two scales (q4_1, q5_1: plus, fused, the
// product of the minimum and the activation scale times the block's activation sum), the
// terms of each group of
// eight blocks summed pairwise as a 256-bit horizontal sum is ((0+4)+(2+6))+((1+5)+(3+7)),
// missing blocks +0, and the groups added in order.
float grouped_int_reference(DType t, const uint8_t* w, const uint8_t* x, size_t n) {
  const size_t blocks = n / 32;
  const auto* xb = reinterpret_cast<const BlockQ8_0*>(x);
  float total = 0.0f;
  for (size_t g = 0; g < blocks; g += 8) {
    float p[8] = {};
    for (size_t j = 0; j < 8 && g + j < blocks; ++j) {
      const uint8_t* wb = w + (g + j) * block_bytes(t);
      uint16_t dw = 0;
      std::memcpy(&dw, wb, sizeof dw);  // every 32-element integer block starts with its scale
      int32_t sum = 0, x_sum = 0;
      for (int e = 0; e < 32; ++e) {
        sum += weight_value(t, wb, e) * xb[g + j].qs[e];
        x_sum += xb[g + j].qs[e];
      }
      const float scale = f16_to_f32(dw) * f16_to_f32(xb[g + j].d);
      p[j] = scale * static_cast<float>(sum);
      if (t == DType::Q4_1 || t == DType::Q5_1) {  // the minimum follows the scale
        uint16_t mw = 0;
        std::memcpy(&mw, wb + sizeof dw, sizeof mw);
        p[j] = std::fma(f16_to_f32(mw) * f16_to_f32(xb[g + j].d), static_cast<float>(x_sum), p[j]);
      }
    }
    total += ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
  }
  return total;
}

// Every output of the gemm on `isa`, for each of `types`, rows of each of `lengths` and 1, 4,
// 5 and 18 activation rows against 13 weight rows, has the bits reference(type, weight row,
// activation row, length) gives.
template <class Reference>
void expect_documented_order(Isa isa, std::initializer_list<DType> types,
                             std::initializer_list<size_t> lengths, Reference reference) {
  IsaGuard guard;
  kernels::set_isa(isa);
  kernels::set_gemm_tiles(true);
  for (DType wt : types) {
    for (size_t n : lengths) {
      for (size_t n_x : {1u, 4u, 5u, 18u}) {
        const Operands ops(wt, n, 13, n_x, static_cast<uint32_t>(n + n_x));
        const std::vector<float> y = ops.gemm();
        for (size_t r = 0; r < n_x; ++r) {
          for (size_t c = 0; c < ops.n_w; ++c) {
            const float want = reference(wt, &ops.w[c * ops.w_stride], &ops.x[r * ops.x_stride], n);
            ASSERT_TRUE(same_bits(y[r * ops.n_w + c], want))
                << describe(wt, n, ops.n_w, n_x, r, c) << ": " << y[r * ops.n_w + c]
                << " != " << want;
          }
        }
      }
    }
  }
}

// AVX2's integer kernels (its narrow column and its tiles of eight weight rows laid side by
// side) give the bits of the order they document, computed here without them.
TEST(GemmAvx2, IntegerTypesSumInTheirDocumentedOrder) {
  if (kernels::best_isa() < Isa::kAvx2) GTEST_SKIP() << "this CPU lacks avx2: not tested";
  expect_documented_order(
      Isa::kAvx2, {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::IQ4_NL},
      {32u, 224u, 256u, 288u, 2080u}, grouped_int_reference);
}

// The order AVX-512 sums the 16-byte-packed types in (gemm_avx512.cc's FourBlockTile), written
// out one scalar at a time: blocks four at a time, lane l taking block 4g + l / 4 of group g and
// the eight elements whose fours are 4 (l % 4) and 16 + 4 (l % 4); the lane's exact integer sum
// times the product of the two scales joins its total by a fused multiply-add (q4_1, q5_1: then
// the product of the minimum and the activation scale times the lane's activation sum, fused
// too); a short last group's absent blocks add fma(0, 0, total); the 16 lanes summed as hsum512.
float four_block_reference(DType t, const uint8_t* w, const uint8_t* x, size_t n) {
  const size_t blocks = n / 32;
  const auto* xb = reinterpret_cast<const BlockQ8_0*>(x);
  const bool minimum = t == DType::Q4_1 || t == DType::Q5_1;
  float total[16] = {};
  for (size_t g = 0; g < (blocks + 3) / 4; ++g) {
    for (int l = 0; l < 16; ++l) {
      const size_t b = 4 * g + l / 4;
      if (b >= blocks) {
        total[l] = std::fma(0.0f, 0.0f, total[l]);
        if (minimum) total[l] = std::fma(0.0f, 0.0f, total[l]);
        continue;
      }
      const uint8_t* wb = w + b * block_bytes(t);
      int32_t sum = 0, x_sum = 0;
      for (int half_block = 0; half_block < 2; ++half_block) {
        for (int i = 0; i < 4; ++i) {
          const int e = 16 * half_block + 4 * (l % 4) + i;
          sum += weight_value(t, wb, e) * xb[b].qs[e];
          x_sum += xb[b].qs[e];
        }
      }
      uint16_t dw = 0, mw = 0;
      std::memcpy(&dw, wb, sizeof dw);
      const float dx = f16_to_f32(xb[b].d);
      total[l] = std::fma(f16_to_f32(dw) * dx, static_cast<float>(sum), total[l]);
      if (minimum) {
        std::memcpy(&mw, wb + sizeof dw, sizeof mw);
        total[l] = std::fma(f16_to_f32(mw) * dx, static_cast<float>(x_sum), total[l]);
      }
    }
  }
  for (int width = 16; width > 1; width /= 2) {
    for (int i = 0; i < width / 2; ++i) total[i] += total[i + width / 2];
  }
  return total[0];
}

// AVX-512's four-block tiles (decode's one weight row at a time, and tiles of several rows and
// columns) give the bits of the order they document, computed here without them.
TEST(GemmAvx512, FourBlockTypesSumInTheirDocumentedOrder) {
  if (kernels::best_isa() < Isa::kAvx512) GTEST_SKIP() << "this CPU lacks avx512: not tested";
  expect_documented_order(Isa::kAvx512,
                          {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::IQ4_NL},
                          {32u, 96u, 128u, 224u, 2080u}, four_block_reference);
}

// The order the SIMD K-quant tiles sum in (gemm_avx512.cc's KQuantTile512 over 16 lanes,
// gemm_unpacked.h's KQuantTile256 over 8), written out one scalar at a time from the scalar
// unpacking: per super-block, lane l's exact integer S_l sums scale[e / 16] * q[e] * x[e] over
// the elements e whose four fall in lane l (e % (4 lanes) / 4 == l), and O_l (l < 8; 0 above)
// the offsets of sub-blocks 2l and 2l + 1 times the activations' sums of those 16 elements;
// the lane's partial is fma(O_l, unit * dx, S_l * (d * dx)), or (S_l + O_l) * (d * dx) where
// the offsets are in units of d (q3_K, q6_K), which joins the lane's total; the lanes are
// summed as hsum512 (16) or hsum256 (8) sums them.
template <class U>
float k_quant_reference(int lanes, const uint8_t* w, const uint8_t* x, size_t n) {
  const auto* wb = reinterpret_cast<const typename U::Block*>(w);
  const auto* xb = reinterpret_cast<const BlockQ8_K*>(x);
  std::vector<float> total(lanes, 0.0f);
  for (size_t s = 0; s < n / 256; ++s) {
    UnpackedK up;
    U::unpack(wb[s], up);
    const BlockQ8_K& xs = xb[s];
    std::vector<int32_t> scaled(lanes, 0), offsets(lanes, 0);
    for (int e = 0; e < 256; ++e) {
      scaled[e % (4 * lanes) / 4] += up.scale[e / 16] * up.q[e] * xs.qs[e];
    }
    for (int l = 0; l < 8; ++l) {
      offsets[l] = up.offset[2 * l] * xs.bsums[2 * l] + up.offset[2 * l + 1] * xs.bsums[2 * l + 1];
    }
    for (int l = 0; l < lanes; ++l) {
      if constexpr (U::kOffsetsInScaleUnits) {
        total[l] += static_cast<float>(scaled[l] + offsets[l]) * (up.d * xs.d);
      } else {
        total[l] += std::fma(static_cast<float>(offsets[l]), up.offset_unit * xs.d,
                             static_cast<float>(scaled[l]) * (up.d * xs.d));
      }
    }
  }
  for (int width = lanes; width > 1; width /= 2) {
    for (int i = 0; i < width / 2; ++i) total[i] += total[i + width / 2];
  }
  return total[0];
}

// The order AVX-512 sums q8_0 in (gemm_avx512.cc's Q8Tile, and its AMX tiles), one scalar at a
// time: block b's 32 products as one exact integer I_b; lane b % 16 takes fma(d_w * d_x, I_b,
// lane) in increasing b; the 16 lanes summed as hsum512.
float block_lane_reference(DType, const uint8_t* w, const uint8_t* x, size_t n) {
  const auto* wb = reinterpret_cast<const BlockQ8_0*>(w);
  const auto* xb = reinterpret_cast<const BlockQ8_0*>(x);
  float lane[16] = {};
  for (size_t b = 0; b < n / 32; ++b) {
    int32_t sum = 0;
    for (int e = 0; e < 32; ++e) sum += wb[b].qs[e] * xb[b].qs[e];
    const float scale = f16_to_f32(wb[b].d) * f16_to_f32(xb[b].d);
    lane[b % 16] = std::fma(scale, static_cast<float>(sum), lane[b % 16]);
  }
  for (int width = 16; width > 1; width /= 2) {
    for (int i = 0; i < width / 2; ++i) lane[i] += lane[i + width / 2];
  }
  return lane[0];
}

// AVX-512's q8_0 kernels (decode's narrow column and the tiles) give the bits of the order they
// document: one to 65 blocks a row, so that every lane count of a last group of 16 is met.
TEST(GemmAvx512, Q8_0SumsInItsDocumentedOrder) {
  if (kernels::best_isa() < Isa::kAvx512) GTEST_SKIP() << "this CPU lacks avx512: not tested";
  expect_documented_order(Isa::kAvx512, {DType::Q8_0},
                          {32u, 64u, 96u, 224u, 480u, 512u, 544u, 1056u, 2080u},
                          block_lane_reference);
}

// Restores the AMX switch when a test ends.
struct AmxGuard {
  bool saved = kernels::amx_active();
  ~AmxGuard() { kernels::set_amx(saved); }
};

// The AMX tiles (whole groups of 16 weight rows by 16 activation rows; the rest of a call on the
// AVX-512 tiles) give the documented order's bits, and the same values as without AMX; through
// matmul, a row's outputs do not depend on whether its batch was large enough for AMX.
TEST(GemmAmx, Q8_0TilesSumInTheDocumentedOrder) {
  if (kernels::best_isa() < Isa::kAvx512 || !kernels::amx_available()) {
    std::printf(
        "[ UNTESTED ] this CPU lacks AMX-INT8 (or Linux refused its tile state): the "
        "AMX q8_0 tiles are not tested here\n");
    GTEST_SKIP() << "this CPU lacks AMX-INT8: not tested";
  }
  IsaGuard isa_guard;
  AmxGuard amx_guard;
  kernels::set_isa(Isa::kAvx512);
  kernels::set_gemm_tiles(true);
  for (size_t n : {32u, 64u, 544u, 1056u, 2080u}) {
    for (const auto& [n_w, n_x] : {std::pair<size_t, size_t>{16, 16}, {37, 35}, {50, 64}}) {
      const Operands ops(DType::Q8_0, n, n_w, n_x, static_cast<uint32_t>(n + n_w + n_x));
      kernels::set_amx(true);
      ASSERT_TRUE(kernels::amx_active());
      const std::vector<float> amx = ops.gemm();
      for (size_t r = 0; r < n_x; ++r) {
        for (size_t c = 0; c < n_w; ++c) {
          const float want = block_lane_reference(DType::Q8_0, &ops.w[c * ops.w_stride],
                                                  &ops.x[r * ops.x_stride], n);
          ASSERT_TRUE(same_bits(amx[r * n_w + c], want))
              << "amx " << describe(DType::Q8_0, n, n_w, n_x, r, c) << ": " << amx[r * n_w + c]
              << " != " << want;
        }
      }
      kernels::set_amx(false);
      ASSERT_FALSE(kernels::amx_active());
      const std::vector<float> plain = ops.gemm();
      EXPECT_EQ(0, std::memcmp(amx.data(), plain.data(), amx.size() * sizeof(float)))
          << "n=" << n << " " << n_x << "x" << n_w;
    }
  }
}

// The K-quant tiles (decode's one weight row at a time, and tiles of several rows and columns)
// give the bits of the order they document, computed here without them.
TEST_P(GemmTest, KQuantTypesSumInTheirDocumentedOrder) {
  if (GetParam() == Isa::kScalar) {
    GTEST_SKIP() << "the scalar kernels keep their own order (checked against the dequantized "
                    "rows)";
  }
  const int lanes = GetParam() == Isa::kAvx512 ? 16 : 8;
  const auto reference = [&](DType t, const uint8_t* w, const uint8_t* x, size_t n) {
    float want = 0.0f;
    with_unpacker(t, [&](auto unpacker) {
      if constexpr (decltype(unpacker)::kUnit == 256) {
        want = k_quant_reference<decltype(unpacker)>(lanes, w, x, n);
      }
    });
    return want;
  };
  for (DType wt : {DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    // One to nine super-blocks a row, so that a kernel's loop over a row's super-blocks meets
    // the reference at every count up to four, and beyond.
    for (size_t n : {256u, 512u, 768u, 1024u, 1280u, 2304u}) {
      for (size_t n_x : {1u, 3u, 6u}) {
        const Operands ops(wt, n, 7, n_x, static_cast<uint32_t>(3 * n + n_x));
        const std::vector<float> y = ops.gemm();
        for (size_t r = 0; r < n_x; ++r) {
          for (size_t c = 0; c < ops.n_w; ++c) {
            const float want = reference(wt, &ops.w[c * ops.w_stride], &ops.x[r * ops.x_stride], n);
            ASSERT_TRUE(same_bits(y[r * ops.n_w + c], want))
                << describe(wt, n, ops.n_w, n_x, r, c) << ": " << y[r * ops.n_w + c]
                << " != " << want;
          }
        }
      }
    }
  }
}

// The untiled loop kept for benchmarks gives the same values.
TEST_P(GemmTest, TilesOffGivesTheSameValues) {
  for (DType wt : kWeightTypes) {
    const Operands ops(wt, block_elements(wt) == 256 ? 512 : 192, 11, 10, 21);
    const std::vector<float> tiled = ops.gemm();
    kernels::set_gemm_tiles(false);
    const std::vector<float> untiled = ops.gemm();
    kernels::set_gemm_tiles(true);
    EXPECT_EQ(0, std::memcmp(tiled.data(), untiled.data(), tiled.size() * sizeof(float)))
        << kernels::isa_name(GetParam()) << " " << dtype_name(wt);
  }
}

// Through matmul: a row's outputs do not depend on the batch it came in or the thread count.
TEST_P(GemmTest, MatmulRowsAreIndependentOfBatchAndThreads) {
  for (DType wt : kWeightTypes) {
    const size_t in = block_elements(wt) == 256 ? 768 : 288, out = 75, rows = 23;
    const auto wf = random_floats(in * out, 5);
    std::vector<uint8_t> w(row_bytes(wt, in) * out);
    for (size_t o = 0; o < out; ++o) quantize_row(wt, &wf[o * in], &w[o * row_bytes(wt, in)], in);
    const WeightView view{wt, w.data(), out, in};
    const auto x = random_floats(in * rows, 6);
    std::vector<uint8_t> scratch;
    ThreadPool one(1), three(3);
    std::vector<float> batch(rows * out), batch3(rows * out);
    matmul(one, view, x.data(), rows, batch.data(), scratch);
    matmul(three, view, x.data(), rows, batch3.data(), scratch);
    EXPECT_EQ(0, std::memcmp(batch.data(), batch3.data(), batch.size() * sizeof(float)))
        << dtype_name(wt);
    for (size_t first = 0; first < rows; first += 7) {
      const size_t count = std::min<size_t>(5, rows - first);
      std::vector<float> part(count * out);
      matmul(three, view, &x[first * in], count, part.data(), scratch);
      EXPECT_EQ(0, std::memcmp(part.data(), &batch[first * out], part.size() * sizeof(float)))
          << kernels::isa_name(GetParam()) << " " << dtype_name(wt) << " rows " << first;
    }
  }
}

// Stacked (a layer's query, key and value projections in one region): every output has the bits
// of its own matmul, whatever the thread count; matrices of different dtypes or widths fall back
// to one matmul each with the same bits.
TEST_P(GemmTest, StackedMatmulsAreEachMatmulBitForBit) {
  for (DType wt : kWeightTypes) {
    const size_t in = block_elements(wt) == 256 ? 512 : 160, rows = 6;
    const size_t outs[] = {300, 40, 130};  // so that the threads' ranges split a matrix
    std::vector<std::vector<uint8_t>> bytes;
    std::vector<WeightView> views;
    for (size_t i = 0; i < 3; ++i) {
      const auto wf = random_floats(in * outs[i], 30 + static_cast<uint32_t>(i));
      bytes.emplace_back(row_bytes(wt, in) * outs[i]);
      for (size_t o = 0; o < outs[i]; ++o) {
        quantize_row(wt, &wf[o * in], &bytes[i][o * row_bytes(wt, in)], in);
      }
      views.push_back(WeightView{wt, bytes[i].data(), outs[i], in});
    }
    const auto x = random_floats(in * rows, 7);
    std::vector<uint8_t> scratch;
    ThreadPool one(1), two(2), three(3);
    for (ThreadPool* pool : {&one, &two, &three}) {
      for (size_t n_rows : {size_t{1}, rows}) {
        std::vector<std::vector<float>> stacked, alone;
        std::vector<float*> outs_ptr;
        for (size_t i = 0; i < 3; ++i) {
          stacked.emplace_back(n_rows * outs[i], -1.0f);
          alone.emplace_back(n_rows * outs[i]);
          outs_ptr.push_back(stacked[i].data());
          matmul(one, views[i], x.data(), n_rows, alone[i].data(), scratch);
        }
        matmul_stacked(*pool, views, x.data(), n_rows, outs_ptr, scratch);
        for (size_t i = 0; i < 3; ++i) {
          EXPECT_EQ(
              0, std::memcmp(stacked[i].data(), alone[i].data(), alone[i].size() * sizeof(float)))
              << kernels::isa_name(GetParam()) << " " << dtype_name(wt) << " matrix " << i
              << " threads " << pool->size() << " rows " << n_rows;
        }
      }
    }
  }
  // Unlike matrices: an f32 one beside a q8_0 one.
  const size_t in = 64, out = 9;
  const auto wf = random_floats(in * out, 40);
  std::vector<uint8_t> q8(row_bytes(DType::Q8_0, in) * out);
  for (size_t o = 0; o < out; ++o) {
    quantize_row(DType::Q8_0, &wf[o * in], &q8[o * row_bytes(DType::Q8_0, in)], in);
  }
  const WeightView mixed[] = {{DType::F32, wf.data(), out, in}, {DType::Q8_0, q8.data(), out, in}};
  const auto x = random_floats(in, 41);
  std::vector<uint8_t> scratch;
  ThreadPool two(2);
  std::vector<float> a(out), b(out), a_alone(out), b_alone(out);
  float* const both[] = {a.data(), b.data()};
  matmul_stacked(two, mixed, x.data(), 1, both, scratch);
  matmul(two, mixed[0], x.data(), 1, a_alone.data(), scratch);
  matmul(two, mixed[1], x.data(), 1, b_alone.data(), scratch);
  EXPECT_EQ(0, std::memcmp(a.data(), a_alone.data(), out * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(b.data(), b_alone.data(), out * sizeof(float)));
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, GemmTest,
                         ::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512),
                         [](const auto& info) {
                           return std::string(kernels::isa_name(info.param));
                         });

}  // namespace
}  // namespace kvc
