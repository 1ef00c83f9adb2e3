// The per-instruction-set quantised attention loops behind base/kv_attention.h (internal to
// base/). Arguments are those of kv_scores / kv_accumulate with the rows spelled out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "base/dtype.h"

namespace kvc::kernels {

using KvScoresFn = void (*)(const float* q, const uint8_t* base, size_t stride, int first, size_t n,
                            size_t hd, float scale, float* out);
using KvAccumulateFn = void (*)(const float* p, const uint8_t* base, size_t stride, int first,
                                size_t n, size_t hd, float* out);

struct KvAttentionTable {
  KvScoresFn scores_q8_0;
  KvScoresFn scores_q4_0;
  KvAccumulateFn accumulate_q8_0;
  KvAccumulateFn accumulate_q4_0;
};

// A table's loops for Block (BlockQ8_0 or BlockQ4_0), for rows too narrow for wider lanes.
template <class Block>
KvScoresFn scores_for(const KvAttentionTable& t) {
  return std::is_same_v<Block, BlockQ8_0> ? t.scores_q8_0 : t.scores_q4_0;
}
template <class Block>
KvAccumulateFn accumulate_for(const KvAttentionTable& t) {
  return std::is_same_v<Block, BlockQ8_0> ? t.accumulate_q8_0 : t.accumulate_q4_0;
}

const KvAttentionTable& scalar_kv_attention();
// Null when the compiler cannot target the instruction set.
const KvAttentionTable* avx2_kv_attention();
const KvAttentionTable* avx512_kv_attention();

}  // namespace kvc::kernels
