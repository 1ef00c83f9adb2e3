// Keys grouped per channel (KIVI): within one KV block of kChannelTokens tokens, each channel of
// a (layer, KV head) is one quantisation group running across the block's tokens, with its own
// minimum and step, since keys carry channels whose offset and spread differ from the rest (and,
// after RoPE, drift along the positions). A block's keys are quantised once, when its last token
// is written; until then they are held as f16 (see kv/block_table.h).
//
// A (layer, KV head) slab of a block: codes [head_dim][kChannelTokens] (q8_0: one unsigned byte
// per token; q4_0: sixteen bytes, token t in the low nibble of byte t and token t + 16 in the
// high one), then head_dim f16 minimums, then head_dim 8-bit step codes. Value of (channel c,
// token t) = min_c + step_c * code: 35 bytes per 32 keys at 8 bits, 19 at 4.
//
// Thread-safety: pure functions; safe from any thread.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "base/dtype.h"

namespace kvc::kernels {

// Tokens of one channel group, and so of a KV block whose keys are grouped per channel.
inline constexpr int kChannelTokens = 32;

// Code bytes of one channel of a block: 32 at 8 bits, 16 at 4.
inline size_t channel_code_bytes(DType t) {
  return t == DType::Q4_0 ? kChannelTokens / 2 : kChannelTokens;
}
// Largest code: 255 at 8 bits, 15 at 4.
inline int channel_max_code(DType t) {
  return t == DType::Q4_0 ? 15 : 255;
}
// Bytes of one (layer, KV head) slab of head_dim channels.
inline size_t channel_slab_bytes(DType t, size_t head_dim) {
  return head_dim * (channel_code_bytes(t) + 3);
}

// A step from its 8-bit code: 0 is a step of 0 (a constant channel); otherwise five exponent
// bits e and three mantissa bits m give 2^(e - 20) * (1 + m / 8).
inline constexpr auto kChannelSteps = [] {
  std::array<float, 256> steps{};
  for (int code = 1; code < 256; ++code) {
    float step = 1.0f + static_cast<float>(code & 7) / 8.0f;
    for (int e = code >> 3; e < 20; ++e) step /= 2.0f;  // exact: powers of two
    for (int e = 20; e < (code >> 3); ++e) step *= 2.0f;
    steps[code] = step;
  }
  return steps;
}();
inline float channel_step(uint8_t code) {
  return kChannelSteps[code];
}
// The code of the smallest step at least s (s >= 0), the largest code for a step beyond it.
uint8_t channel_step_code_at_least(float s);

// Channel c's minimum in a slab.
inline float channel_min(const uint8_t* slab, DType t, size_t head_dim, size_t c) {
  uint16_t h;
  std::memcpy(&h, slab + head_dim * channel_code_bytes(t) + 2 * c, sizeof h);
  return f16_to_f32(h);
}
// Channel c's step in a slab.
inline float channel_slab_step(const uint8_t* slab, DType t, size_t head_dim, size_t c) {
  return channel_step(slab[head_dim * (channel_code_bytes(t) + 2) + c]);
}
// Code of (channel c, token t) in a slab.
inline int channel_code(const uint8_t* slab, DType t, size_t c, int token) {
  const uint8_t* codes = slab + c * channel_code_bytes(t);
  if (t != DType::Q4_0) return codes[token];
  return token < kChannelTokens / 2 ? codes[token] & 0x0f : codes[token - kChannelTokens / 2] >> 4;
}

// A query's part of every score that the minimums make, sum over c of q[c] * min_c (head_dim
// a multiple of 8): eight sums of fused multiply-adds, sum i over the channels c = i mod 8 in
// order, then added as ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)), the order of one
// 8-lane vector's horizontal sum, so every kernel gets these bits.
inline float channel_bias(const float* q, const uint8_t* slab, DType t, size_t head_dim) {
  float s[8] = {};
  for (size_t c = 0; c < head_dim; ++c) {
    s[c % 8] = std::fma(q[c], channel_min(slab, t, head_dim, c), s[c % 8]);
  }
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

// Quantises kChannelTokens keys of one head (f16, row t at keys + t * head_dim) into slab,
// channel by channel: the minimum rounded down to f16, the step the smallest code whose
// max_code steps reach the maximum, each code the nearest step (ties to even).
void quantize_channel_keys(DType t, const uint16_t* keys, size_t head_dim, uint8_t* slab);

}  // namespace kvc::kernels
