// Checks the GGML weight types q4_1, q5_0, q5_1, q2_K..q6_K and iq4_nl: sizes, GGML ids and names;
// dequantize_row against an independent element-at-a-time reading of the GGML block layouts
// (ggml-common.h, ggml-quants.c), bit for bit; and quantize_row -> dequantize_row error bounds.
#include "base/dtype.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace kvc {
namespace {

struct WeightType {
  DType type;
  const char* name;   // dtype_name
  const char* lower;  // also accepted by parse_dtype
  uint32_t ggml_id;
  int elements;       // per block
  size_t bytes;       // per block
  int f16_fields[2];  // byte offsets of the block's f16 scales (d, then dmin or m)
  int f16_count;
  double rms_limit;  // RMS error / RMS of N(0, 1) data after a quantize round trip
};

const WeightType kTypes[] = {
    {DType::Q4_1, "q4_1", "q4_1", 3, 32, 20, {0, 2}, 2, 0.12},
    {DType::Q5_0, "q5_0", "q5_0", 6, 32, 22, {0, 0}, 1, 0.06},
    {DType::Q5_1, "q5_1", "q5_1", 7, 32, 24, {0, 2}, 2, 0.06},
    {DType::Q2_K, "q2_K", "q2_k", 10, 256, 84, {80, 82}, 2, 0.45},
    {DType::Q3_K, "q3_K", "q3_k", 11, 256, 110, {108, 0}, 1, 0.25},
    {DType::Q4_K, "q4_K", "q4_k", 12, 256, 144, {0, 2}, 2, 0.12},
    {DType::Q5_K, "q5_K", "q5_k", 13, 256, 176, {0, 2}, 2, 0.06},
    {DType::Q6_K, "q6_K", "q6_k", 14, 256, 210, {208, 0}, 1, 0.03},
    {DType::IQ4_NL, "iq4_nl", "IQ4_NL", 20, 32, 18, {0, 0}, 1, 0.10},
};

// ---------------------------------------------------------------------------------------------
// Reference: element e of one block, located bit by bit from the GGML definition.
//
// Byte layouts (little-endian f16 scales):
//   q4_1  20 B: d@0 m@2 qs[16]@4
//   q5_0  22 B: d@0 qh[4]@2 qs[16]@6
//   q5_1  24 B: d@0 m@2 qh[4]@4 qs[16]@8
//   q2_K  84 B: scales[16]@0 qs[64]@16 d@80 dmin@82
//   q3_K 110 B: hmask[32]@0 qs[64]@32 scales[12]@96 d@108
//   q4_K 144 B: d@0 dmin@2 scales[12]@4 qs[128]@16
//   q5_K 176 B: d@0 dmin@2 scales[12]@4 qh[32]@16 qs[128]@48
//   q6_K 210 B: ql[128]@0 qh[64]@128 scales[16] (int8)@192 d@208
//   iq4_nl 18 B: d@0 qs[16]@2, each nibble an index into 16 fixed levels
//
// The float operations follow ggml's dequantize_row_* in order (the build uses
// -ffp-contract=off, so nothing is fused), which makes the comparison exact.
// ---------------------------------------------------------------------------------------------

// `width` bits of byte b[byte], starting at bit `shift`.
int field(const uint8_t* b, int byte, int shift, int width) {
  return (b[byte] >> shift) & ((1 << width) - 1);
}

float f16_at(const uint8_t* b, int offset) {
  return f16_to_f32(static_cast<uint16_t>(b[offset] | (b[offset + 1] << 8)));
}

uint32_t u32_at(const uint8_t* b, int offset) {
  return static_cast<uint32_t>(b[offset]) | static_cast<uint32_t>(b[offset + 1]) << 8 |
         static_cast<uint32_t>(b[offset + 2]) << 16 | static_cast<uint32_t>(b[offset + 3]) << 24;
}

// 32-element blocks keep element e < 16 in the low nibble of qs[e] and element e >= 16 in the
// high nibble of qs[e - 16].
int nibble32(const uint8_t* qs, int e) {
  return field(qs, e % 16, 4 * (e / 16), 4);
}

// q4_K/q5_K: eight 6-bit scales and eight 6-bit mins (one pair per 32-element sub-block) in
// 12 bytes:
//   bytes 0-3:  bits 0-5 scale of sub-block 0-3; bits 6-7 the high bits of scale of 4-7
//   bytes 4-7:  bits 0-5 min of sub-block 0-3;   bits 6-7 the high bits of min of 4-7
//   bytes 8-11: bits 0-3 the low bits of scale of sub-block 4-7; bits 4-7 those of min of 4-7
void k4_scale_min(const uint8_t* s, int sub, int* scale, int* min) {
  if (sub < 4) {
    *scale = field(s, sub, 0, 6);
    *min = field(s, sub + 4, 0, 6);
  } else {
    *scale = field(s, sub + 4, 0, 4) | field(s, sub - 4, 6, 2) << 4;
    *min = field(s, sub + 4, 4, 4) | field(s, sub, 6, 2) << 4;
  }
}

// q3_K: sixteen 6-bit scales (biased by 32), one per 16-element sub-block, in 12 bytes: the low
// nibbles of bytes 0-7 hold the low 4 bits of scales 0-7, their high nibbles those of scales
// 8-15; byte 8 + s % 4 holds the top 2 bits of scale s at bit 2 * (s / 4).
int q3k_scale(const uint8_t* s, int sub) {
  const int low = sub < 8 ? field(s, sub, 0, 4) : field(s, sub - 8, 4, 4);
  return low | field(s, 8 + sub % 4, 2 * (sub / 4), 2) << 4;
}

// q2_K/q3_K pack 2-bit quants: each 128-element half of the block owns 32 bytes, byte l of the
// half holds elements l, l + 32, l + 64, l + 96 of that half at bits 0, 2, 4, 6.
int crumb(const uint8_t* qs, int e) {
  return field(qs, 32 * (e / 128) + e % 32, 2 * ((e / 32) % 4), 2);
}

float reference_value(DType t, const uint8_t* b, int e) {
  switch (t) {
    case DType::Q4_1: {
      const int q = nibble32(b + 4, e);
      return static_cast<float>(q) * f16_at(b, 0) + f16_at(b, 2);
    }
    case DType::Q5_0: {
      const int high = static_cast<int>((u32_at(b, 2) >> e) & 1u);  // bit e of qh
      const int q = nibble32(b + 6, e) | high << 4;
      return static_cast<float>(q - 16) * f16_at(b, 0);
    }
    case DType::Q5_1: {
      const int high = static_cast<int>((u32_at(b, 4) >> e) & 1u);
      const int q = nibble32(b + 8, e) | high << 4;
      return static_cast<float>(q) * f16_at(b, 0) + f16_at(b, 2);
    }
    case DType::Q2_K: {
      const int sc = b[e / 16];  // low nibble: scale, high nibble: min
      const int q = crumb(b + 16, e);
      const float dl = f16_at(b, 80) * static_cast<float>(sc & 0xF);
      const float ml = f16_at(b, 82) * static_cast<float>(sc >> 4);
      return dl * static_cast<float>(q) - ml;
    }
    case DType::Q3_K: {
      // hmask byte e % 32, bit e / 32 is the third bit; when clear the value is 4 lower.
      const int high = field(b, e % 32, e / 32, 1);
      const int q = crumb(b + 32, e) - (high ? 0 : 4);
      const float dl = f16_at(b, 108) * static_cast<float>(q3k_scale(b + 96, e / 16) - 32);
      return dl * static_cast<float>(q);
    }
    case DType::Q4_K: {
      int sc = 0;
      int m = 0;
      k4_scale_min(b + 4, e / 32, &sc, &m);
      // Each 64-element chunk owns 32 bytes: its first 32 elements in the low nibbles.
      const int q = field(b, 16 + 32 * (e / 64) + e % 32, 4 * ((e / 32) % 2), 4);
      const float d1 = f16_at(b, 0) * static_cast<float>(sc);
      const float m1 = f16_at(b, 2) * static_cast<float>(m);
      return d1 * static_cast<float>(q) - m1;
    }
    case DType::Q5_K: {
      int sc = 0;
      int m = 0;
      k4_scale_min(b + 4, e / 32, &sc, &m);
      const int low = field(b, 48 + 32 * (e / 64) + e % 32, 4 * ((e / 32) % 2), 4);
      const int high = field(b, 16 + e % 32, e / 32, 1);  // qh byte e % 32, bit e / 32
      const int q = low + (high ? 16 : 0);
      const float d1 = f16_at(b, 0) * static_cast<float>(sc);
      const float m1 = f16_at(b, 2) * static_cast<float>(m);
      return d1 * static_cast<float>(q) - m1;
    }
    case DType::Q6_K: {
      // Per 128-element half: 64 ql bytes and 32 qh bytes. Quarter k = (e / 32) % 4 of the
      // half takes its low 4 bits from ql[32 * (k % 2) + e % 32] (low nibble for k < 2, high
      // for k >= 2) and its top 2 bits from qh[e % 32] at bit 2 * k.
      const int k = (e / 32) % 4;
      const int low = field(b, 64 * (e / 128) + 32 * (k % 2) + e % 32, 4 * (k / 2), 4);
      const int high = field(b, 128 + 32 * (e / 128) + e % 32, 2 * k, 2);
      const int q = (low | high << 4) - 32;
      const int sc = static_cast<int8_t>(b[192 + e / 16]);
      const float ds = f16_at(b, 208) * static_cast<float>(sc);
      return ds * static_cast<float>(q);
    }
    case DType::IQ4_NL: {
      // ggml-common.h's kvalues_iq4nl.
      static constexpr int kLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                          1,    13,   25,  38,  53,  69,  89,  113};
      return f16_at(b, 0) * static_cast<float>(kLevels[nibble32(b + 2, e)]);
    }
    default:
      return std::nanf("");
  }
}

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(WeightQuantReference, SizesIdsAndNames) {
  for (const WeightType& w : kTypes) {
    SCOPED_TRACE(w.name);
    EXPECT_EQ(block_elements(w.type), w.elements);
    EXPECT_EQ(block_bytes(w.type), w.bytes);
    EXPECT_EQ(row_bytes(w.type, static_cast<size_t>(3 * w.elements)), 3 * w.bytes);
    EXPECT_EQ(ggml_type_id(w.type), w.ggml_id);
    EXPECT_EQ(dtype_from_ggml(w.ggml_id), w.type);
    EXPECT_EQ(dtype_from_ggml(ggml_type_id(w.type)), w.type);
    EXPECT_EQ(dtype_name(w.type), w.name);
    EXPECT_EQ(parse_dtype(w.name), w.type);
    EXPECT_EQ(parse_dtype(w.lower), w.type);
    EXPECT_EQ(parse_dtype(dtype_name(w.type)), w.type);
    std::string upper(w.name);
    for (char& c : upper) {
      if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
    }
    EXPECT_EQ(ggml_type_name(w.ggml_id), upper);
  }
}

// Random bytes everywhere (some trials with fixed patterns that push every code to its extreme),
// with each f16 scale replaced by a finite value in [-0.05, 0.05]: dequantize_row over several
// blocks must reproduce the reference for every element, bit for bit.
TEST(WeightQuantReference, DequantizeMatchesTheBitLayoutBitForBit) {
  std::mt19937 rng(20240611);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  constexpr int kBlocks = 3;
  constexpr int kTrials = 24;
  for (const WeightType& w : kTypes) {
    int mismatches = 0;
    for (int trial = 0; trial < kTrials; ++trial) {
      std::vector<uint8_t> raw(kBlocks * w.bytes);
      for (size_t i = 0; i < raw.size(); ++i) {
        switch (trial) {
          case 0:
            raw[i] = 0xff;
            break;
          case 1:
            raw[i] = 0x00;
            break;
          case 2:
            raw[i] = (i % 2) ? 0xaa : 0x55;
            break;
          default:
            raw[i] = static_cast<uint8_t>(byte(rng));
        }
      }
      for (int blk = 0; blk < kBlocks; ++blk) {
        uint8_t* block = raw.data() + static_cast<size_t>(blk) * w.bytes;
        for (int f = 0; f < w.f16_count; ++f) {
          const uint16_t h = f32_to_f16(scale(rng));
          block[w.f16_fields[f]] = static_cast<uint8_t>(h & 0xff);
          block[w.f16_fields[f] + 1] = static_cast<uint8_t>(h >> 8);
        }
      }
      const size_t n = static_cast<size_t>(kBlocks * w.elements);
      std::vector<float> out(n, std::nanf(""));
      dequantize_row(w.type, raw.data(), out.data(), n);
      for (int blk = 0; blk < kBlocks; ++blk) {
        const uint8_t* block = raw.data() + static_cast<size_t>(blk) * w.bytes;
        for (int e = 0; e < w.elements; ++e) {
          const float want = reference_value(w.type, block, e);
          const float got = out[static_cast<size_t>(blk * w.elements + e)];
          if (std::memcmp(&want, &got, sizeof(float)) != 0 && ++mismatches <= 8) {
            ADD_FAILURE() << w.name << " trial " << trial << " block " << blk << " element " << e
                          << ": dequantize_row " << got << " (0x" << std::hex << float_bits(got)
                          << "), reference " << std::dec << want << " (0x" << std::hex
                          << float_bits(want) << std::dec << ")";
          }
        }
      }
    }
    EXPECT_EQ(mismatches, 0) << w.name;
  }
}

// ---------------------------------------------------------------------------------------------
// Quantize round trip.
// ---------------------------------------------------------------------------------------------

struct Range {
  double min = 0;
  double max = 0;
  double amax = 0;  // max |x|
};

Range range_of(const float* x, int n) {
  Range r{x[0], x[0], std::fabs(x[0])};
  for (int i = 1; i < n; ++i) {
    r.min = std::min(r.min, static_cast<double>(x[i]));
    r.max = std::max(r.max, static_cast<double>(x[i]));
    r.amax = std::max(r.amax, std::fabs(static_cast<double>(x[i])));
  }
  return r;
}

// Largest |x[e] - dequantized| a quantiser that takes each (sub-)block's min/max, rounds its
// scales to nearest and its quants to nearest (no iterative search) can leave. "f16" terms cover
// the rounding of the stored f16 scales (relative 2^-11, doubled).
double error_bound(DType t, const float* row, int e) {
  constexpr double kF16 = 1.0 / 1024;
  const int block = block_elements(t);
  const float* x = row + e / block * block;  // the element's block
  const int i = e % block;                   // its index in the block
  switch (t) {
    case DType::Q4_1:
    case DType::Q5_1: {
      // Affine over 32 elements, min/max to 0/levels: half a step.
      const double levels = t == DType::Q4_1 ? 15 : 31;
      const Range r = range_of(x, 32);
      const double span = r.max - r.min;
      return 0.5 * span / levels + (span + r.amax) * kF16;
    }
    case DType::Q5_0: {
      // Symmetric, d = -(signed extreme) / 16 maps the extreme to -16; the opposite side only
      // reaches +15 steps, so values there can be clamped by up to one whole step.
      const double amax = range_of(x, 32).amax;
      return amax / 16 + amax * kF16;
    }
    case DType::Q2_K:
    case DType::Q4_K:
    case DType::Q5_K: {
      // value = d * sc * q - dmin * m, min forced <= 0. Half a step of the sub-block's own
      // range, plus the quantisation of sc and m to `scale_levels` steps of the super-block's
      // largest scale and min (half a scale step, times up to `levels` quants, is at most
      // 0.5 * (largest sub-block range) / scale_levels; likewise for the min).
      const int sub = t == DType::Q2_K ? 16 : 32;
      const double levels = t == DType::Q2_K ? 3 : t == DType::Q4_K ? 15 : 31;
      const double scale_levels = t == DType::Q2_K ? 15 : 63;
      auto span_of = [](const Range& r) { return std::max(r.max, 0.0) - std::min(r.min, 0.0); };
      double largest_span = 0;
      for (int s = 0; s < block; s += sub) {
        largest_span = std::max(largest_span, span_of(range_of(x + s, sub)));
      }
      const double amax = range_of(x, block).amax;
      const double span = span_of(range_of(x + i / sub * sub, sub));
      return 0.6 * span / levels + 0.6 * (largest_span + amax) / scale_levels +
             (largest_span + amax) * kF16;
    }
    case DType::Q3_K:
    case DType::Q6_K: {
      // value = d * (sc - bias) * q, q in [-4, 3] (q3_K) or [-32, 31] (q6_K), sub-blocks of 16.
      // As for q5_0 a sub-block's opposite side can be clamped by one whole step (its amax / 4
      // or / 32). The 6-bit (q3_K, d = amax / 128) or 8-bit (q6_K, d = amax / 4096) scale
      // quantisation moves the extreme quant by up to 4 resp. 32 times d: amax / 32 resp.
      // amax / 128 of the super-block, taken with 20% to spare.
      const bool q3 = t == DType::Q3_K;
      const double sub_amax = range_of(x + i / 16 * 16, 16).amax;
      const double amax = range_of(x, block).amax;
      return sub_amax / (q3 ? 4 : 32) + 1.2 * amax / (q3 ? 32 : 128) + amax * kF16;
    }
    case DType::IQ4_NL: {
      // The scale maps the extreme to a level at most 16 inside the table's end (|d| about
      // amax / 111); the widest gap between levels is 24 steps and the far side ends at 113,
      // 14 steps short of 127, so no element is off by more than 14 steps, with the
      // least-squares refit of d taken with 25% to spare.
      const double amax = range_of(x, 32).amax;
      return 1.25 * 14 * amax / 111 + amax * kF16;
    }
    default:
      return 0;
  }
}

struct TestRow {
  std::string name;
  std::vector<float> x;
  bool check_rms;  // N(0, 1) data: also bound the RMS error
};

std::vector<TestRow> round_trip_rows() {
  constexpr size_t kN = 1024;
  auto normal = [](uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(kN);
    for (float& v : x) v = dist(rng);
    return x;
  };
  std::vector<TestRow> rows;
  rows.push_back({"normal seed 1", normal(1), true});
  rows.push_back({"normal seed 2", normal(2), true});
  std::vector<float> outlier = normal(3);
  outlier[100] = 40.0f;
  outlier[700] = -25.0f;
  rows.push_back({"normal with outliers", outlier, false});
  std::vector<float> shifted = normal(4);
  for (float& v : shifted) v += 3.0f;
  rows.push_back({"normal shifted by +3", shifted, false});
  rows.push_back({"all zero", std::vector<float>(kN, 0.0f), false});
  return rows;
}

// quantize_row then dequantize_row: every element within error_bound, RMS error of N(0, 1)
// rows below the type's limit, all-zero rows back to exact zeros, the quantised bytes read the
// same through the reference, and quantize_row defines every byte it writes.
TEST(WeightQuantReference, QuantizeRoundTripStaysWithinBounds) {
  const std::vector<TestRow> rows = round_trip_rows();
  for (const WeightType& w : kTypes) {
    for (const TestRow& row : rows) {
      SCOPED_TRACE(std::string(w.name) + ", " + row.name);
      const size_t n = row.x.size();
      ASSERT_EQ(n % static_cast<size_t>(w.elements), 0u);
      const size_t nb = row_bytes(w.type, n);
      ASSERT_EQ(nb, n / static_cast<size_t>(w.elements) * w.bytes);

      // Two destinations with different prior contents must come out identical.
      std::vector<uint8_t> q(nb, 0x00);
      std::vector<uint8_t> q_ff(nb, 0xff);
      quantize_row(w.type, row.x.data(), q.data(), n);
      quantize_row(w.type, row.x.data(), q_ff.data(), n);
      EXPECT_TRUE(q == q_ff) << "quantize_row leaves bytes of its destination unwritten";

      std::vector<float> y(n, std::nanf(""));
      dequantize_row(w.type, q.data(), y.data(), n);

      int reference_mismatches = 0;
      int bound_failures = 0;
      double sum_err2 = 0;
      double sum_x2 = 0;
      for (size_t e = 0; e < n; ++e) {
        const int in_block = static_cast<int>(e % static_cast<size_t>(w.elements));
        const uint8_t* block = q.data() + e / static_cast<size_t>(w.elements) * w.bytes;
        const float want = reference_value(w.type, block, in_block);
        if (std::memcmp(&want, &y[e], sizeof(float)) != 0 && ++reference_mismatches <= 5) {
          ADD_FAILURE() << "element " << e << ": dequantize_row " << y[e] << ", reference " << want;
        }
        ASSERT_FALSE(std::isnan(y[e])) << "element " << e;
        if (row.name == "all zero") {
          EXPECT_EQ(y[e], 0.0f) << "element " << e;
          continue;
        }
        const double err = std::fabs(static_cast<double>(row.x[e]) - static_cast<double>(y[e]));
        const double bound = error_bound(w.type, row.x.data(), static_cast<int>(e));
        if (!(err <= bound) && ++bound_failures <= 5) {
          ADD_FAILURE() << "element " << e << ": x " << row.x[e] << " -> " << y[e] << ", error "
                        << err << " > bound " << bound;
        }
        sum_err2 += err * err;
        sum_x2 += static_cast<double>(row.x[e]) * row.x[e];
      }
      EXPECT_EQ(reference_mismatches, 0);
      EXPECT_EQ(bound_failures, 0);
      if (row.check_rms) {
        const double relative_rms = std::sqrt(sum_err2 / sum_x2);
        EXPECT_LT(relative_rms, w.rms_limit);
      }
    }
  }
}

}  // namespace
}  // namespace kvc
