// Rotating heads before keys are stored quantised: the transform keeps every score, undoes
// itself, and applies only to heads whose size is a power of two.
#include "model/head_rotation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace kvc::model {
namespace {

TEST(HeadRotation, RotatedQueriesAndKeysKeepTheirScores) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int hd = 2; hd <= 256; hd *= 2) {
    constexpr int kHeads = 3;
    std::vector<float> q(kHeads * hd), k(kHeads * hd);
    for (float& x : q) x = normal(rng);
    // Channel 1 of every head carries a large offset, as real keys do.
    for (float& x : k) x = normal(rng) + ((&x - k.data()) % hd == 1 ? 10.0f : 0.0f);
    std::vector<double> before(kHeads);
    double magnitude = 0.0;
    for (int h = 0; h < kHeads; ++h) {
      for (int i = 0; i < hd; ++i) {
        before[h] += static_cast<double>(q[h * hd + i]) * k[h * hd + i];
        magnitude += std::fabs(static_cast<double>(q[h * hd + i]) * k[h * hd + i]);
      }
    }
    hadamard_heads(k.data(), kHeads, hd, 1.0f);
    hadamard_heads(q.data(), kHeads, hd, 1.0f / static_cast<float>(hd));
    for (int h = 0; h < kHeads; ++h) {
      double after = 0.0;
      for (int i = 0; i < hd; ++i) after += static_cast<double>(q[h * hd + i]) * k[h * hd + i];
      EXPECT_NEAR(after, before[h], 1e-5 * (magnitude + 1.0)) << "head_dim " << hd << " head " << h;
    }
  }
}

// H H = n I: with small integers every sum is exact, so the round trip gives the same bits.
TEST(HeadRotation, TwiceOverTheOrderIsTheIdentity) {
  for (int hd : {2, 8, 64, 128}) {
    std::vector<float> x(2 * hd), y;
    for (int i = 0; i < 2 * hd; ++i) x[i] = static_cast<float>((i * 7) % 11) - 5.0f;
    y = x;
    hadamard_heads(y.data(), 2, hd, 1.0f);
    EXPECT_NE(x, y);
    hadamard_heads(y.data(), 2, hd, 1.0f / static_cast<float>(hd));
    EXPECT_EQ(x, y) << "head_dim " << hd;
  }
}

// A key whose size sits in one channel comes out spread evenly over the head.
TEST(HeadRotation, SpreadsAnOutlierChannelOverTheHead) {
  std::vector<float> k(8, 0.0f);
  k[3] = 16.0f;
  hadamard_heads(k.data(), 1, 8, 1.0f);
  for (float v : k) EXPECT_EQ(std::fabs(v), 16.0f);
}

TEST(HeadRotation, OnlyHeadsWhoseSizeIsAPowerOfTwo) {
  for (int hd : {2, 4, 8, 16, 32, 64, 128, 256}) EXPECT_TRUE(rotates_heads(hd)) << hd;
  for (int hd : {0, 1, 3, 24, 80, 96, 112, 160}) EXPECT_FALSE(rotates_heads(hd)) << hd;
}

}  // namespace
}  // namespace kvc::model
