// Portable quantised attention loops: the reference the SIMD versions are tested against.
#include <cmath>

#include "base/channel_keys.h"
#include "base/dtype.h"
#include "base/kv_attention_table.h"

namespace kvc::kernels {
namespace {

inline int value(const BlockQ8_0& b, int e) {
  return b.qs[e];
}

inline int value(const BlockQ4_0& b, int e) {
  return e < 16 ? (b.qs[e] & 0x0f) - 8 : (b.qs[e - 16] >> 4) - 8;
}

// A row is hd / 32 whole groups, or one run of hd values from element `first` of one group.
template <class Block>
void scores(const float* q, const uint8_t* base, size_t stride, int first, size_t n, size_t hd,
            float scale, float* out) {
  const size_t groups = hd >= 32 ? hd / 32 : 1;
  const int run = hd >= 32 ? 32 : static_cast<int>(hd);
  for (size_t t = 0; t < n; ++t) {
    const auto* b = reinterpret_cast<const Block*>(base + t * stride);
    float acc = 0.0f;  // over the exact values: each integer times its group's scale
    for (size_t g = 0; g < groups; ++g) {
      const float d = f16_to_f32(b[g].d);
      for (int i = 0; i < run; ++i)
        acc += q[g * 32 + i] * (d * static_cast<float>(value(b[g], first + i)));
    }
    out[t] = acc * scale;
  }
}

template <class Block>
void accumulate(const float* p, const uint8_t* base, size_t stride, int first, size_t n, size_t hd,
                float* out) {
  const size_t groups = hd >= 32 ? hd / 32 : 1;
  const int run = hd >= 32 ? 32 : static_cast<int>(hd);
  for (size_t t = 0; t < n; ++t) {
    const auto* b = reinterpret_cast<const Block*>(base + t * stride);
    for (size_t g = 0; g < groups; ++g) {
      const float a = p[t] * f16_to_f32(b[g].d);
      for (int i = 0; i < run; ++i)
        out[g * 32 + i] += a * static_cast<float>(value(b[g], first + i));
    }
  }
}

template <class Block>
void scores_queries(const float* const* q, size_t nq, const uint8_t* base, size_t stride, int first,
                    size_t n, size_t hd, float scale, float* const* out) {
  scores_each<Block>(scalar_kv_attention(), q, nq, base, stride, first, n, hd, scale, out);
}

template <class Block>
void accumulate_queries(const float* const* p, size_t nq, const uint8_t* base, size_t stride,
                        int first, size_t n, size_t hd, float* const* out) {
  accumulate_each<Block>(scalar_kv_attention(), p, nq, base, stride, first, n, hd, out);
}

template <DType kType>
void channel_scores(const float* const* q, size_t nq, const uint8_t* slab, size_t n, size_t hd,
                    float scale, float* const* out) {
  for (size_t j = 0; j < nq; ++j) {
    const float bias = channel_bias(q[j], slab, kType, hd);
    for (size_t t = 0; t < n; ++t) {
      float acc = bias;
      for (size_t c = 0; c < hd; ++c) {
        const float weight = q[j][c] * channel_slab_step(slab, kType, hd, c);
        acc = std::fma(weight,
                       static_cast<float>(channel_code(slab, kType, c, static_cast<int>(t))), acc);
      }
      out[j][t] = acc * scale;
    }
  }
}

}  // namespace

const KvAttentionTable& scalar_kv_attention() {
  static const KvAttentionTable table{scores<BlockQ8_0>,
                                      scores<BlockQ4_0>,
                                      accumulate<BlockQ8_0>,
                                      accumulate<BlockQ4_0>,
                                      scores_queries<BlockQ8_0>,
                                      scores_queries<BlockQ4_0>,
                                      accumulate_queries<BlockQ8_0>,
                                      accumulate_queries<BlockQ4_0>,
                                      channel_scores<DType::Q8_0>,
                                      channel_scores<DType::Q4_0>};
  return table;
}

}  // namespace kvc::kernels
