#include "base/kernels.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "base/isa_fixtures.h"
#include "base/matmul.h"

namespace kvc {
namespace {

using kernels::Isa;
using namespace isa_fixtures;

// The exact dot product of what the kernel sees: both operands dequantised, summed in double.
double reference_dot(DType wt, const std::vector<uint8_t>& w, const std::vector<uint8_t>& x,
                     size_t n) {
  std::vector<float> wf(n), xf(n);
  dequantize_row(wt, w.data(), wf.data(), n);
  dequantize_row(kernels::activation_type(wt), x.data(), xf.data(), n);
  double s = 0.0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(wf[i]) * xf[i];
  return s;
}

// Every kernel on every instruction set this CPU has, against a double-precision reference.
// Tolerance: each kernel sums n products in f32 in some order, so the error is bounded by
// about n * 2^-24 * sum|w_i x_i|; we allow 4x that. Integer kernels are exact within a block,
// leaving only the f32 accumulation of n/32 block sums and the f16 product of the scales (the
// unpacked types add an offset term per 16 elements: also within that bound).
TEST(Kernels, DotMatchesReferenceOnEveryIsa) {
  IsaGuard guard;
  for (Isa isa : supported_isas()) {
    kernels::set_isa(isa);
    for (int type = 0; type < kDTypeCount; ++type) {
      const auto wt = static_cast<DType>(type);
      if (is_activation_only(wt)) continue;
      for (size_t n : {32u, 64u, 96u, 160u, 256u, 2048u, 5632u}) {
        if (n % static_cast<size_t>(block_elements(wt)) != 0) continue;
        if (block_elements(wt) == 1) n += 7;  // ragged lengths exercise the scalar tails
        const auto wf = random_floats(n, 1 + static_cast<uint32_t>(n));
        const auto xf = random_floats(n, 2 + static_cast<uint32_t>(n));
        std::vector<uint8_t> w(row_bytes(wt, n)), x(kernels::activation_row_bytes(wt, n));
        quantize_row(wt, wf.data(), w.data(), n);
        kernels::prepare_activations(wt, xf.data(), x.data(), n);
        float got = 0.0f;
        kernels::dot_rows(wt, w.data(), x.data(), x.size(), 1, n, &got);
        const double want = reference_dot(wt, w, x, n);
        double magnitude = 0.0;
        for (size_t i = 0; i < n; ++i) magnitude += std::fabs(wf[i] * xf[i]);
        EXPECT_NEAR(got, want, 4.0 * n * std::ldexp(1.0, -24) * magnitude + 1e-6)
            << kernels::isa_name(isa) << " " << dtype_name(wt) << " n=" << n;
      }
    }
  }
}

// The forward pass's row conversions (activations to q8_0 and q8_K, keys and values to f16 or q8_0)
// write quantize_row's bytes on every instruction set: magnitudes from subnormal to f16's overflow,
// zero blocks, exact halves (which round to even), infinities and NaNs for f16.
TEST(Kernels, RowConversionsAreQuantizeRowsBytesOnEveryIsa) {
  IsaGuard guard;
  std::mt19937 rng(7);
  std::vector<float> x;
  for (int block = 0; block < 64; ++block) {
    const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 30);
    for (int i = 0; i < 32; ++i) {
      x.push_back(scale * std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng));
    }
  }
  for (int i = 0; i < 32; ++i) x.push_back(i % 2 == 0 ? 0.0f : -0.0f);    // an all-zero block
  for (int i = 0; i < 32; ++i) x.push_back(i == 0 ? 127.0f : i - 15.5f);  // ties at scale 1
  for (float v : {65504.0f, 65519.0f, 65520.0f, 1e-8f, 6e-8f, 3e-8f, 2.98e-8f, -6.1e-5f}) {
    x.push_back(v);
  }
  const size_t n = x.size();  // 33 blocks of 32 and 8 more: the f16 tail runs too
  std::vector<float> special = x;
  special[5] = INFINITY;
  special[40] = -INFINITY;
  special[77] = NAN;
  // q8_K's 256-value blocks: the first 2,048 values, an all-zero block and one of ties.
  std::vector<float> super(x.begin(), x.begin() + 2048);
  for (int i = 0; i < 256; ++i) super.push_back(i % 2 == 0 ? 0.0f : -0.0f);
  for (int i = 0; i < 256; ++i)
    super.push_back(i == 0 ? 127.0f : static_cast<float>(i % 64) - 31.5f);
  for (Isa isa : supported_isas()) {
    kernels::set_isa(isa);
    const size_t whole = n / 32 * 32;
    std::vector<uint8_t> want(row_bytes(DType::Q8_0, whole)), got(want.size());
    quantize_row(DType::Q8_0, x.data(), want.data(), whole);
    kernels::quantize(DType::Q8_0, x.data(), got.data(), whole);
    EXPECT_EQ(want, got) << kernels::isa_name(isa) << " q8_0";
    std::vector<uint8_t> want_k(row_bytes(DType::Q8_K, super.size())), got_k(want_k.size());
    quantize_row(DType::Q8_K, super.data(), want_k.data(), super.size());
    kernels::quantize(DType::Q8_K, super.data(), got_k.data(), super.size());
    EXPECT_EQ(want_k, got_k) << kernels::isa_name(isa) << " q8_K";
    for (const auto* row : {&x, &special}) {
      std::vector<uint8_t> want16(row_bytes(DType::F16, n)), got16(want16.size());
      quantize_row(DType::F16, row->data(), want16.data(), n);
      kernels::quantize(DType::F16, row->data(), got16.data(), n);
      EXPECT_EQ(want16, got16) << kernels::isa_name(isa) << " f16";
    }
  }
}

// Softmax's exponential: within 2 ulp of exp in double over the range softmax uses, 0 below
// exp(-87), and the same bits on every instruction set whatever lane or tail an element takes.
TEST(Kernels, SoftmaxExpIsAccurateAndTheSameOnEveryIsa) {
  IsaGuard guard;
  std::vector<float> x;
  for (int i = 0; i <= 20000; ++i) x.push_back(-87.0f * i / 20000.0f);
  for (float v : {-0.0f, -1e-30f, -1e-7f, -0.3465736f, -0.3465737f, -86.99f, -87.01f, -100.0f,
                  -1e30f, -INFINITY}) {
    x.push_back(v);
  }
  std::vector<std::vector<float>> results;
  for (Isa isa : supported_isas()) {
    kernels::set_isa(isa);
    for (size_t n : {x.size(), size_t{1}, size_t{7}, size_t{13}, size_t{31}}) {
      std::vector<float> p(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(n));
      for (float& v : p) v += 2.5f;
      p[n / 2] = 2.5f;  // the largest: exp(0) = 1 there
      const float sum = kernels::softmax_exp(p.data(), n);
      double want_sum = 0.0;
      for (size_t t = 0; t < n; ++t) {
        const float arg = t == n / 2 ? 0.0f : (x[t] + 2.5f) - 2.5f;
        const double want = arg < -87.0f ? 0.0 : std::exp(static_cast<double>(arg));
        ASSERT_NEAR(p[t], want, want * 2.5e-7) << kernels::isa_name(isa) << " exp(" << arg << ")";
        want_sum += p[t];
      }
      EXPECT_NEAR(sum, want_sum, want_sum * n * 1.2e-7) << kernels::isa_name(isa) << " n=" << n;
      if (n == x.size()) results.push_back(p);
    }
  }
  for (const auto& r : results) {
    for (size_t t = 0; t < r.size(); ++t) {
      ASSERT_EQ(std::bit_cast<uint32_t>(r[t]), std::bit_cast<uint32_t>(results[0][t])) << t;
    }
  }
}

// SwiGLU's silu(gate) * up: within a few ulp of the double-precision value over the range
// activations take and beyond (the exponential saturating to g or to 0 past +-87), NaN kept,
// and the same bits on every instruction set whatever lane, tail or offset an element takes.
TEST(Kernels, SiluMulIsAccurateAndTheSameOnEveryIsaAndPlace) {
  IsaGuard guard;
  std::vector<float> gate, up;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> wide(-30.0f, 30.0f), near(-1.0f, 1.0f);
  for (int i = 0; i < 5000; ++i) {
    gate.push_back(i % 2 ? wide(rng) : near(rng));
    up.push_back(near(rng) * 4.0f);
  }
  for (float g : {0.0f, -0.0f, 1e-30f, -1e-30f, 86.9f, 87.1f, -86.9f, -87.1f, 100.0f, -100.0f,
                  1e30f, -1e30f, INFINITY, -INFINITY}) {
    gate.push_back(g);
    up.push_back(1.5f);
  }
  gate.push_back(NAN);
  up.push_back(1.0f);
  std::vector<std::vector<float>> results;
  for (Isa isa : supported_isas()) {
    kernels::set_isa(isa);
    std::vector<float> got = gate;
    kernels::silu_mul(got.data(), up.data(), got.size());
    for (size_t i = 0; i + 1 < got.size(); ++i) {
      const double g = gate[i], u = up[i];
      if (std::isinf(g)) {  // as g / (1 + exp(-g)) * u: infinity above, NaN (-inf / inf) below
        EXPECT_TRUE(g > 0 ? got[i] == INFINITY : std::isnan(got[i])) << kernels::isa_name(isa);
        continue;
      }
      const double want = g / (1.0 + std::exp(-g)) * u;
      // Below -87 the exponential is 0, so silu is -0 where it would be under 87 e^-87 |u|.
      const double slack = g < -87.0 ? 1e-35 : std::abs(want) * 6e-7;
      ASSERT_NEAR(got[i], want, slack) << kernels::isa_name(isa) << " g=" << g << " u=" << u;
    }
    EXPECT_TRUE(std::isnan(got.back())) << kernels::isa_name(isa);
    // Runs of several lengths from several offsets: the bits of the whole call.
    for (size_t offset : {size_t{0}, size_t{1}, size_t{5}, size_t{9}, size_t{17}}) {
      for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{15}, size_t{16}, size_t{33}}) {
        std::vector<float> part(gate.begin() + offset, gate.begin() + offset + n);
        kernels::silu_mul(part.data(), up.data() + offset, n);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(std::bit_cast<uint32_t>(part[i]), std::bit_cast<uint32_t>(got[offset + i]))
              << kernels::isa_name(isa) << " offset " << offset << " n " << n;
        }
      }
    }
    results.push_back(got);
  }
  for (const auto& r : results) {
    for (size_t i = 0; i < r.size(); ++i) {
      if (std::isnan(r[i]) && std::isnan(results[0][i])) continue;
      ASSERT_EQ(std::bit_cast<uint32_t>(r[i]), std::bit_cast<uint32_t>(results[0][i])) << i;
    }
  }
}

// The bandwidth probe's read: every word counted once (wrapping), whole steps, tails and
// unaligned starts alike, with and without requests ahead (the longest reads request lines
// past kRowStreamAheadBytes; none past the end).
TEST(Kernels, ReadSumAddsEveryWordOnEveryIsa) {
  IsaGuard guard;
  std::vector<uint64_t> words(1001);
  for (size_t i = 0; i < words.size(); ++i) words[i] = (i + 1) * 0x9e3779b97f4a7c15ull;
  for (Isa isa : supported_isas()) {
    kernels::set_isa(isa);
    for (const bool ahead : {false, true}) {
      for (size_t offset : {0u, 1u}) {
        for (size_t n : {0u, 1u, 7u, 31u, 32u, 33u, 64u, 999u, 1000u}) {
          uint64_t want = 0;
          for (size_t i = offset; i < offset + n; ++i) want += words[i];
          EXPECT_EQ(kernels::read_sum(words.data() + offset, n, ahead), want)
              << kernels::isa_name(isa) << " n=" << n << " from word " << offset
              << (ahead ? " requesting ahead" : "");
        }
      }
    }
  }
}

// The compute ceiling's burst: it reports the multiply-adds its instruction runs (twelve
// chains of one instruction each round), and its results, folded into the checksum, depend on
// the seed and on every round, so none of them can be skipped.
TEST(Kernels, MultiplyAddBurstCountsItsInstructionsAndFoldsTheirResults) {
  IsaGuard guard;
  using kernels::Arithmetic;
  for (Isa isa : supported_isas()) {
    kernels::set_isa(isa);
    for (Arithmetic kind : {Arithmetic::kInt8, Arithmetic::kF32}) {
      SCOPED_TRACE(std::string(kernels::isa_name(isa)) + " " +
                   std::string(kernels::multiply_add_instruction(kind)));
      const uint64_t lanes = isa == Isa::kAvx512 ? (kind == Arithmetic::kInt8 ? 64 : 16)
                             : isa == Isa::kAvx2 ? (kind == Arithmetic::kInt8 ? 32 : 8)
                                                 : 1;
      const auto burst = [&](size_t rounds, uint64_t seed) {
        uint64_t checksum = seed;
        const uint64_t multiply_adds = kernels::multiply_add_burst(kind, rounds, &checksum);
        EXPECT_EQ(multiply_adds, 12 * lanes * rounds);
        return checksum;
      };
      EXPECT_EQ(burst(5, 12345), burst(5, 12345));
      EXPECT_NE(burst(5, 12345), burst(6, 12345));
      EXPECT_NE(burst(5, 12345), burst(5, 54321));
      EXPECT_EQ(burst(0, 7), burst(0, 7));
    }
  }
  EXPECT_EQ(kernels::gemm_arithmetic(DType::F32), Arithmetic::kF32);
  EXPECT_EQ(kernels::gemm_arithmetic(DType::BF16), Arithmetic::kF32);
  EXPECT_EQ(kernels::gemm_arithmetic(DType::Q8_0), Arithmetic::kInt8);
  EXPECT_EQ(kernels::gemm_arithmetic(DType::Q4_K), Arithmetic::kInt8);
}

TEST(Kernels, SimdAgreesWithScalarOnF16AttentionKernels) {
  IsaGuard guard;
  for (Isa isa : supported_isas()) {
    kernels::set_isa(isa);
    for (size_t n : {8u, 16u, 64u, 80u, 128u, 131u}) {
      const auto a = random_floats(n, 3), b = random_floats(n, 4);
      std::vector<uint16_t> ah(n);
      quantize_row(DType::F16, a.data(), ah.data(), n);
      std::vector<float> ar(n);
      dequantize_row(DType::F16, ah.data(), ar.data(), n);
      double want32 = 0, want16 = 0, mag = 0;
      for (size_t i = 0; i < n; ++i) {
        want32 += static_cast<double>(a[i]) * b[i];
        want16 += static_cast<double>(ar[i]) * b[i];
        mag += std::fabs(a[i] * b[i]);
      }
      const double tol = 4.0 * n * std::ldexp(1.0, -24) * mag;
      EXPECT_NEAR(kernels::dot_f32(a.data(), b.data(), n), want32, tol) << n;
      EXPECT_NEAR(kernels::dot_f16_f32(ah.data(), b.data(), n), want16, tol) << n;
      // axpy rounds each lane once or twice (fused or not): 2 ulps of the result.
      std::vector<float> y(b), y16(b);
      kernels::axpy_f32(0.37f, a.data(), y.data(), n);
      kernels::axpy_f16(-1.5f, ah.data(), y16.data(), n);
      for (size_t i = 0; i < n; ++i) {
        EXPECT_NEAR(y[i], b[i] + 0.37 * a[i], 2e-7 * (std::fabs(b[i]) + 1.0)) << i;
        EXPECT_NEAR(y16[i], b[i] - 1.5 * ar[i], 4e-7 * (std::fabs(b[i]) + 2.0)) << i;
      }
    }
  }
}

// Scoring several queries against the same keys at once (each key row read once) gives every
// query the same bits as scoring it alone, for every query count (groups of four, or three on
// AVX2, and every rest), head size and key type, on every instruction set this CPU has.
TEST(Kernels, ScoresOfManyQueriesAreTheBitsOfEachAlone) {
  IsaGuard guard;
  for (Isa isa : supported_isas()) {
    kernels::set_isa(isa);
    for (size_t hd : {8u, 24u, 64u, 80u, 128u, 131u}) {
      for (DType kv : {DType::F16, DType::F32}) {
        for (const size_t rows : {16u, 21u}) {
          const auto kf = random_floats(rows * hd, 7);
          std::vector<uint8_t> k(row_bytes(kv, rows * hd));
          quantize_row(kv, kf.data(), k.data(), rows * hd);
          for (size_t nq : {1u, 3u, 4u, 5u, 6u, 7u, 9u, 16u}) {
            const auto q = random_floats(nq * hd, 8 + static_cast<uint32_t>(nq));
            std::vector<float> together(nq * rows), alone(nq * rows);
            std::vector<const float*> qp;
            std::vector<float*> op;
            for (size_t j = 0; j < nq; ++j) {
              qp.push_back(q.data() + j * hd);
              op.push_back(together.data() + j * rows);
              kernels::attention_scores(kv, q.data() + j * hd, k.data(), rows, hd, 0.125f,
                                        alone.data() + j * rows);
            }
            kernels::attention_scores_queries(kv, qp.data(), nq, k.data(), rows, hd, 0.125f,
                                              op.data());
            for (size_t i = 0; i < together.size(); ++i) {
              ASSERT_EQ(std::bit_cast<uint32_t>(together[i]), std::bit_cast<uint32_t>(alone[i]))
                  << kernels::isa_name(isa) << " " << dtype_name(kv) << " hd " << hd << " nq " << nq
                  << " rows " << rows << " at " << i;
            }
          }
        }
      }
    }
  }
}

// The weighted sums of several queries over the same value rows, each row read once for a group
// of them, have the bits of each query's own sum: group sizes from 1 to past a full group, head
// sizes that do and do not fill the vector panels.
TEST(Kernels, AccumulateOfManyQueriesIsTheBitsOfEachAlone) {
  IsaGuard guard;
  for (Isa isa : supported_isas()) {
    kernels::set_isa(isa);
    for (size_t hd : {8u, 24u, 64u, 80u, 128u, 131u}) {
      for (DType kv : {DType::F16, DType::F32}) {
        const size_t rows = 16;
        const auto vf = random_floats(rows * hd, 9);
        std::vector<uint8_t> v(row_bytes(kv, rows * hd));
        quantize_row(kv, vf.data(), v.data(), rows * hd);
        for (size_t nq : {1u, 2u, 5u, 6u, 7u, 13u, 16u}) {
          const auto p = random_floats(nq * rows, 10 + static_cast<uint32_t>(nq));
          const auto start = random_floats(nq * hd, 11);
          std::vector<float> together = start, alone = start;
          std::vector<const float*> pp;
          std::vector<float*> op;
          for (size_t j = 0; j < nq; ++j) {
            pp.push_back(p.data() + j * rows);
            op.push_back(together.data() + j * hd);
            kernels::attention_accumulate(kv, p.data() + j * rows, v.data(), rows, hd,
                                          alone.data() + j * hd);
          }
          kernels::attention_accumulate_queries(kv, pp.data(), nq, v.data(), rows, hd, op.data());
          for (size_t i = 0; i < together.size(); ++i) {
            ASSERT_EQ(std::bit_cast<uint32_t>(together[i]), std::bit_cast<uint32_t>(alone[i]))
                << kernels::isa_name(isa) << " " << dtype_name(kv) << " hd " << hd << " nq " << nq
                << " at " << i;
          }
        }
      }
    }
  }
}

// Attention's kernels keep the bits of the dot and axpy they are defined by, whatever their
// blocking: each score is dot(k_t, q) * scale, and the weighted sum is one axpy per row in row
// order, on every instruction set this CPU has.
TEST(Kernels, AttentionKernelsAreTheirDefiningDotAndAxpyBitForBit) {
  IsaGuard guard;
  for (Isa isa : supported_isas()) {
    kernels::set_isa(isa);
    for (size_t hd : {8u, 24u, 64u, 80u, 128u, 136u, 131u}) {
      const size_t rows = 16;
      const auto kf = random_floats(rows * hd, 11);
      std::vector<uint16_t> k(rows * hd);
      quantize_row(DType::F16, kf.data(), k.data(), rows * hd);
      const auto q = random_floats(hd, 12), p = random_floats(rows, 13);
      std::vector<float> scores(rows);
      kernels::attention_scores(DType::F16, q.data(), k.data(), rows, hd, 0.3f, scores.data());
      std::vector<float> out = random_floats(hd, 14), want = out;
      kernels::attention_accumulate(DType::F16, p.data(), k.data(), rows, hd, out.data());
      for (size_t t = 0; t < rows; ++t) {
        const float dot = kernels::dot_f16_f32(k.data() + t * hd, q.data(), hd) * 0.3f;
        ASSERT_EQ(std::bit_cast<uint32_t>(scores[t]), std::bit_cast<uint32_t>(dot))
            << kernels::isa_name(isa) << " hd " << hd << " row " << t;
        kernels::axpy_f16(p[t], k.data() + t * hd, want.data(), hd);
      }
      for (size_t i = 0; i < hd; ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(want[i]))
            << kernels::isa_name(isa) << " hd " << hd << " lane " << i;
      }
    }
  }
}

// A row's result must not depend on how many rows share the call or the thread count.
TEST(Kernels, MatmulRowsAreIndependentOfBatchAndThreads) {
  IsaGuard guard;
  for (Isa isa : supported_isas()) {
    kernels::set_isa(isa);
    for (DType wt : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0}) {
      const size_t in = 256, out = 67, rows = 19;
      const auto wf = random_floats(in * out, 5);
      std::vector<uint8_t> w(row_bytes(wt, in) * out);
      for (size_t o = 0; o < out; ++o) {
        quantize_row(wt, &wf[o * in], &w[o * row_bytes(wt, in)], in);
      }
      const WeightView view{wt, w.data(), out, in};
      const auto x = random_floats(in * rows, 6);
      std::vector<uint8_t> scratch;
      ThreadPool one(1), two(2), three(3);
      std::vector<float> batch(rows * out), batch2(rows * out), batch3(rows * out);
      matmul(one, view, x.data(), rows, batch.data(), scratch);
      matmul(two, view, x.data(), rows, batch2.data(), scratch);
      matmul(three, view, x.data(), rows, batch3.data(), scratch);
      EXPECT_EQ(batch, batch2) << dtype_name(wt);
      EXPECT_EQ(batch, batch3) << dtype_name(wt);
      for (size_t r = 0; r < rows; ++r) {
        std::vector<float> single(out);
        matmul(two, view, &x[r * in], 1, single.data(), scratch);
        EXPECT_EQ(0, std::memcmp(single.data(), &batch[r * out], out * sizeof(float)))
            << kernels::isa_name(isa) << " " << dtype_name(wt) << " row " << r;
      }
    }
  }
}

TEST(Kernels, IsaNamesParse) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    EXPECT_EQ(kernels::parse_isa(kernels::isa_name(isa)), isa);
  }
  EXPECT_FALSE(kernels::parse_isa("neon").has_value());
}

}  // namespace
}  // namespace kvc
