// A channel's 32 codes of keys grouped per channel (base/channel_keys.h) as two vectors of
// sixteen bytes, tokens 0..15 and 16..31 (internal to base/; included by the AVX2 and AVX-512
// attention loops inside their target pragma and anonymous namespace).
#pragma once

// q4_0: sixteen bytes, token t in the low nibble of byte t and token t + 16 in the high one.
inline void channel_code_halves(const uint8_t* codes, bool four, __m128i& low, __m128i& high) {
  if (four) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes));
    const __m128i mask = _mm_set1_epi8(0x0f);
    low = _mm_and_si128(bytes, mask);
    high = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
  } else {
    low = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes));
    high = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16));
  }
}
