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

// The same for nq queries (or weight rows) over the same rows, each converted once for all.
using KvScoresQueriesFn = void (*)(const float* const* q, size_t nq, const uint8_t* base,
                                   size_t stride, int first, size_t n, size_t hd, float scale,
                                   float* const* out);
using KvAccumulateQueriesFn = void (*)(const float* const* p, size_t nq, const uint8_t* base,
                                       size_t stride, int first, size_t n, size_t hd,
                                       float* const* out);

// Scores of nq queries against the n first keys (n <= kChannelTokens) of one (layer, KV head)
// slab of a block whose keys are grouped per channel (base/channel_keys.h). Per key t:
// channel_bias, then for each channel c in order a fused multiply-add of (q[c] * step_c) and
// code(c, t), then times scale: the same bits for every query count and instruction set.
using KvChannelScoresFn = void (*)(const float* const* q, size_t nq, const uint8_t* slab, size_t n,
                                   size_t hd, float scale, float* const* out);

struct KvAttentionTable {
  KvScoresFn scores_q8_0;
  KvScoresFn scores_q4_0;
  KvAccumulateFn accumulate_q8_0;
  KvAccumulateFn accumulate_q4_0;
  KvScoresQueriesFn scores_queries_q8_0;
  KvScoresQueriesFn scores_queries_q4_0;
  KvAccumulateQueriesFn accumulate_queries_q8_0;
  KvAccumulateQueriesFn accumulate_queries_q4_0;
  KvChannelScoresFn channel_scores_q8_0;
  KvChannelScoresFn channel_scores_q4_0;
};

// A table's loop for Block (BlockQ8_0 or BlockQ4_0): its q8_0 one or its q4_0 one.
template <class Block, class Fn>
Fn for_block(Fn q8_0, Fn q4_0) {
  return std::is_same_v<Block, BlockQ8_0> ? q8_0 : q4_0;
}
template <class Block>
KvScoresFn scores_for(const KvAttentionTable& t) {
  return for_block<Block>(t.scores_q8_0, t.scores_q4_0);
}
template <class Block>
KvAccumulateFn accumulate_for(const KvAttentionTable& t) {
  return for_block<Block>(t.accumulate_q8_0, t.accumulate_q4_0);
}
template <class Block>
KvScoresQueriesFn scores_queries_for(const KvAttentionTable& t) {
  return for_block<Block>(t.scores_queries_q8_0, t.scores_queries_q4_0);
}
template <class Block>
KvAccumulateQueriesFn accumulate_queries_for(const KvAttentionTable& t) {
  return for_block<Block>(t.accumulate_queries_q8_0, t.accumulate_queries_q4_0);
}

// Query by query through a table's single-query loop (where sharing a row's conversion does
// not pay, or the lanes do not fit).
template <class Block>
void scores_each(const KvAttentionTable& t, const float* const* q, size_t nq, const uint8_t* base,
                 size_t stride, int first, size_t n, size_t hd, float scale, float* const* out) {
  const KvScoresFn f = scores_for<Block>(t);
  for (size_t j = 0; j < nq; ++j) f(q[j], base, stride, first, n, hd, scale, out[j]);
}
template <class Block>
void accumulate_each(const KvAttentionTable& t, const float* const* p, size_t nq,
                     const uint8_t* base, size_t stride, int first, size_t n, size_t hd,
                     float* const* out) {
  const KvAccumulateFn f = accumulate_for<Block>(t);
  for (size_t j = 0; j < nq; ++j) f(p[j], base, stride, first, n, hd, out[j]);
}

const KvAttentionTable& scalar_kv_attention();
// Null when the compiler cannot target the instruction set.
const KvAttentionTable* avx2_kv_attention();
const KvAttentionTable* avx512_kv_attention();

}  // namespace kvc::kernels
