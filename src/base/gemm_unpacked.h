// The GEMM tiles for the K-quants' super-blocks (q2_K..q6_K) against q8_K activations, written
// once over 256-bit vectors for every x86 instruction set (internal to base/): KQuantTile256
// (AVX2's), the super-blocks' integer scales that AVX-512's tile shares, and the vector
// unpacking of q2_K and q3_K (and q5_0's fifth bits, which AVX2's integer tiles take too).
//
// Included by each gemm_*.cc after its target pragma, inside an anonymous namespace, after
// simd_reduce.h, gemm_tiles.h and quant_unpack.h, and after the file's own
// store_q_pair(q, lo, hi): 64 unpacked bytes stored as the file's tiles load them (one
// store per load, so that each load takes its bytes straight from the store).
// It includes nothing itself.
#pragma once

// U::unpack's bytes, scales and offsets. q2_K and q3_K take vector instructions here: their
// scalar unpacking (a shift, a mask and an or per element, scales through a software f16
// conversion) cost 5-30 times a block's products (one thread, rows of 768 against one
// activation row: q2_K and q3_K 2.4 GB/s of weights).
template <class U, class Out>
inline void unpack_block(const U*, const typename U::Block& b, Out& out) {
  U::unpack(b, out);
}

// Byte e of the result is 16 where bit e % 8 of byte e of spread is set, else 0.
inline __m256i sixteen_where_bit_set(__m256i spread) {
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                          _mm256_set1_epi8(0x10));
}

// Byte e of the result is 16 where bit e of qh's little-endian 32 bits is set, else 0.
inline __m256i unpack_fifth_bits(const uint8_t* qh) {
  const __m256i bits = _mm256_set1_epi32(static_cast<int>(load_u32_le(qh)));
  // Each 128-bit lane holds the four bytes at 0-3: elements 0-15 read bytes 0-1, 16-31 bytes 2-3.
  const __m256i spread =
      _mm256_shuffle_epi8(bits, _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2,
                                                 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  return sixteen_where_bit_set(spread);
}

// Bits 2j and 2j + 1 of each byte of v (j < 4; 16-bit shifts keep them in their byte).
inline __m256i two_bits(__m256i v, int j) {
  return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * j)), _mm256_set1_epi8(3));
}

// 4 where bit k of a byte of v is set, else 0 (q3_K's third bit, from its hmask).
inline __m256i third_bit(__m256i v, int k) {
  const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << k));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(4));
}

inline void unpack_block(const UnpackQ2_K*, const BlockQ2_K& b, UnpackedK& out) {
  // Element 128 h + 32 j + l is bits 2j of qs[32 h + l].
  for (int h = 0; h < 2; ++h) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * h));
    for (int j = 0; j < 4; j += 2) {
      store_q_pair(out.q + 128 * h + 32 * j, two_bits(v, j), two_bits(v, j + 1));
    }
  }
  const __m256i scales =
      _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
  _mm256_store_si256(reinterpret_cast<__m256i*>(out.scale),
                     _mm256_and_si256(scales, _mm256_set1_epi16(0x0f)));
  _mm256_store_si256(reinterpret_cast<__m256i*>(out.offset), _mm256_srli_epi16(scales, 4));
  out.d = half(b.d);
  out.offset_unit = -half(b.dmin);
}

inline void unpack_block(const UnpackQ3_K*, const BlockQ3_K& b, UnpackedK& out) {
  // q2_K's two bits, and the third (worth 4) of element 128 h + 32 j + l in bit 4 h + j of
  // hmask[l].
  const __m256i hmask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.hmask));
  for (int h = 0; h < 2; ++h) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * h));
    for (int j = 0; j < 4; j += 2) {
      store_q_pair(out.q + 128 * h + 32 * j,
                   _mm256_or_si256(two_bits(v, j), third_bit(hmask, 4 * h + j)),
                   _mm256_or_si256(two_bits(v, j + 1), third_bit(hmask, 4 * h + j + 1)));
    }
  }
  // k3_scale for k = 0..15 at once: the low four bits are the nibbles of bytes 0-7 (low
  // nibbles for k < 8), the top two bits 2 (k / 4) of byte 8 + k % 4.
  uint64_t nibbles;
  __builtin_memcpy(&nibbles, b.scales, 8);
  const uint32_t tops = load_u32_le(b.scales + 8);
  constexpr uint64_t kLow4 = 0x0f0f0f0f0f0f0f0full;
  constexpr uint32_t kLow2 = 0x03030303u;
  const __m128i low = _mm_set_epi64x(static_cast<int64_t>((nibbles >> 4) & kLow4),
                                     static_cast<int64_t>(nibbles & kLow4));
  const __m128i high =
      _mm_set_epi32(static_cast<int>((tops >> 6) & kLow2), static_cast<int>((tops >> 4) & kLow2),
                    static_cast<int>((tops >> 2) & kLow2), static_cast<int>(tops & kLow2));
  const __m256i scale = _mm256_sub_epi16(
      _mm256_cvtepu8_epi16(_mm_or_si128(low, _mm_slli_epi16(high, 4))), _mm256_set1_epi16(32));
  _mm256_store_si256(reinterpret_cast<__m256i*>(out.scale), scale);
  _mm256_store_si256(reinterpret_cast<__m256i*>(out.offset),
                     _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(scale, 2)));
  out.d = out.offset_unit = half(b.d);
}

// A K super-block's 16 integer scales and 16 integer offsets (one per 16 elements) in 16-bit
// lanes, with their two float units: element e = (d * scale[e / 16]) * q[e] + unit *
// offset[e / 16], as UnpackedK.
struct KScales {
  __m256i scale, offset;
  float d, unit;
};

// UnpackedK's scales and offsets as KScales.
inline KScales k_scales(const UnpackedK& up) {
  return {_mm256_load_si256(reinterpret_cast<const __m256i*>(up.scale)),
          _mm256_load_si256(reinterpret_cast<const __m256i*>(up.offset)), up.d, up.offset_unit};
}

// The most used K types unpacked in registers for the K-quant tiles: one group's 32 unsigned
// values (AVX2; AVX-512 takes pairs of groups its own way), and the super-block's KScales,
// with no trip through memory. Other types take quant_unpack.h's form.
template <class U>
struct Direct256 {
  static constexpr bool kAvailable = false;
};

// q4_K and q5_K's scales and minima, unpacked from the block's first 16 bytes (d, dmin and the
// 12 packed bytes) in one register, with no scalar work: the eight 6-bit scales in bytes 0-7 and
// the eight minima in 8-15, then each twice as 16-bit lanes (q4_K's sub-blocks of 32 cover two
// of 16). (Against the scalar form, k4_scale_words' and two f16 conversions: one row of q4_K
// from the cache 28 -> 30 GB/s on AVX-512.)
template <class B>
inline KScales k4_scales(const B& b) {
  static_assert(offsetof(B, d) == 0 && offsetof(B, dmin) == 2 && offsetof(B, scales) == 4);
  const __m128i head = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&b));
  // Packed byte k is head byte 4 + k. Scale j < 4 is byte j & 63, minimum j < 4 byte j + 4 & 63;
  // for j >= 4 the low four bits come from byte j + 4 (its low nibble for the scale, high for
  // the minimum) and bits 4-5 from the top two bits of byte j - 4 (scale) or j (minimum).
  const __m128i low_bytes = _mm_shuffle_epi8(
      head, _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
  const __m128i top_bytes = _mm_shuffle_epi8(
      head, _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
  const __m128i low = _mm_or_si128(
      _mm_and_si128(low_bytes,
                    _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0)),
      _mm_and_si128(_mm_srli_epi16(low_bytes, 4),
                    _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15)));
  const __m128i both =
      _mm_or_si128(low, _mm_and_si128(_mm_srli_epi16(top_bytes, 2), _mm_set1_epi8(0x30)));
  const __m128i scales_twice =
      _mm_shuffle_epi8(both, _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7));
  const __m128i minima_twice = _mm_shuffle_epi8(
      both, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15));
  const __m128 d_dmin = _mm_cvtph_ps(head);
  return {_mm256_cvtepu8_epi16(scales_twice), _mm256_cvtepu8_epi16(minima_twice),
          _mm_cvtss_f32(d_dmin), -_mm_cvtss_f32(_mm_movehdup_ps(d_dmin))};
}

// Group g of q4_K or q5_K: the low (even g) or high (odd g) nibbles of qs[32 (g / 2)..].
inline __m256i k4_nibbles(const uint8_t* qs, int g) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * (g / 2)));
  const __m256i shifted = g % 2 == 0 ? x : _mm256_srli_epi16(x, 4);
  return _mm256_and_si256(shifted, _mm256_set1_epi8(0x0f));
}

template <>
struct Direct256<UnpackQ4_K> {
  static constexpr bool kAvailable = true;
  static __m256i group(const BlockQ4_K& b, int g) { return k4_nibbles(b.qs, g); }
  static KScales scales(const BlockQ4_K& b) { return k4_scales(b); }
};

// v's bytes with each one's bit `bit` moved to bit 4 (and the next to bit 5), other bits as they
// fall: one 16-bit shift, as no bit that lands on 4 or 5 crosses a byte.
inline __m256i bit_to_four(__m256i v, int bit) {
  return bit <= 4 ? _mm256_slli_epi16(v, 4 - bit) : _mm256_srli_epi16(v, bit - 4);
}

template <>
struct Direct256<UnpackQ5_K> {
  static constexpr bool kAvailable = true;
  // q4_K's nibbles plus bit g of qh[l] as bit 4.
  static __m256i group(const BlockQ5_K& b, int g) {
    const __m256i top = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh));
    return _mm256_or_si256(k4_nibbles(b.qs, g),
                           _mm256_and_si256(bit_to_four(top, g), _mm256_set1_epi8(0x10)));
  }
  static KScales scales(const BlockQ5_K& b) { return k4_scales(b); }
};

template <>
struct Direct256<UnpackQ6_K> {
  static constexpr bool kAvailable = true;
  // Group g is quarter g % 4 of half g / 4: low nibbles (high ones from quarter 2) of one of
  // ql's two 32-byte rows, top two bits from qh.
  static __m256i group(const BlockQ6_K& b, int g) {
    const int h = g / 4, q = g % 4;
    const __m256i low =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h + 32 * (q % 2)));
    const __m256i top = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h));
    const __m256i nibble =
        _mm256_and_si256(q < 2 ? low : _mm256_srli_epi16(low, 4), _mm256_set1_epi8(0x0f));
    return _mm256_or_si256(nibble,
                           _mm256_and_si256(bit_to_four(top, 2 * q), _mm256_set1_epi8(0x30)));
  }
  // The values are stored plus 32: each sub-block's offset is -32 times its scale, in units of
  // d (UnpackQ6_K's form).
  static KScales scales(const BlockQ6_K& b) {
    const __m256i sc =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
    const float d = half(b.d);
    return {sc, _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc, 5)), d, d};
  }
};

// A weight super-block's KScales and its unpacked form where the type has no direct one.
template <class U>
inline KScales super_block_scales(const typename U::Block& block, UnpackedK& up) {
  if constexpr (Direct256<U>::kAvailable) {
    return Direct256<U>::scales(block);
  } else {
    unpack_block(static_cast<const U*>(nullptr), block, up);
    return k_scales(up);
  }
}

// The int32 sums offset[2i] * sums[2i] + offset[2i + 1] * sums[2i + 1] of a super-block's
// offsets against a q8_K block's 16 sums, lane i < 8.
inline __m256i offset_sums(const KScales& k, const BlockQ8_K& x) {
  return _mm256_madd_epi16(k.offset, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.bsums)));
}

// K-quant weights (256-element super-blocks) against q8_K activations over 256-bit vectors:
// per super-block and output, each group of 32 takes maddubs(q, x) (pairs of products; q < 64
// keeps them below 2^15) and then madd with the sub-blocks' integer scales, lane l summing
// elements 32g + 4l..32g + 4l + 3 of every group g into the exact int32 S_l; the offsets against
// the activations' 16 sums give the exact O_l (offset_sums). The super-block's partial
// (d dx) S_l + (unit dx) O_l (one product, one fused multiply-add), or (d dx) (S_l + O_l) where
// the offsets are in units of d (q3_K, q6_K), joins the output's sum, so the chain carried from
// one super-block to the next is one addition. The same operations for every output whatever
// the tile's shape.
template <class U, int Rows, int Cols>
struct KQuantTile256 : StreamedColumns<KQuantTile256<U, Rows, Cols>> {
  static_assert(U::kUnit == 256);
  static constexpr int kRows = Rows;
  static constexpr int kCols = Cols;
  using Block = typename U::Block;
  using XRow = BlockQ8_K;

  // The tile's sums, each super-block of the first weight row requested ahead through stream
  // (empty but in decode).
  template <int MR, int NR>
  static void columns(const uint8_t* w, size_t ws, const BlockQ8_K* const (&b)[MR], size_t n,
                      float* y, size_t ys, const RowStream& stream) {
    __m256 acc[MR][NR];
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) acc[r][j] = _mm256_setzero_ps();
    for (size_t s = 0; s < n / 256; ++s) {
      stream.request_bytes(w + s * sizeof(Block), sizeof(Block));
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) {
        const Block& block = reinterpret_cast<const Block*>(w + j * ws)[s];
        UnpackedK up;
        const KScales k = super_block_scales<U>(block, up);
        // Groups 0-3 find their scales in sub-blocks 0-7, groups 4-7 in 8-15.
        const __m256i low = _mm256_permute2x128_si256(k.scale, k.scale, 0x00);
        const __m256i high = _mm256_permute2x128_si256(k.scale, k.scale, 0x11);
        __m256i sum[MR];
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) {
          // Lanes 0-7 of group g's pairs take sub-block 2g's scale, lanes 8-15 sub-block 2g + 1's.
          const char lo = static_cast<char>(4 * (g % 4)), hi = static_cast<char>(4 * (g % 4) + 2);
          const __m256i wscale = _mm256_shuffle_epi8(
              g < 4 ? low : high,
              _mm256_setr_epi8(lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo,
                               lo + 1, lo, lo + 1, lo, lo + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1,
                               hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1));
          __m256i wq;
          if constexpr (Direct256<U>::kAvailable) {
            wq = Direct256<U>::group(block, g);
          } else {
            wq = _mm256_load_si256(reinterpret_cast<const __m256i*>(up.q + 32 * g));
          }
#pragma GCC unroll 8
          for (int r = 0; r < MR; ++r) {
            const __m256i xv =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[r][s].qs + 32 * g));
            const __m256i scaled = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, xv), wscale);
            sum[r] = g == 0 ? scaled : _mm256_add_epi32(sum[r], scaled);
          }
        }
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          const float dx = b[r][s].d;
          __m256 part;
          if constexpr (U::kOffsetsInScaleUnits) {
            part =
                _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(sum[r], offset_sums(k, b[r][s]))),
                              _mm256_set1_ps(k.d * dx));
          } else {
            part = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(offset_sums(k, b[r][s])), _mm256_set1_ps(k.unit * dx),
                _mm256_mul_ps(_mm256_cvtepi32_ps(sum[r]), _mm256_set1_ps(k.d * dx)));
          }
          acc[r][j] = _mm256_add_ps(acc[r][j], part);
        }
      }
    }
    store_sums<MR, NR>(acc, y, ys);
  }
};
