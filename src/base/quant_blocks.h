// GGML's quantized weight blocks beyond q8_0/q4_0, byte for byte as GGUF stores them, with the
// value each element stands for. f16 fields are IEEE binary16; all integers are little-endian.
#pragma once

#include <cstdint>

namespace kvc {

// Elements per K-quant super-block.
constexpr int kSuperBlock = 256;

// q4_1: value = d * q + m, q in 0..15; byte j holds element j (low nibble) and j + 16 (high).
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_1) == 20);

// q5_0: value = d * (q - 16), q in 0..31: the low four bits as q4_0's, bit 4 of element j in bit
// j of qh (a little-endian uint32).
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_0) == 22);

// q5_1: value = d * q + m with q5_0's bit layout.
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_1) == 24);

// q2_K: 16 sub-blocks of 16; value = d * (scales[k] & 15) * q - dmin * (scales[k] >> 4), q in
// 0..3. Element e = 128 h + 32 j + l takes bits 2j..2j+1 of qs[32 h + l].
struct BlockQ2_K {
  uint8_t scales[16];
  uint8_t qs[64];
  uint16_t d;
  uint16_t dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

// q3_K: 16 sub-blocks of 16; value = d * (s_k - 32) * (q - 4) with 6-bit s_k packed in scales
// (low nibbles in bytes 0..7, high two bits in bytes 8..11) and q = low two bits (qs, laid out
// as q2_K) + 4 * high bit (bit 4h + j of hmask[l]).
struct BlockQ3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);

// q4_K: 8 sub-blocks of 32; value = d * sc_j * q - dmin * m_j, q in 0..15, with 6-bit sc_j and
// m_j packed in scales. Element e = 64 c + l (l < 32) is the low nibble of qs[32 c + l], and
// e = 64 c + 32 + l its high nibble.
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
static_assert(sizeof(BlockQ4_K) == 144);

// q5_K: q4_K with a fifth bit: bit j of qh[l] for element 32 j + l.
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
static_assert(sizeof(BlockQ5_K) == 176);

// q6_K: 16 sub-blocks of 16; value = d * scales[k] * (q - 32), q in 0..63. Element
// e = 128 h + 32 p + l: low four bits from ql[64 h + 32 (p & 1) + l] (high nibble when p >= 2),
// top two bits from bits 2p..2p+1 of qh[32 h + l].
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

}  // namespace kvc
