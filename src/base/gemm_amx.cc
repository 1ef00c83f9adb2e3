// The q8_0 GEMM on AMX tiles. A tile multiply sums each block's 32 products whole (tdpbssd:
// signed by signed bytes, exact int32), 16 weight rows by 16 activation rows at a time; the
// blocks' sums then meet in float exactly as in the AVX-512 kernels (gemm_avx512.cc's Q8Tile):
// lane b % 16 of each output takes fma(d_w * d_x, I_b, lane) in increasing b, and the 16
// lanes are summed as hsum512. So a row's logits keep their bits whether AMX, the AVX-512
// tiles or decode's narrow column computed them.
#include "base/gemm_amx.h"

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "base/dtype.h"
#include "base/gemm_table.h"
#include "base/kernels.h"
#include "base/prefetch_lines.h"

namespace kvc::kernels {
namespace {

// Linux's request for the tile data state (arch/x86/include/uapi/asm/prctl.h).
constexpr int kArchRequestXcompPermission = 0x1023;
constexpr int kXfeatureTileData = 18;

bool cpu_has_amx_int8() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  const bool tile = (edx >> 24) & 1;
  const bool int8 = (edx >> 25) & 1;
  return tile && int8;
}

bool request_tile_state() {
  return syscall(SYS_arch_prctl, kArchRequestXcompPermission, kXfeatureTileData) == 0;
}

// Tiles: 0 and 3 the int32 sums (16 x 16), 1 and 4 sixteen weight rows' block (16 x 32 bytes),
// 2 and 5 sixteen activation rows' block in the four-byte interleave tdpbssd reads (8 x 64).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {64, 32, 64, 64, 32, 64};
  uint8_t rows[16] = {16, 16, 8, 16, 16, 8};
};

constexpr size_t kBlockBytes = sizeof(BlockQ8_0);
constexpr size_t kInterleavedBlockBytes = 16 * 32;  // one activation tile: 16 rows' block

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

#include "base/gather_scales_avx512.h"

void configure_tiles() {
  thread_local bool configured = false;
  if (configured) return;
  static const TileConfig config;
  _tile_loadconfig(&config);
  configured = true;
}

// Each group of 16 activation rows as tdpbssd's second operand, block after block (dword k of
// row r's block at 64 k + 4 r), and then the group's scales as floats, block after block (16
// each). Returns the first group; each takes group_bytes.
const uint8_t* interleave_rows(const uint8_t* x, size_t x_stride, size_t n_x, size_t blocks,
                               size_t* group_bytes) {
  *group_bytes = blocks * (kInterleavedBlockBytes + 16 * sizeof(float));
  uint8_t* out = gemm_scratch(*group_bytes * (n_x / 16));
  for (size_t g = 0; g < n_x / 16; ++g) {
    uint8_t* values = out + g * *group_bytes;
    auto* scales = reinterpret_cast<float*>(values + blocks * kInterleavedBlockBytes);
    for (size_t r = 0; r < 16; ++r) {
      const auto* row = reinterpret_cast<const BlockQ8_0*>(x + (16 * g + r) * x_stride);
      for (size_t b = 0; b < blocks; ++b) {
        uint8_t* tile = values + b * kInterleavedBlockBytes + 4 * r;
        for (size_t k = 0; k < 8; ++k) std::memcpy(tile + 64 * k, row[b].qs + 4 * k, 4);
        scales[16 * b + r] = _cvtsh_ss(row[b].d);
      }
    }
  }
  return out;
}

// lane[m] = fma(d_w[m] * d_x, I[m], lane[m]) for the 16 weight rows m of one block, I the
// tile's int32 sums stored at `sums` (row m: the 16 activation rows).
inline void add_block(const int32_t (&sums)[16][16], const float* dw, __m512 dx,
                      __m512 (&lane)[16]) {
#pragma GCC unroll 16
  for (int m = 0; m < 16; ++m) {
    const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(dw[m]), dx);
    const __m512 products = _mm512_cvtepi32_ps(_mm512_load_si512(sums[m]));
    lane[m] = _mm512_fmadd_ps(scale, products, lane[m]);
  }
}

// Where block b's weight tile lies: 16 rows of 32 bytes from first + b * block_bytes, stride
// bytes apart (repacked: 512 and 32; in place in the q8_0 rows: 34 and the row stride).
struct WeightTiles {
  const uint8_t* first;
  size_t block_bytes;
  size_t stride;
};

// Loads block b's weight tile (where `weights` says) and activation tile into tiles A and B
// and multiplies them into the cleared tile C.
#define KVC_AMX_BLOCK_PRODUCT(C, A, B, weights, xg, b)                               \
  do {                                                                               \
    _tile_loadd(A, (weights).first + (b) * (weights).block_bytes, (weights).stride); \
    _tile_loadd(B, (xg) + (b)*kInterleavedBlockBytes, 64);                           \
    _tile_zero(C);                                                                   \
    _tile_dpbssd(C, A, B);                                                           \
  } while (0)

// One group of 16 weight rows (their tiles where `weights` says, their scales as floats in dw,
// 16 per block) against one group of 16 activation rows: lanes[l][m] = row m's lane l (16
// activation rows' values). Blocks go lane by lane (l, l + 16, ... for each l), one product
// ahead in a second set of tiles, so that each multiply runs while the previous block's sums
// are scaled. `ahead` (ahead_bytes of it, or null) is requested into the second-level cache a
// slice per block: the weight rows the following group will read, so that with a single
// activation group (batched decode) memory is read while the tiles multiply.
void tile_lanes(const WeightTiles& weights, const float* dw, const uint8_t* xg, size_t blocks,
                const uint8_t* ahead, size_t ahead_bytes, __m512 (&lanes)[16][16]) {
  const auto* dx = reinterpret_cast<const float*>(xg + blocks * kInterleavedBlockBytes);
  alignas(64) int32_t sums[16][16];
  // The order of blocks: lane 0's, then lane 1's, ...
  const size_t lanes_used = blocks < 16 ? blocks : 16;
  size_t lane = 0, block = 0;  // the block whose product is in flight, and its lane
  __m512 acc[16];
  for (__m512& v : acc) v = _mm512_setzero_ps();
  const auto next_block = [&](size_t& l, size_t& b) {
    b += 16;
    if (b >= blocks) b = ++l;
  };
  KVC_AMX_BLOCK_PRODUCT(0, 1, 2, weights, xg, block);
  bool in_first = true;
  while (lane < lanes_used) {
    size_t next_lane = lane, next = block;
    next_block(next_lane, next);
    const bool more = next_lane < lanes_used;
    if (in_first) {
      if (more) KVC_AMX_BLOCK_PRODUCT(3, 4, 5, weights, xg, next);
      _tile_stored(0, sums, 64);
    } else {
      if (more) KVC_AMX_BLOCK_PRODUCT(0, 1, 2, weights, xg, next);
      _tile_stored(3, sums, 64);
    }
    add_block(sums, dw + 16 * block, _mm512_loadu_ps(dx + 16 * block), acc);
    prefetch_lines<2>(ahead, ahead_bytes * block / blocks, ahead_bytes * (block + 1) / blocks);
    if (next_lane != lane) {
      for (int m = 0; m < 16; ++m) {
        lanes[lane][m] = acc[m];
        acc[m] = _mm512_setzero_ps();
      }
    }
    lane = next_lane;
    block = next;
    in_first = !in_first;
  }
  for (size_t l = lanes_used; l < 16; ++l) {
    for (int m = 0; m < 16; ++m) lanes[l][m] = _mm512_setzero_ps();
  }
}

#undef KVC_AMX_BLOCK_PRODUCT

#pragma GCC pop_options

}  // namespace

bool amx_available() {
  static const bool available = cpu_has_amx_int8() && request_tile_state();
  return available;
}

namespace {

std::atomic<bool>& amx_switch() {
  static std::atomic<bool> on = [] {
    const char* setting = std::getenv("KVCACHE_AMX");
    return setting == nullptr || std::strcmp(setting, "0") != 0;
  }();
  return on;
}

}  // namespace

bool amx_enabled() {
  return amx_switch().load(std::memory_order_relaxed) && amx_available();
}

void set_amx(bool enabled) {
  amx_switch().store(enabled, std::memory_order_relaxed);
}

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

void gemm_q8_0_amx(const void* w, size_t w_stride, size_t n_w, const void* x, size_t x_stride,
                   size_t n_x, size_t n, float* y, size_t y_stride) {
  configure_tiles();
  const size_t blocks = n / 32;
  const auto* wb = static_cast<const uint8_t*>(w);
  size_t group_bytes = 0;
  const uint8_t* xg =
      interleave_rows(static_cast<const uint8_t*>(x), x_stride, n_x, blocks, &group_bytes);
  // The 16 weight rows of a group, repacked block after block (16 rows of 32 bytes: one tile
  // from one contiguous 512 bytes), then their scales as floats (16 per block).
  uint8_t* repacked = gemm_weight_scratch(blocks * (kInterleavedBlockBytes + 16 * sizeof(float)));
  auto* dw = reinterpret_cast<float*>(repacked + blocks * kInterleavedBlockBytes);
  __m512 lanes[16][16];
  const size_t w_bytes = n_w * w_stride;
  const size_t groups = n_x / 16;
  for (size_t c0 = 0; c0 < n_w; c0 += 16) {
    const uint8_t* rows = wb + c0 * w_stride;
    WeightTiles tiles = {repacked, kInterleavedBlockBytes, 32};
    if (groups == 1) {
      // One activation group (batched decode): the tiles read the rows in place, and only the
      // scales are gathered, 16 rows' at a time.
      tiles = {rows + 2, kBlockBytes, w_stride};
      for (size_t b = 0; b < blocks; ++b) {
        _mm512_storeu_ps(dw + 16 * b, gather_scales(rows + b * kBlockBytes, w_stride, 16));
      }
    } else {
      // Several groups read each tile: repacked once, from the second-level cache (the previous
      // group's first tile_lanes requested these rows).
      for (size_t m = 0; m < 16; ++m) {
        const auto* row = reinterpret_cast<const BlockQ8_0*>(rows + m * w_stride);
        for (size_t b = 0; b < blocks; ++b) {
          std::memcpy(repacked + b * kInterleavedBlockBytes + 32 * m, row[b].qs, 32);
          dw[16 * b + m] = _cvtsh_ss(row[b].d);
        }
      }
    }
    const size_t next_begin = (c0 + 16) * w_stride;
    const size_t next_end =
        next_begin + 16 * w_stride < w_bytes ? next_begin + 16 * w_stride : w_bytes;
    for (size_t g = 0; g < groups; ++g) {
      const bool requests = g == 0 && next_begin < w_bytes;
      tile_lanes(tiles, dw, xg + g * group_bytes, blocks, requests ? wb + next_begin : nullptr,
                 requests ? next_end - next_begin : 0, lanes);
      // hsum512's additions, lane by lane across the 16 x 16 outputs: fold 8, 4, 2, 1.
      for (int width = 16; width > 1; width /= 2) {
        for (int l = 0; l < width / 2; ++l) {
          for (int m = 0; m < 16; ++m) {
            lanes[l][m] = _mm512_add_ps(lanes[l][m], lanes[l + width / 2][m]);
          }
        }
      }
      alignas(64) float out[16][16];
      for (int m = 0; m < 16; ++m) _mm512_store_ps(out[m], lanes[0][m]);
      for (size_t r = 0; r < 16; ++r) {
        float* y_row = y + (16 * g + r) * y_stride + c0;
        for (size_t m = 0; m < 16; ++m) y_row[m] = out[m][r];
      }
    }
  }
}

#pragma GCC pop_options

}  // namespace kvc::kernels
