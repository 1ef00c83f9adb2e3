#include "base/channel_keys.h"

#include <algorithm>
#include <cmath>

namespace kvc::kernels {

namespace {

// The largest f16 not above x (x finite).
uint16_t f16_at_most(float x) {
  uint16_t h = f32_to_f16(x);
  if (f16_to_f32(h) <= x) return h;
  // One step toward -infinity: down in magnitude for positives, up for negatives (and -0).
  if (h == 0x0000) return 0x8001;
  return (h & 0x8000) != 0 ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h - 1);
}

}  // namespace

uint8_t channel_step_code_at_least(float s) {
  if (!(s > 0.0f)) return 0;
  // Codes rise with their steps (code 1 is the smallest non-zero step): the first at least s.
  int lo = 1, hi = 255;
  if (channel_step(255) < s) return 255;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (channel_step(static_cast<uint8_t>(mid)) >= s) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return static_cast<uint8_t>(lo);
}

void quantize_channel_keys(DType t, const uint16_t* keys, size_t head_dim, uint8_t* slab) {
  const size_t code_bytes = channel_code_bytes(t);
  const int max_code = channel_max_code(t);
  uint8_t* mins = slab + head_dim * code_bytes;
  uint8_t* steps = mins + 2 * head_dim;
  for (size_t c = 0; c < head_dim; ++c) {
    float values[kChannelTokens];
    float lo = INFINITY, hi = -INFINITY;
    for (int tok = 0; tok < kChannelTokens; ++tok) {
      values[tok] = f16_to_f32(keys[static_cast<size_t>(tok) * head_dim + c]);
      lo = std::min(lo, values[tok]);
      hi = std::max(hi, values[tok]);
    }
    const uint16_t min_bits = f16_at_most(lo);
    const float min = f16_to_f32(min_bits);
    std::memcpy(mins + 2 * c, &min_bits, sizeof min_bits);
    uint8_t step_code = channel_step_code_at_least((hi - min) / static_cast<float>(max_code));
    // The rounded division may leave the top value one code short: take the next step up.
    while (step_code != 0 && step_code < 255 &&
           min + channel_step(step_code) * static_cast<float>(max_code) < hi) {
      ++step_code;
    }
    steps[c] = step_code;
    const float step = channel_step(step_code);
    uint8_t* codes = slab + c * code_bytes;
    if (t == DType::Q4_0) std::memset(codes, 0, code_bytes);
    for (int tok = 0; tok < kChannelTokens; ++tok) {
      float q = step > 0.0f ? std::nearbyint((values[tok] - min) / step) : 0.0f;
      if (!(q >= 0.0f)) q = 0.0f;  // NaN keys
      const int code = static_cast<int>(std::clamp(q, 0.0f, static_cast<float>(max_code)));
      if (t != DType::Q4_0) {
        codes[tok] = static_cast<uint8_t>(code);
      } else if (tok < kChannelTokens / 2) {
        codes[tok] |= static_cast<uint8_t>(code);
      } else {
        codes[tok - kChannelTokens / 2] |= static_cast<uint8_t>(code << 4);
      }
    }
  }
}

}  // namespace kvc::kernels
