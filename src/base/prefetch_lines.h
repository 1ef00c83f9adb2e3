// Software prefetch of a byte range (internal to base/): for rows that a later call will read
// where the hardware prefetchers cannot foresee it (the next blocks of a paged KV cache lie
// anywhere in the pool), or stay too little ahead of (decode's stream of weight rows).
#pragma once

#include <cstddef>

namespace kvc::kernels {

// How far ahead of a stream of weight rows read once each (decode) their bytes are requested
// into the second-level cache. On Intel's server cores the hardware prefetchers stay too little
// ahead of one such stream (Xeon with AVX-512 and AMX, TinyLlama q8_0 decode on 2 threads: 16.0
// t/s without requests, 22.0 with them 4 KiB ahead, 21.1 at 8 KiB, 21.8-22.8 at 2 KiB; but at
// 2 KiB the 110M shape, read from the third-level cache, fell from 265 to 189). With every
// type's requests spread, 3 KiB against 4 KiB, alternated: TinyLlama q4_K 33.6-36.1 vs
// 31.9-33.3 and q8_0 21.5-21.9 vs 20.7-21.0, but 110M q8_0 tg128 190-212 vs 216-231 (and 0.90x
// of llama.cpp against 1.00x), so 4 KiB stays; at 1 KiB TinyLlama q4_0 fell to 33. An earlier
// session found such requests no gain on Zen 4, but GCC may have deleted the ones it measured
// (below): that machine is not measured again here.
constexpr size_t kRowStreamAheadBytes = 4 * 1024;

// Requests the cache line holding *p. A request into the second level is written out on
// x86-64: GCC 12's dead code elimination deleted decode's row-stream requests (a loop of
// __builtin_prefetch whose bounds come from the caller's arithmetic), silently. First-level
// requests keep the builtin: the attention kernels' requests survive it, and written out they
// made prefill at depth 4096 12% slower (110M q8_0, 2 threads, Xeon with AVX-512).
template <int kLocality>
inline void prefetch_line(const char* p) {
#if defined(__x86_64__)
  if constexpr (kLocality == 2) {
    asm volatile("prefetcht1 %0" : : "m"(*p));
    return;
  }
#endif
  __builtin_prefetch(p, 0, kLocality);
}

// Requests the cache lines holding bytes [begin, end) of base; nothing when base is null.
// kLocality as __builtin_prefetch takes it: 3 into every level, 2 into the second-level cache
// (prefetcht1 on x86), for more bytes than the first level holds.
template <int kLocality = 3>
inline void prefetch_lines(const void* base, size_t begin, size_t end) {
  if (base == nullptr) return;
  const auto* p = static_cast<const char*>(base);
  for (size_t at = begin & ~size_t{63}; at < end; at += 64) prefetch_line<kLocality>(p + at);
}

}  // namespace kvc::kernels
