#include "kv/tier_key.h"

#include <cctype>
#include <fstream>
#include <iterator>
#include <string>

#include "base/error.h"

namespace kvc::kv {
namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

TierKey load_tier_key(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error("cannot read the tier key file " + file.string());
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TierKey key{};
  if (bytes.size() == key.size()) {
    std::copy(bytes.begin(), bytes.end(), key.begin());
    return key;
  }
  size_t first = 0;
  size_t last = bytes.size();
  while (first < last && std::isspace(static_cast<unsigned char>(bytes[first]))) ++first;
  while (last > first && std::isspace(static_cast<unsigned char>(bytes[last - 1]))) --last;
  if (last - first != 2 * key.size()) {
    throw Error("the tier key file " + file.string() + " holds " + std::to_string(bytes.size()) +
                " bytes: it must hold 32 raw bytes or 64 hex digits (an AES-256 key)");
  }
  for (size_t i = 0; i < key.size(); ++i) {
    const int hi = hex_value(bytes[first + 2 * i]);
    const int lo = hex_value(bytes[first + 2 * i + 1]);
    if (hi < 0 || lo < 0) {
      throw Error("the tier key file " + file.string() +
                  " has a character that is not a hex digit; it must hold 32 raw bytes or 64 "
                  "hex digits");
    }
    key[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return key;
}

}  // namespace kvc::kv
