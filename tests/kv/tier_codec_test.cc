#include "kv/tier_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "base/error.h"
#include "kv/tier_fixtures.h"
#include "scratch_dir.h"

namespace kvc::kv {
namespace {

using namespace tier_fixtures;
using ::testing::HasSubstr;

TierKey key_of(uint8_t b) {
  TierKey k{};
  k.fill(b);
  k[0] = 0x42;
  return k;
}

// Splits a stored block into its header and stored payload.
struct Stored {
  TierBlockHeader header;
  std::vector<uint8_t> payload;
};
Stored split(const std::vector<uint8_t>& block) {
  std::string why;
  const auto h = decode_tier_header(block, why);
  EXPECT_TRUE(h) << why;
  return {*h, std::vector<uint8_t>(block.begin() + kTierHeaderBytes, block.end())};
}

// Unpacks a stored block as block 1 of namespace 2; returns why not, or empty.
std::string unpack(const TierCodec& codec, const std::vector<uint8_t>& block,
                   std::vector<uint8_t>& out) {
  out.assign(identity().geometry.bytes_per_block(), 0);
  const Stored s = split(block);
  return codec.decode(s.header, ns_of(2), hash_of(1), s.payload, out);
}

// KV-like bytes: small floats, which compress (high bytes repeat), unlike random bytes.
std::vector<uint8_t> compressible() {
  std::vector<float> f(identity().geometry.bytes_per_block() / sizeof(float));
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i % 8) * 0.25f;
  std::vector<uint8_t> p(f.size() * sizeof(float));
  std::memcpy(p.data(), f.data(), p.size());
  return p;
}

std::vector<uint8_t> random_bytes() {
  std::mt19937 rng(5);
  std::vector<uint8_t> p(identity().geometry.bytes_per_block());
  for (auto& b : p) b = static_cast<uint8_t>(rng());
  return p;
}

TEST(TierCodec, EveryCombinationRoundTripsExactly) {
  for (const TierCompression c :
       {TierCompression::kNone, TierCompression::kLz4, TierCompression::kZstd}) {
    for (const bool encrypt : {false, true}) {
      SCOPED_TRACE(fmt::format("{} {}", tier_compression_name(c), encrypt ? "encrypted" : ""));
      const TierCodec codec(identity(), c, encrypt ? std::optional(key_of(1)) : std::nullopt);
      for (const auto& p : {compressible(), random_bytes(), payload(3)}) {
        const auto block = codec.encode(ns_of(2), hash_of(1), 4, p);
        std::vector<uint8_t> out;
        EXPECT_EQ(unpack(codec, block, out), "");
        EXPECT_EQ(out, p);
      }
    }
  }
}

TEST(TierCodec, CompressionIsKeptOnlyWhenItSavesBytes) {
  const size_t raw = identity().geometry.bytes_per_block();
  for (const TierCompression c : {TierCompression::kLz4, TierCompression::kZstd}) {
    const TierCodec codec(identity(), c, std::nullopt);
    const Stored packed = split(codec.encode(ns_of(2), hash_of(1), 4, compressible()));
    EXPECT_LT(packed.payload.size(), raw);
    EXPECT_NE(packed.header.flags & (TierBlockHeader::kLz4 | TierBlockHeader::kZstd), 0u);
    EXPECT_EQ(packed.header.raw_bytes, raw);
    const Stored as_is = split(codec.encode(ns_of(2), hash_of(1), 4, random_bytes()));
    EXPECT_EQ(as_is.payload.size(), raw);
    EXPECT_EQ(as_is.header.flags, 0u);
  }
}

TEST(TierCodec, AReaderDecompressesWhateverTheWriterChose) {
  const TierCodec zstd(identity(), TierCompression::kZstd, std::nullopt);
  const TierCodec none(identity());
  std::vector<uint8_t> out;
  EXPECT_EQ(unpack(none, zstd.encode(ns_of(2), hash_of(1), 4, compressible()), out), "");
  EXPECT_EQ(out, compressible());
}

TEST(TierCodec, EncryptedBlocksHideThePayloadAndUseFreshNonces) {
  const TierCodec codec(identity(), TierCompression::kNone, key_of(1));
  const auto p = compressible();
  const Stored a = split(codec.encode(ns_of(2), hash_of(1), 4, p));
  const Stored b = split(codec.encode(ns_of(2), hash_of(1), 4, p));
  EXPECT_NE(a.header.flags & TierBlockHeader::kEncrypted, 0u);
  EXPECT_NE(a.payload, p);
  EXPECT_NE(a.header.nonce, b.header.nonce);
  EXPECT_NE(a.payload, b.payload);
}

TEST(TierCodec, AWrongKeyOrAnAlteredBlockFailsAuthentication) {
  const TierCodec codec(identity(), TierCompression::kZstd, key_of(1));
  const auto block = codec.encode(ns_of(2), hash_of(1), 4, compressible());
  std::vector<uint8_t> out;
  const TierCodec other_key(identity(), TierCompression::kZstd, key_of(2));
  EXPECT_THAT(unpack(other_key, block, out), HasSubstr("failed authentication"));

  // A flipped ciphertext byte with the checksum fixed up, as a deliberate attacker would.
  Stored s = split(block);
  s.payload[s.payload.size() / 2] ^= 0x10;
  s.header.payload_checksum = payload_checksum(s.payload);
  out.assign(identity().geometry.bytes_per_block(), 0);
  EXPECT_THAT(codec.decode(s.header, ns_of(2), hash_of(1), s.payload, out),
              HasSubstr("failed authentication"));

  // A header field changed (the token count): the header is associated data.
  s = split(block);
  s.header.token_count = 3;
  EXPECT_THAT(codec.decode(s.header, ns_of(2), hash_of(1), s.payload, out),
              HasSubstr("failed authentication"));
}

TEST(TierCodec, WithAKeyOnlyEncryptedBlocksAreUsedAndWithoutOneNone) {
  const TierCodec plain(identity());
  const TierCodec keyed(identity(), TierCompression::kNone, key_of(1));
  std::vector<uint8_t> out;
  EXPECT_THAT(unpack(keyed, plain.encode(ns_of(2), hash_of(1), 4, payload(1)), out),
              HasSubstr("not encrypted"));
  EXPECT_THAT(unpack(plain, keyed.encode(ns_of(2), hash_of(1), 4, payload(1)), out),
              HasSubstr("no --kv-tier-key"));
}

TEST(TierCodec, ABlockOfAnotherNamespaceOrSizeIsRefused) {
  const TierCodec codec(identity(), TierCompression::kLz4, key_of(1));
  const Stored s = split(codec.encode(ns_of(9), hash_of(1), 4, compressible()));
  std::vector<uint8_t> out(identity().geometry.bytes_per_block());
  EXPECT_THAT(codec.decode(s.header, ns_of(2), hash_of(1), s.payload, out), HasSubstr("namespace"));
  std::vector<uint8_t> small(out.size() / 2);
  EXPECT_THAT(codec.decode(s.header, ns_of(9), hash_of(1), s.payload, small),
              HasSubstr("pool's blocks hold"));
}

TEST(TierCodec, CompressionNamesParse) {
  EXPECT_EQ(parse_tier_compression("lz4"), TierCompression::kLz4);
  EXPECT_EQ(parse_tier_compression("zstd"), TierCompression::kZstd);
  EXPECT_EQ(parse_tier_compression("none"), TierCompression::kNone);
  EXPECT_FALSE(parse_tier_compression("gzip"));
}

std::filesystem::path write_file(const std::string& name, const std::string& bytes) {
  const auto p = kvc::testing::scratch_dir() / name;
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}

TEST(TierKey, ReadsRawBytesOrHexDigits) {
  const std::string raw(32, '\x07');
  EXPECT_EQ(load_tier_key(write_file("raw.key", raw))[31], 7);
  const std::string hex = std::string(62, '0') + "fF\n";
  const TierKey k = load_tier_key(write_file("hex.key", hex));
  EXPECT_EQ(k[31], 0xff);
  EXPECT_EQ(k[0], 0);
}

TEST(TierKey, BadFilesAreClearErrors) {
  try {
    load_tier_key(write_file("short.key", "abc"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("32 raw bytes or 64 hex digits"));
  }
  try {
    load_tier_key(write_file("bad.key", std::string(63, '0') + "g"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("not a hex digit"));
  }
  EXPECT_THROW(load_tier_key(kvc::testing::scratch_dir() / "absent.key"), Error);
}

}  // namespace
}  // namespace kvc::kv
