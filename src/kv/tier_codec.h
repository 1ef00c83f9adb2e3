// How a KV block is packed for a tier and unpacked again: the TierBlockHeader, then the
// block's bytes, optionally compressed (lz4 or zstd, kept only when it saves bytes) and
// optionally encrypted with AES-256-GCM.
//
// Encryption: each block gets a random 96-bit nonce, stored in its header with the 128-bit tag;
// the associated data is the whole header with its tag and checksum fields zeroed (the checksum
// covers the ciphertext, which the tag authenticates anyway). A block that fails
// authentication is refused like a corrupt one. With a key, blocks stored without encryption
// are refused too, so nothing written by a keyless writer (or planted) is ever used.
//
// Thread-safety: const functions are safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kv/content_hash.h"
#include "kv/tier_block.h"
#include "kv/tier_key.h"

namespace kvc::kv {

enum class TierCompression : uint8_t { kNone, kLz4, kZstd };

// "none", "lz4", "zstd"; nullopt for anything else.
std::optional<TierCompression> parse_tier_compression(std::string_view name);
std::string_view tier_compression_name(TierCompression c);

class TierCodec {
 public:
  TierCodec(TierIdentity identity, TierCompression compression, std::optional<TierKey> key);
  // Blocks stored as they are: no compression, no encryption.
  explicit TierCodec(TierIdentity identity)
      : TierCodec(std::move(identity), TierCompression::kNone, std::nullopt) {}

  // The stored form of payload as block block_hash of namespace ns holding token_count tokens.
  // Throws Error only if the crypto library fails.
  std::vector<uint8_t> encode(const Hash256& ns, const Hash256& block_hash, uint32_t token_count,
                              std::span<const uint8_t> payload) const;
  // Unpacks a stored payload read under header h into out (exactly out.size() bytes, the pool's
  // block size) after every check; returns why it cannot stand in for block_hash of ns, or
  // empty on success.
  std::string decode(const TierBlockHeader& h, const Hash256& ns, const Hash256& block_hash,
                     std::span<const uint8_t> stored, std::span<uint8_t> out) const;

  const TierIdentity& identity() const { return identity_; }
  TierCompression compression() const { return compression_; }
  bool encrypts() const { return key_.has_value(); }

 private:
  TierIdentity identity_;
  TierCompression compression_;
  std::optional<TierKey> key_;
};

}  // namespace kvc::kv
