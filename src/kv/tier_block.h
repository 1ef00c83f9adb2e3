// The stored form of a KV block outside the pool (the disk and Redis tiers): a fixed header
// that says exactly what the payload is, then the block's bytes as the pool holds them.
//
// The header carries everything that decides whether a stored block may stand in for a
// computed one (model fingerprint, namespace, chained block hash, geometry, K and V dtypes,
// token count) and an XXH3-64 checksum of the payload, so a block of another model, tenant or
// layout, or one damaged on the way, is recognised and refused rather than used.
//
// Layout (little-endian, 192 bytes): magic "KVCB", format version, header size, flags,
// model fingerprint (32), namespace (32), block hash (32), n_layers, n_kv_heads, head_dim,
// block_tokens, K dtype, V dtype, token count, raw bytes, payload bytes (8), payload XXH3-64
// (8), nonce (12), tag (16), the low 32 bits of the XXH3-64 of the 188 bytes before them (so
// that a header torn by a crash mid-write, its first part new and the rest old, is never taken
// for a block: a header spanning two pages can be cut between them). The stored payload is the
// block's bytes as the pool holds them (raw bytes long), lz4- or zstd-compressed when a compression
// flag is set, then AES-256-GCM ciphertext when kEncrypted is set (see TierCodec).
//
// Thread-safety: pure functions over values; safe from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "kv/content_hash.h"
#include "kv/kv_geometry.h"

namespace kvc::kv {

// 2: the header's last four bytes check the rest of it (were zero).
inline constexpr uint32_t kTierBlockVersion = 2;
inline constexpr size_t kTierHeaderBytes = 192;

// What a stored block must match to be used here: the same model and the same layout (the
// geometry carries the K and V dtypes).
struct TierIdentity {
  Hash256 model_fingerprint{};
  KvGeometry geometry;
};

struct TierBlockHeader {
  uint32_t version = kTierBlockVersion;
  uint32_t flags = 0;
  Hash256 model_fingerprint{};
  Hash256 ns{};
  Hash256 block_hash{};
  int32_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_tokens = 0;
  DType k_dtype = DType::F32;
  DType v_dtype = DType::F32;
  uint32_t token_count = 0;
  uint32_t raw_bytes = 0;         // the payload's bytes before compression and encryption
  uint64_t payload_bytes = 0;     // the stored payload's bytes
  uint64_t payload_checksum = 0;  // XXH3-64 of the stored payload bytes
  std::array<uint8_t, 12> nonce{};
  std::array<uint8_t, 16> tag{};

  static constexpr uint32_t kEncrypted = 1;
  static constexpr uint32_t kLz4 = 2;
  static constexpr uint32_t kZstd = 4;
};

// The header of a block of identity, namespace ns and chained hash block_hash (payload fields
// left for encode_tier_block to fill).
TierBlockHeader make_tier_header(const TierIdentity& identity, const Hash256& ns,
                                 const Hash256& block_hash, uint32_t token_count);

// Header bytes, in the layout above.
std::array<uint8_t, kTierHeaderBytes> encode_tier_header(const TierBlockHeader& h);
// Parses header bytes; nullopt with why set when they are not a header of this format
// (wrong magic, version or size).
std::optional<TierBlockHeader> decode_tier_header(std::span<const uint8_t> bytes, std::string& why);

// The whole stored block: header (stored size and checksum filled in) followed by the stored
// payload.
std::vector<uint8_t> encode_tier_block(TierBlockHeader header, std::span<const uint8_t> payload);

// Why a stored block cannot stand in for the wanted one, or empty when it can: compares the
// header with identity, ns and block_hash, and the stored payload with its size and checksum.
std::string check_tier_block(const TierBlockHeader& h, const TierIdentity& identity,
                             const Hash256& ns, const Hash256& block_hash,
                             std::span<const uint8_t> payload);

// Why a header's model or layout differs from identity, or empty when it matches.
std::string identity_mismatch(const TierBlockHeader& h, const TierIdentity& identity);

uint64_t payload_checksum(std::span<const uint8_t> payload);

}  // namespace kvc::kv
