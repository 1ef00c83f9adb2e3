// The loop that measures an instruction set's multiply-add ceiling (internal to base/).
//
// Included by each kernels_* file after its target pragma, inside an anonymous namespace, like
// simd_reduce.h, so that every instruction set's burst is the same loop over its own
// instruction. It includes nothing itself.
#pragma once

// Independent accumulators, each its own dependency chain: twelve cover a multiply-add's
// latency (4-5 cycles) at two instructions a cycle, the most any x86 core here issues.
inline constexpr int kBurstChains = 12;

// A float chain's start from a seed, in [0.5, 0.75): with steps acc * m + m for such an m,
// every value stays normal (subnormals would slow the chain).
inline float burst_multiplier(uint64_t seed) {
  return 0.5f + static_cast<float>(seed % 256) / 1024.0f;
}

// `rounds` rounds of one Op::step on each of kBurstChains accumulators. Op names the vector
// (Vec), the instruction (kInstruction), the multiply-adds one step runs (kMultiplyAdds), a chain's
// start from a seed, the step and a fold of a chain's result into 64 bits. The seed comes from
// *checksum and the folds are added to it, so the compiler can neither precompute nor drop the
// steps. Returns the multiply-adds run.
template <class Op>
uint64_t multiply_add_chains(size_t rounds, uint64_t* checksum) {
  typename Op::Vec acc[kBurstChains];
  for (int c = 0; c < kBurstChains; ++c) acc[c] = Op::start(*checksum + c);
  // A multiplicative hash of the seed: a small seed's own high bits would make a zero operand.
  const typename Op::Vec operand = Op::start(*checksum * 0x9e3779b97f4a7c15ull >> 8);
  for (size_t r = 0; r < rounds; ++r) {
#pragma GCC unroll 12
    for (int c = 0; c < kBurstChains; ++c) acc[c] = Op::step(acc[c], operand);
  }
  for (int c = 0; c < kBurstChains; ++c) *checksum += Op::fold(acc[c]);
  return static_cast<uint64_t>(rounds) * kBurstChains * Op::kMultiplyAdds;
}

// The instruction set's multiply_add_burst (kernel_table.h) from its Int8 and F32 steps.
template <class Int8, class F32>
uint64_t multiply_add_burst_of(Arithmetic kind, size_t rounds, uint64_t* checksum) {
  return kind == Arithmetic::kInt8 ? multiply_add_chains<Int8>(rounds, checksum)
                                   : multiply_add_chains<F32>(rounds, checksum);
}

// The instruction each of those steps runs (Op::kInstruction), for reports.
template <class Int8, class F32>
const char* multiply_add_instruction_of(Arithmetic kind) {
  return kind == Arithmetic::kInt8 ? Int8::kInstruction : F32::kInstruction;
}
