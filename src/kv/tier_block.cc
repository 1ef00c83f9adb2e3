#include "kv/tier_block.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <cstring>

namespace kvc::kv {
namespace {

constexpr std::array<uint8_t, 4> kMagic = {'K', 'V', 'C', 'B'};

// Little-endian writes and reads at a moving offset.
struct Writer {
  std::array<uint8_t, kTierHeaderBytes>& out;
  size_t at = 0;
  void bytes(const void* p, size_t n) {
    std::memcpy(out.data() + at, p, n);
    at += n;
  }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out[at++] = static_cast<uint8_t>(v >> (8 * i));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out[at++] = static_cast<uint8_t>(v >> (8 * i));
  }
};

struct Reader {
  std::span<const uint8_t> in;
  size_t at = 0;
  void bytes(void* p, size_t n) {
    std::memcpy(p, in.data() + at, n);
    at += n;
  }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{in[at++]} << (8 * i);
    return v;
  }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{in[at++]} << (8 * i);
    return v;
  }
};

}  // namespace

uint64_t payload_checksum(std::span<const uint8_t> payload) {
  return XXH3_64bits(payload.data(), payload.size());
}

namespace {

// The check of a header's first kTierHeaderBytes - 4 bytes, stored in its last four.
uint32_t header_checksum(std::span<const uint8_t> header) {
  return static_cast<uint32_t>(XXH3_64bits(header.data(), kTierHeaderBytes - 4));
}

}  // namespace

TierBlockHeader make_tier_header(const TierIdentity& identity, const Hash256& ns,
                                 const Hash256& block_hash, uint32_t token_count) {
  TierBlockHeader h;
  h.model_fingerprint = identity.model_fingerprint;
  h.ns = ns;
  h.block_hash = block_hash;
  h.n_layers = identity.geometry.n_layers;
  h.n_kv_heads = identity.geometry.n_kv_heads;
  h.head_dim = identity.geometry.head_dim;
  h.block_tokens = identity.geometry.block_tokens;
  h.k_dtype = identity.geometry.k_dtype;
  h.v_dtype = identity.geometry.v_dtype;
  h.token_count = token_count;
  return h;
}

std::array<uint8_t, kTierHeaderBytes> encode_tier_header(const TierBlockHeader& h) {
  std::array<uint8_t, kTierHeaderBytes> out{};
  Writer w{out};
  w.bytes(kMagic.data(), kMagic.size());
  w.u32(h.version);
  w.u32(static_cast<uint32_t>(kTierHeaderBytes));
  w.u32(h.flags);
  w.bytes(h.model_fingerprint.data(), 32);
  w.bytes(h.ns.data(), 32);
  w.bytes(h.block_hash.data(), 32);
  w.u32(static_cast<uint32_t>(h.n_layers));
  w.u32(static_cast<uint32_t>(h.n_kv_heads));
  w.u32(static_cast<uint32_t>(h.head_dim));
  w.u32(static_cast<uint32_t>(h.block_tokens));
  w.u32(ggml_type_id(h.k_dtype));
  w.u32(ggml_type_id(h.v_dtype));
  w.u32(h.token_count);
  w.u32(h.raw_bytes);
  w.u64(h.payload_bytes);
  w.u64(h.payload_checksum);
  w.bytes(h.nonce.data(), h.nonce.size());
  w.bytes(h.tag.data(), h.tag.size());
  w.u32(header_checksum(out));
  return out;
}

std::optional<TierBlockHeader> decode_tier_header(std::span<const uint8_t> bytes,
                                                  std::string& why) {
  if (bytes.size() < kTierHeaderBytes) {
    why = fmt::format("{} bytes, shorter than the {}-byte header", bytes.size(), kTierHeaderBytes);
    return std::nullopt;
  }
  Reader r{bytes};
  std::array<uint8_t, 4> magic{};
  r.bytes(magic.data(), magic.size());
  if (magic != kMagic) {
    why = "not a kvcache block (bad magic)";
    return std::nullopt;
  }
  TierBlockHeader h;
  h.version = r.u32();
  if (h.version != kTierBlockVersion) {
    why = fmt::format("format version {} (this build reads {})", h.version, kTierBlockVersion);
    return std::nullopt;
  }
  if (Reader{bytes, kTierHeaderBytes - 4}.u32() != header_checksum(bytes)) {
    why = "header checksum mismatch (a damaged header, or one torn by a crash mid-write)";
    return std::nullopt;
  }
  const uint32_t size = r.u32();
  if (size != kTierHeaderBytes) {
    why = fmt::format("header size {} (expected {})", size, kTierHeaderBytes);
    return std::nullopt;
  }
  h.flags = r.u32();
  r.bytes(h.model_fingerprint.data(), 32);
  r.bytes(h.ns.data(), 32);
  r.bytes(h.block_hash.data(), 32);
  h.n_layers = static_cast<int32_t>(r.u32());
  h.n_kv_heads = static_cast<int32_t>(r.u32());
  h.head_dim = static_cast<int32_t>(r.u32());
  h.block_tokens = static_cast<int32_t>(r.u32());
  const auto k = dtype_from_ggml(r.u32());
  const auto v = dtype_from_ggml(r.u32());
  if (!k || !v) {
    why = "unknown K or V dtype";
    return std::nullopt;
  }
  h.k_dtype = *k;
  h.v_dtype = *v;
  h.token_count = r.u32();
  h.raw_bytes = r.u32();
  h.payload_bytes = r.u64();
  h.payload_checksum = r.u64();
  r.bytes(h.nonce.data(), h.nonce.size());
  r.bytes(h.tag.data(), h.tag.size());
  return h;
}

std::vector<uint8_t> encode_tier_block(TierBlockHeader header, std::span<const uint8_t> payload) {
  header.payload_bytes = payload.size();
  header.payload_checksum = payload_checksum(payload);
  const auto head = encode_tier_header(header);
  std::vector<uint8_t> out(head.size() + payload.size());
  std::memcpy(out.data(), head.data(), head.size());
  if (!payload.empty()) std::memcpy(out.data() + head.size(), payload.data(), payload.size());
  return out;
}

std::string identity_mismatch(const TierBlockHeader& h, const TierIdentity& identity) {
  if (h.model_fingerprint != identity.model_fingerprint) return "stored by another model";
  const KvGeometry& g = identity.geometry;
  if (h.n_layers != g.n_layers || h.n_kv_heads != g.n_kv_heads || h.head_dim != g.head_dim ||
      h.block_tokens != g.block_tokens) {
    return fmt::format("geometry {}x{}x{} with {}-token blocks, not {}x{}x{} with {}", h.n_layers,
                       h.n_kv_heads, h.head_dim, h.block_tokens, g.n_layers, g.n_kv_heads,
                       g.head_dim, g.block_tokens);
  }
  if (h.k_dtype != g.k_dtype || h.v_dtype != g.v_dtype) {
    return fmt::format("K/V dtypes {}/{}, not {}/{}", dtype_name(h.k_dtype), dtype_name(h.v_dtype),
                       dtype_name(g.k_dtype), dtype_name(g.v_dtype));
  }
  return {};
}

std::string check_tier_block(const TierBlockHeader& h, const TierIdentity& identity,
                             const Hash256& ns, const Hash256& block_hash,
                             std::span<const uint8_t> payload) {
  std::string why = identity_mismatch(h, identity);
  if (!why.empty()) return why;
  if (h.ns != ns) return "stored under another namespace";
  if (h.block_hash != block_hash) return "holds another block";
  const KvGeometry& g = identity.geometry;
  if (h.token_count == 0 || h.token_count > static_cast<uint32_t>(g.block_tokens)) {
    return fmt::format("token count {} out of range", h.token_count);
  }
  if (payload.size() != h.payload_bytes) {
    return fmt::format("payload of {} bytes, header says {}", payload.size(), h.payload_bytes);
  }
  if (payload_checksum(payload) != h.payload_checksum) return "payload checksum mismatch";
  return {};
}

}  // namespace kvc::kv
