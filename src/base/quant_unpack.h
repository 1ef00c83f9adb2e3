// The form the integer kernels read GGML's weight blocks in: every block type of quant_blocks.h
// unpacked to unsigned integers with one scale and one offset per 16 elements, so that
// element e = scale[e / 16] * q[e] + offset[e / 16] (up to rounding), the offset carrying the
// block minimum or the bias of a signed format.
//
// Included by the scalar reference and by each instruction set's GEMM after its target pragma,
// inside an anonymous namespace, so that every file compiles its own copy for its own
// instructions. It includes nothing itself (see gemm_tiles.h); base/dtype.h and
// base/quant_blocks.h come first. Every q fits in six bits, so unsigned x signed byte products
// summed in pairs never saturate 16 bits.
#pragma once

template <int U>
struct Unpacked {
  alignas(64) uint8_t q[U];
  float scale[U / 16];
  float offset[U / 16];
};

// A K super-block with its scales still integers, for kernels that convert them 16 at a time:
// element e = (d * scale[e / 16]) * q[e] + offset_unit * offset[e / 16]. Where the unpacker's
// kOffsetsInScaleUnits is true, offset_unit is d itself (the offsets carry the bias of a signed
// format), so a super-block's offsets and scaled products sum together in integers. Each format's
// offset is an integer times one f16 unit (times a power of two), so this is one rounding, as in
// the Unpacked<256> form. (q4_K, q5_K and q6_K are also unpacked straight into registers by the
// GEMM files, for speed; the values are the same.)
struct UnpackedK {
  alignas(64) uint8_t q[256];
  alignas(32) int16_t scale[16];
  alignas(32) int16_t offset[16];
  float d, offset_unit;
};

// The Unpacked<256> form of a K super-block (every unpacker's generic entry point).
template <class K>
inline void unpack_k(const typename K::Block& b, Unpacked<256>& out) {
  UnpackedK k;
  K::unpack(b, k);
  for (int e = 0; e < 256; ++e) out.q[e] = k.q[e];
  for (int i = 0; i < 16; ++i) {
    out.scale[i] = k.d * static_cast<float>(k.scale[i]);
    out.offset[i] = k.offset_unit * static_cast<float>(k.offset[i]);
  }
}

inline uint32_t load_u32_le(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

// q3_K's 6-bit scale (0..63, 32 meaning zero) of sub-block k (0..15) from its 12 packed bytes.
inline int k3_scale(const uint8_t* s, int k) {
  const int low = k < 8 ? s[k] & 0x0f : s[k - 8] >> 4;
  const int high = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
  return low | high << 4;
}

template <int U>
inline void set_subblocks(Unpacked<U>& out, float scale, float offset) {
  for (int k = 0; k < U / 16; ++k) {
    out.scale[k] = scale;
    out.offset[k] = offset;
  }
}

struct UnpackQ4_1 {
  using Block = BlockQ4_1;
  static constexpr int kUnit = 32;
  static void unpack(const Block& b, Unpacked<32>& out) {
    for (int j = 0; j < 16; ++j) {
      out.q[j] = b.qs[j] & 0x0f;
      out.q[j + 16] = b.qs[j] >> 4;
    }
    set_subblocks(out, f16_to_f32(b.d), f16_to_f32(b.m));
  }
};

template <class B>
inline void unpack_five_bits(const B& b, Unpacked<32>& out) {
  const uint32_t qh = load_u32_le(b.qh);
  for (int j = 0; j < 16; ++j) {
    out.q[j] = static_cast<uint8_t>((b.qs[j] & 0x0f) | ((qh >> j) & 1) << 4);
    out.q[j + 16] = static_cast<uint8_t>((b.qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
  }
}

struct UnpackQ5_0 {
  using Block = BlockQ5_0;
  static constexpr int kUnit = 32;
  static void unpack(const Block& b, Unpacked<32>& out) {
    unpack_five_bits(b, out);
    const float d = f16_to_f32(b.d);
    set_subblocks(out, d, -16.0f * d);
  }
};

struct UnpackQ5_1 {
  using Block = BlockQ5_1;
  static constexpr int kUnit = 32;
  static void unpack(const Block& b, Unpacked<32>& out) {
    unpack_five_bits(b, out);
    set_subblocks(out, f16_to_f32(b.d), f16_to_f32(b.m));
  }
};

// The two low bits of q2_K and q3_K: element 128 h + 32 j + l from bits 2j of qs[32 h + l].
inline void unpack_two_bits(const uint8_t* qs, uint8_t* q) {
  for (int h = 0; h < 2; ++h) {
    for (int j = 0; j < 4; ++j) {
      for (int l = 0; l < 32; ++l) q[128 * h + 32 * j + l] = (qs[32 * h + l] >> (2 * j)) & 3;
    }
  }
}

struct UnpackQ2_K {
  using Block = BlockQ2_K;
  static constexpr int kUnit = 256;
  static constexpr bool kOffsetsInScaleUnits = false;
  static void unpack(const Block& b, UnpackedK& out) {
    unpack_two_bits(b.qs, out.q);
    for (int k = 0; k < 16; ++k) {
      out.scale[k] = b.scales[k] & 0x0f;
      out.offset[k] = b.scales[k] >> 4;
    }
    out.d = f16_to_f32(b.d);
    out.offset_unit = -f16_to_f32(b.dmin);
  }
  static void unpack(const Block& b, Unpacked<256>& out) { unpack_k<UnpackQ2_K>(b, out); }
};

struct UnpackQ3_K {
  using Block = BlockQ3_K;
  static constexpr int kUnit = 256;
  static constexpr bool kOffsetsInScaleUnits = true;
  static void unpack(const Block& b, UnpackedK& out) {
    unpack_two_bits(b.qs, out.q);
    for (int h = 0; h < 2; ++h) {
      for (int j = 0; j < 4; ++j) {
        for (int l = 0; l < 32; ++l) {
          out.q[128 * h + 32 * j + l] |= ((b.hmask[l] >> (4 * h + j)) & 1) << 2;
        }
      }
    }
    for (int k = 0; k < 16; ++k) {
      out.scale[k] = static_cast<int16_t>(k3_scale(b.scales, k) - 32);
      out.offset[k] = static_cast<int16_t>(-4 * out.scale[k]);
    }
    out.d = out.offset_unit = f16_to_f32(b.d);
  }
  static void unpack(const Block& b, Unpacked<256>& out) { unpack_k<UnpackQ3_K>(b, out); }
};

// q4_K and q5_K's eight 6-bit scales (bytes of scales[0..1]) and minima (bytes of mins[0..1])
// from their 12 packed bytes: bytes 0-3 hold scales 0-3 and bytes 4-7 minima 0-3 in their low
// six bits; scales and minima 4-7 take their low four bits from the nibbles of bytes 8-11 and
// their top two from the spare bits of bytes 0-3 and 4-7. Four values per 32-bit operation.
inline void k4_scale_words(const uint8_t* packed, uint32_t scales[2], uint32_t mins[2]) {
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  const uint32_t a = load_u32_le(packed), m = load_u32_le(packed + 4), h = load_u32_le(packed + 8);
  scales[0] = a & kLow6;
  scales[1] = (h & kLow4) | ((a >> 6) & kLow2) << 4;
  mins[0] = m & kLow6;
  mins[1] = ((h >> 4) & kLow4) | ((m >> 6) & kLow2) << 4;
}

// q4_K and q5_K's scales and minima, each written for both halves of its 32 elements.
template <class B>
inline void k4_subblocks(const B& b, UnpackedK& out) {
  uint32_t scales[2], mins[2];
  k4_scale_words(b.scales, scales, mins);
  for (int j = 0; j < 8; ++j) {
    const auto scale = static_cast<int16_t>((scales[j / 4] >> (8 * (j % 4))) & 0xff);
    const auto min = static_cast<int16_t>((mins[j / 4] >> (8 * (j % 4))) & 0xff);
    out.scale[2 * j] = out.scale[2 * j + 1] = scale;
    out.offset[2 * j] = out.offset[2 * j + 1] = min;
  }
  out.d = f16_to_f32(b.d);
  out.offset_unit = -f16_to_f32(b.dmin);
}

struct UnpackQ4_K {
  using Block = BlockQ4_K;
  static constexpr int kUnit = 256;
  static constexpr bool kOffsetsInScaleUnits = false;
  static void unpack(const Block& b, Unpacked<256>& out) { unpack_k<UnpackQ4_K>(b, out); }
  static void unpack(const Block& b, UnpackedK& out) {
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        out.q[64 * c + l] = b.qs[32 * c + l] & 0x0f;
        out.q[64 * c + 32 + l] = b.qs[32 * c + l] >> 4;
      }
    }
    k4_subblocks(b, out);
  }
};

struct UnpackQ5_K {
  using Block = BlockQ5_K;
  static constexpr int kUnit = 256;
  static constexpr bool kOffsetsInScaleUnits = false;
  static void unpack(const Block& b, Unpacked<256>& out) { unpack_k<UnpackQ5_K>(b, out); }
  static void unpack(const Block& b, UnpackedK& out) {
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        out.q[64 * c + l] =
            static_cast<uint8_t>((b.qs[32 * c + l] & 0x0f) | ((b.qh[l] >> (2 * c)) & 1) << 4);
        out.q[64 * c + 32 + l] =
            static_cast<uint8_t>((b.qs[32 * c + l] >> 4) | ((b.qh[l] >> (2 * c + 1)) & 1) << 4);
      }
    }
    k4_subblocks(b, out);
  }
};

struct UnpackQ6_K {
  using Block = BlockQ6_K;
  static constexpr int kUnit = 256;
  static constexpr bool kOffsetsInScaleUnits = true;
  static void unpack(const Block& b, Unpacked<256>& out) { unpack_k<UnpackQ6_K>(b, out); }
  static void unpack(const Block& b, UnpackedK& out) {
    for (int h = 0; h < 2; ++h) {
      for (int p = 0; p < 4; ++p) {
        for (int l = 0; l < 32; ++l) {
          const int low = (b.ql[64 * h + 32 * (p & 1) + l] >> (4 * (p >> 1))) & 0x0f;
          const int high = (b.qh[32 * h + l] >> (2 * p)) & 3;
          out.q[128 * h + 32 * p + l] = static_cast<uint8_t>(low | high << 4);
        }
      }
    }
    for (int k = 0; k < 16; ++k) {
      out.scale[k] = b.scales[k];
      out.offset[k] = static_cast<int16_t>(-32 * b.scales[k]);
    }
    out.d = out.offset_unit = f16_to_f32(b.d);
  }
};

// Calls f(Unpack{}) with the unpacker of t, one of the types above; false for any other type.
template <class F>
inline bool with_unpacker(DType t, F&& f) {
  switch (t) {
    case DType::Q4_1:
      f(UnpackQ4_1{});
      return true;
    case DType::Q5_0:
      f(UnpackQ5_0{});
      return true;
    case DType::Q5_1:
      f(UnpackQ5_1{});
      return true;
    case DType::Q2_K:
      f(UnpackQ2_K{});
      return true;
    case DType::Q3_K:
      f(UnpackQ3_K{});
      return true;
    case DType::Q4_K:
      f(UnpackQ4_K{});
      return true;
    case DType::Q5_K:
      f(UnpackQ5_K{});
      return true;
    case DType::Q6_K:
      f(UnpackQ6_K{});
      return true;
    default:
      return false;
  }
}
