// Sixteen f16 scales gathered into floats (internal to base/): the q8_0 kernels' per-block
// scales, from a row's blocks or from sixteen rows' same block.
//
// Included by gemm_avx512.cc and gemm_amx.cc after their AVX-512 target pragmas, inside their
// namespaces, as gemm_tiles.h is; it includes nothing itself.
#pragma once

// The f16 values at first, first + stride, ... (count <= 16 of them, stride bytes apart) as
// floats; lanes from count on are zero. Reads four bytes at each: the scale and the two bytes
// after it (a q8_0 block's first values), dropped.
inline __m512 gather_scales(const void* first, size_t stride, size_t count) {
  const __m512i offsets =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32(static_cast<int>(stride)));
  const auto present = static_cast<__mmask16>((1u << count) - 1);
  const __m512i words =
      _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), present, offsets, first, 1);
  return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words));
}
