// Instruction sets and inputs shared by the kernel tests.
#pragma once

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "base/kernels.h"

namespace kvc::isa_fixtures {

// Scalar, then every SIMD instruction set this CPU has. Each one it lacks is named in the
// running test's output (once per test) and as its "untested_isa" property, so that a pass on a
// smaller CPU says what it did not test instead of passing silently.
inline std::vector<kernels::Isa> supported_isas() {
  std::vector<kernels::Isa> out = {kernels::Isa::kScalar};
  std::string lacked;
  for (kernels::Isa isa : {kernels::Isa::kAvx2, kernels::Isa::kAvx512}) {
    if (kernels::best_isa() >= isa) {
      out.push_back(isa);
    } else {
      const std::string_view name = kernels::isa_name(isa);
      if (!lacked.empty()) lacked.push_back(',');
      lacked.append(name.data(), name.size());
    }
  }
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  static std::string named_for;
  if (!lacked.empty() && test != nullptr) {
    const std::string name = std::string(test->test_suite_name()) + "." + test->name();
    if (name != named_for) {
      named_for = name;
      std::printf("[ UNTESTED ] this CPU lacks %s: %s does not test those kernels here\n",
                  lacked.c_str(), name.c_str());
      ::testing::Test::RecordProperty("untested_isa", lacked);
    }
  }
  return out;
}

// Restores the active instruction set and GEMM tiling when a test ends.
struct IsaGuard {
  kernels::Isa saved = kernels::active_isa();
  bool tiles = kernels::gemm_tiles();
  ~IsaGuard() {
    kernels::set_isa(saved);
    kernels::set_gemm_tiles(tiles);
  }
};

// n values uniform in [-1, 1), the same for the same seed.
inline std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

}  // namespace kvc::isa_fixtures
