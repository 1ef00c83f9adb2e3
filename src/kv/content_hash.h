// Collision-resistant names for cached blocks and cache namespaces (SHA-256).
//
// A block's hash chains its namespace, its parent's hash and its own token ids, so equal
// hashes mean equal namespace and equal tokens from the start of the sequence: later tiers
// and other processes can name a block by its hash alone.
//
// Thread-safety: pure functions over values; safe from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace kvc::kv {

using Hash256 = std::array<uint8_t, 32>;

// Incremental SHA-256 over typed fields (integers little-endian, strings length-prefixed, so
// that field boundaries are unambiguous).
class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  Hasher& bytes(const void* data, size_t n);
  Hasher& u64(uint64_t v);
  Hasher& str(std::string_view s);
  Hasher& hash(const Hash256& h) { return bytes(h.data(), h.size()); }
  Hasher& tokens(std::span<const int32_t> ids);
  Hash256 finish();

 private:
  void* ctx_;
};

// The hash of a block: namespace, parent block hash (zero for the first block), token ids.
Hash256 chain_hash(const Hash256& ns, const Hash256& parent, std::span<const int32_t> tokens);

// Lower-case hex, optionally shortened to the first n bytes.
std::string to_hex(const Hash256& h, size_t n = 32);

}  // namespace kvc::kv
