#include "kv/content_hash.h"

#include <openssl/evp.h>

#include <algorithm>

#include "base/error.h"

namespace kvc::kv {

Hasher::Hasher() : ctx_(EVP_MD_CTX_new()) {
  if (ctx_ == nullptr ||
      EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) != 1) {
    fail("SHA-256 initialisation failed");
  }
}

Hasher::~Hasher() {
  EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_));
}

Hasher& Hasher::bytes(const void* data, size_t n) {
  EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, n);
  return *this;
}

Hasher& Hasher::u64(uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
  return bytes(b, 8);
}

Hasher& Hasher::str(std::string_view s) {
  u64(s.size());
  return bytes(s.data(), s.size());
}

Hasher& Hasher::tokens(std::span<const int32_t> ids) {
  u64(ids.size());
  // Little-endian bytes, a buffer at a time (one digest update per 64 ids, not per id).
  uint8_t b[256];
  for (size_t i = 0; i < ids.size();) {
    const size_t n = std::min<size_t>(64, ids.size() - i);
    for (size_t k = 0; k < n; ++k) {
      const auto v = static_cast<uint32_t>(ids[i + k]);
      for (int byte = 0; byte < 4; ++byte) b[4 * k + byte] = static_cast<uint8_t>(v >> (8 * byte));
    }
    bytes(b, 4 * n);
    i += n;
  }
  return *this;
}

Hash256 Hasher::finish() {
  Hash256 out{};
  unsigned int n = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), out.data(), &n);
  return out;
}

Hash256 chain_hash(const Hash256& ns, const Hash256& parent, std::span<const int32_t> tokens) {
  Hasher h;
  h.str("kvcache-block-v1").hash(ns).hash(parent).tokens(tokens);
  return h.finish();
}

std::string to_hex(const Hash256& h, size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n && i < h.size(); ++i) {
    s += digits[h[i] >> 4];
    s += digits[h[i] & 15];
  }
  return s;
}

}  // namespace kvc::kv
