#include "kv/tier_codec.h"

#include <fmt/format.h>
#include <lz4.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <zstd.h>

#include <cstring>
#include <limits>
#include <memory>

#include "base/error.h"

namespace kvc::kv {
namespace {

constexpr int kZstdLevel = 1;  // KV bytes compress little; the fastest level keeps most of it

using CipherCtx = std::unique_ptr<EVP_CIPHER_CTX, decltype(&EVP_CIPHER_CTX_free)>;

CipherCtx new_ctx() {
  CipherCtx ctx(EVP_CIPHER_CTX_new(), &EVP_CIPHER_CTX_free);
  if (!ctx) throw Error("OpenSSL could not allocate a cipher context");
  return ctx;
}

// The associated data: the header with the fields that depend on the ciphertext zeroed.
std::array<uint8_t, kTierHeaderBytes> associated_data(TierBlockHeader h) {
  h.tag = {};
  h.payload_checksum = 0;
  return encode_tier_header(h);
}

// The compressed bytes, or empty when compression saves nothing.
std::vector<uint8_t> compress(TierCompression c, std::span<const uint8_t> in) {
  std::vector<uint8_t> out;
  if (c == TierCompression::kLz4 && in.size() <= LZ4_MAX_INPUT_SIZE) {
    out.resize(static_cast<size_t>(LZ4_compressBound(static_cast<int>(in.size()))));
    const int n = LZ4_compress_default(reinterpret_cast<const char*>(in.data()),
                                       reinterpret_cast<char*>(out.data()),
                                       static_cast<int>(in.size()), static_cast<int>(out.size()));
    out.resize(n > 0 ? static_cast<size_t>(n) : 0);
  } else if (c == TierCompression::kZstd) {
    out.resize(ZSTD_compressBound(in.size()));
    const size_t n = ZSTD_compress(out.data(), out.size(), in.data(), in.size(), kZstdLevel);
    out.resize(ZSTD_isError(n) ? 0 : n);
  }
  if (out.size() >= in.size()) out.clear();
  return out;
}

// Decompresses in into out; false unless it fills out exactly.
bool decompress(uint32_t flags, std::span<const uint8_t> in, std::span<uint8_t> out) {
  if (flags & TierBlockHeader::kLz4) {
    if (in.size() > static_cast<size_t>(std::numeric_limits<int>::max())) return false;
    const int n = LZ4_decompress_safe(reinterpret_cast<const char*>(in.data()),
                                      reinterpret_cast<char*>(out.data()),
                                      static_cast<int>(in.size()), static_cast<int>(out.size()));
    return n >= 0 && static_cast<size_t>(n) == out.size();
  }
  const size_t n = ZSTD_decompress(out.data(), out.size(), in.data(), in.size());
  return !ZSTD_isError(n) && n == out.size();
}

}  // namespace

std::optional<TierCompression> parse_tier_compression(std::string_view name) {
  if (name == "none") return TierCompression::kNone;
  if (name == "lz4") return TierCompression::kLz4;
  if (name == "zstd") return TierCompression::kZstd;
  return std::nullopt;
}

std::string_view tier_compression_name(TierCompression c) {
  switch (c) {
    case TierCompression::kLz4:
      return "lz4";
    case TierCompression::kZstd:
      return "zstd";
    case TierCompression::kNone:
      break;
  }
  return "none";
}

TierCodec::TierCodec(TierIdentity identity, TierCompression compression, std::optional<TierKey> key)
    : identity_(std::move(identity)), compression_(compression), key_(key) {}

std::vector<uint8_t> TierCodec::encode(const Hash256& ns, const Hash256& block_hash,
                                       uint32_t token_count,
                                       std::span<const uint8_t> payload) const {
  TierBlockHeader h = make_tier_header(identity_, ns, block_hash, token_count);
  h.raw_bytes = static_cast<uint32_t>(payload.size());
  std::vector<uint8_t> packed = compress(compression_, payload);
  if (!packed.empty()) {
    h.flags |=
        compression_ == TierCompression::kLz4 ? TierBlockHeader::kLz4 : TierBlockHeader::kZstd;
    payload = packed;
  }
  if (!key_) return encode_tier_block(h, payload);

  h.flags |= TierBlockHeader::kEncrypted;
  h.payload_bytes = payload.size();
  if (RAND_bytes(h.nonce.data(), static_cast<int>(h.nonce.size())) != 1) {
    throw Error("OpenSSL could not draw a random nonce");
  }
  const auto aad = associated_data(h);
  std::vector<uint8_t> cipher(payload.size());
  CipherCtx ctx = new_ctx();
  int n = 0;
  if (EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_IVLEN, static_cast<int>(h.nonce.size()),
                          nullptr) != 1 ||
      EVP_EncryptInit_ex(ctx.get(), nullptr, nullptr, key_->data(), h.nonce.data()) != 1 ||
      EVP_EncryptUpdate(ctx.get(), nullptr, &n, aad.data(), static_cast<int>(aad.size())) != 1 ||
      EVP_EncryptUpdate(ctx.get(), cipher.data(), &n, payload.data(),
                        static_cast<int>(payload.size())) != 1 ||
      EVP_EncryptFinal_ex(ctx.get(), cipher.data() + n, &n) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, static_cast<int>(h.tag.size()),
                          h.tag.data()) != 1) {
    throw Error("OpenSSL failed to encrypt a tier block");
  }
  return encode_tier_block(h, cipher);
}

std::string TierCodec::decode(const TierBlockHeader& h, const Hash256& ns,
                              const Hash256& block_hash, std::span<const uint8_t> stored,
                              std::span<uint8_t> out) const {
  std::string why = check_tier_block(h, identity_, ns, block_hash, stored);
  if (!why.empty()) return why;
  if (h.raw_bytes != out.size()) {
    return fmt::format("a block of {} bytes, the pool's blocks hold {}", h.raw_bytes, out.size());
  }
  const bool encrypted = (h.flags & TierBlockHeader::kEncrypted) != 0;
  if (encrypted && !key_) return "encrypted, and no --kv-tier-key was given";
  if (!encrypted && key_) return "not encrypted, and --kv-tier-key requires encrypted blocks";
  const bool compressed = (h.flags & (TierBlockHeader::kLz4 | TierBlockHeader::kZstd)) != 0;
  if (!compressed && stored.size() != out.size()) {
    return fmt::format("payload of {} bytes, the pool's blocks hold {}", stored.size(), out.size());
  }
  std::vector<uint8_t> plain;
  if (encrypted) {
    plain.resize(stored.size());
    const auto aad = associated_data(h);
    std::array<uint8_t, 16> tag = h.tag;
    CipherCtx ctx = new_ctx();
    int n = 0;
    const bool ok =
        EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) == 1 &&
        EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_IVLEN, static_cast<int>(h.nonce.size()),
                            nullptr) == 1 &&
        EVP_DecryptInit_ex(ctx.get(), nullptr, nullptr, key_->data(), h.nonce.data()) == 1 &&
        EVP_DecryptUpdate(ctx.get(), nullptr, &n, aad.data(), static_cast<int>(aad.size())) == 1 &&
        EVP_DecryptUpdate(ctx.get(), plain.data(), &n, stored.data(),
                          static_cast<int>(stored.size())) == 1 &&
        EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, static_cast<int>(tag.size()),
                            tag.data()) == 1 &&
        EVP_DecryptFinal_ex(ctx.get(), plain.data() + n, &n) == 1;
    if (!ok) return "failed authentication (another key, or altered)";
    stored = plain;
  }
  if (compressed) {
    if (!decompress(h.flags, stored, out)) return "does not decompress to a whole block";
  } else {
    std::memcpy(out.data(), stored.data(), out.size());
  }
  return {};
}

}  // namespace kvc::kv
