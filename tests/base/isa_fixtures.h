// Instruction sets and inputs shared by the kernel tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "base/kernels.h"

namespace kvc::isa_fixtures {

// Scalar, then every SIMD instruction set this CPU has (a test names those it skips).
inline std::vector<kernels::Isa> supported_isas() {
  std::vector<kernels::Isa> out = {kernels::Isa::kScalar};
  if (kernels::best_isa() >= kernels::Isa::kAvx2) out.push_back(kernels::Isa::kAvx2);
  if (kernels::best_isa() >= kernels::Isa::kAvx512) out.push_back(kernels::Isa::kAvx512);
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
