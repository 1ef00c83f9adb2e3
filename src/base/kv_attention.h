// Attention over keys and values read in place from KV storage of any KV dtype (f32, f16,
// q8_0, q4_0), with run-time dispatch like base/kernels.h (AVX-512, AVX2 or scalar).
//
// Quantised rows are never expanded into a copy of the context: each kernel converts a group
// of 32 values in registers as it reads it. Every output depends only on its own row's bytes
// and is reduced in one fixed order, so a row's result never depends on the rest of the batch.
//
// Thread-safety: pure functions; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"

namespace kvc::kernels {

// n rows of hd values of one head: row t's values start at element `first` of the data at
// base + t * stride bytes. For f32/f16, first is 0 and a row is hd contiguous elements. For
// q8_0/q4_0 a row is either hd / 32 whole groups (hd a multiple of 32, first 0) or one run of
// hd values inside one group (hd divides 32, first a multiple of hd). Keys grouped per channel
// (channels true; q8_0/q4_0 only) are instead the (layer, KV head) slab of one block at base
// (base/channel_keys.h), of which the first n <= kChannelTokens keys are read. ahead, unless
// null, is where rows of the same shape lie that a later call will read (the next blocks of a
// paged cache, which no hardware prefetcher foresees): their cache lines are requested while
// these rows are read, a few with each row where the loop reads rows in order.
struct KvRows {
  DType dtype = DType::F32;
  const uint8_t* base = nullptr;
  size_t stride = 0;
  int first = 0;
  bool channels = false;
  const uint8_t* ahead = nullptr;
};

// out[t] = dot(q, k_t) * scale for the n rows of k.
void kv_scores(const KvRows& k, const float* q, size_t n, size_t hd, float scale, float* out);
// kv_scores for nq queries q[j] into out[j] over the same n rows of k, reading each row once
// where a kernel can; every out[j] has the same bits as kv_scores of q[j] alone.
void kv_scores_queries(const KvRows& k, const float* const* q, size_t nq, size_t n, size_t hd,
                       float scale, float* const* out);
// out += p[t] * v_t for t = 0..n-1 in order, over the n rows of v.
void kv_accumulate(const KvRows& v, const float* p, size_t n, size_t hd, float* out);
// kv_accumulate for nq weight rows p[j] into out[j] over the same n rows of v, reading each row
// once for several of them where a kernel can; every out[j] has the bits of kv_accumulate alone.
void kv_accumulate_queries(const KvRows& v, const float* const* p, size_t nq, size_t n, size_t hd,
                           float* const* out);

}  // namespace kvc::kernels
