#include "base/kv_attention.h"

#include "base/channel_keys.h"
#include "base/error.h"
#include "base/kernels.h"
#include "base/kv_attention_table.h"
#include "base/prefetch_lines.h"

namespace kvc::kernels {
namespace {

// Follows kernels::active_isa(), so that KVCACHE_ISA and set_isa() choose these loops too.
const KvAttentionTable& table() {
  const KvAttentionTable* t = nullptr;
  switch (active_isa()) {
    case Isa::kAvx512:
      t = avx512_kv_attention();
      break;
    case Isa::kAvx2:
      t = avx2_kv_attention();
      break;
    case Isa::kScalar:
      break;
  }
  return t != nullptr ? *t : scalar_kv_attention();
}

// The channel-grouped scores loop for keys of dtype t.
KvChannelScoresFn channel_scores(DType t) {
  switch (t) {
    case DType::Q8_0:
      return table().channel_scores_q8_0;
    case DType::Q4_0:
      return table().channel_scores_q4_0;
    default:
      fail("kv_scores: keys grouped per channel are q8_0 or q4_0, not {}", dtype_name(t));
  }
}

// Requests all of the n rows at rows.ahead at once, for the loops that take no ahead.
void request_ahead(const KvRows& rows, size_t n, size_t hd) {
  if (rows.ahead == nullptr) return;
  const size_t bytes = rows.channels     ? channel_slab_bytes(rows.dtype, hd)
                       : rows.stride > 0 ? n * rows.stride
                                         : n * row_bytes(rows.dtype, hd);
  prefetch_lines(rows.ahead, 0, bytes);
}

}  // namespace

void kv_scores(const KvRows& k, const float* q, size_t n, size_t hd, float scale, float* out) {
  request_ahead(k, n, hd);
  if (k.channels) {
    channel_scores(k.dtype)(&q, 1, k.base, n, hd, scale, &out);
    return;
  }
  switch (k.dtype) {
    case DType::F32:
    case DType::F16:
      attention_scores(k.dtype, q, k.base, n, hd, scale, out);
      return;
    case DType::Q8_0:
      table().scores_q8_0(q, k.base, k.stride, k.first, n, hd, scale, out);
      return;
    case DType::Q4_0:
      table().scores_q4_0(q, k.base, k.stride, k.first, n, hd, scale, out);
      return;
    default:
      break;
  }
  fail("kv_scores: keys stored as {} are not supported", dtype_name(k.dtype));
}

void kv_scores_queries(const KvRows& k, const float* const* q, size_t nq, size_t n, size_t hd,
                       float scale, float* const* out) {
  const bool plain = !k.channels && (k.dtype == DType::F32 || k.dtype == DType::F16);
  if (plain) {
    attention_scores_queries(k.dtype, q, nq, k.base, n, hd, scale, out, k.ahead);
    return;
  }
  request_ahead(k, n, hd);
  if (k.channels) {
    channel_scores(k.dtype)(q, nq, k.base, n, hd, scale, out);
    return;
  }
  switch (k.dtype) {
    case DType::Q8_0:
      table().scores_queries_q8_0(q, nq, k.base, k.stride, k.first, n, hd, scale, out);
      return;
    case DType::Q4_0:
      table().scores_queries_q4_0(q, nq, k.base, k.stride, k.first, n, hd, scale, out);
      return;
    default:
      break;
  }
  fail("kv_scores_queries: keys stored as {} are not supported", dtype_name(k.dtype));
}

void kv_accumulate_queries(const KvRows& v, const float* const* p, size_t nq, size_t n, size_t hd,
                           float* const* out) {
  if (v.dtype == DType::F32 || v.dtype == DType::F16) {
    attention_accumulate_queries(v.dtype, p, nq, v.base, n, hd, out, v.ahead);
    return;
  }
  request_ahead(v, n, hd);
  switch (v.dtype) {
    case DType::Q8_0:
      table().accumulate_queries_q8_0(p, nq, v.base, v.stride, v.first, n, hd, out);
      return;
    case DType::Q4_0:
      table().accumulate_queries_q4_0(p, nq, v.base, v.stride, v.first, n, hd, out);
      return;
    default:
      break;
  }
  fail("kv_accumulate_queries: values stored as {} are not supported", dtype_name(v.dtype));
}

void kv_accumulate(const KvRows& v, const float* p, size_t n, size_t hd, float* out) {
  request_ahead(v, n, hd);
  switch (v.dtype) {
    case DType::F32:
    case DType::F16:
      attention_accumulate(v.dtype, p, v.base, n, hd, out);
      return;
    case DType::Q8_0:
      table().accumulate_q8_0(p, v.base, v.stride, v.first, n, hd, out);
      return;
    case DType::Q4_0:
      table().accumulate_q4_0(p, v.base, v.stride, v.first, n, hd, out);
      return;
    default:
      break;
  }
  fail("kv_accumulate: values stored as {} are not supported", dtype_name(v.dtype));
}

}  // namespace kvc::kernels
