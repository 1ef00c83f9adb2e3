#include "model/byte_unicode.h"

#include <array>

namespace kvc::model {

namespace {

bool maps_to_itself(uint32_t b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Tables {
  std::array<uint32_t, 256> to_cp{};
  std::array<std::string, 256> to_utf8{};
  std::array<int16_t, 256 + 68> from_cp{};  // -1: not in the alphabet
  Tables() {
    from_cp.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      to_cp[b] = maps_to_itself(b) ? b : next++;
      const uint32_t cp = to_cp[b];
      from_cp[cp] = static_cast<int16_t>(b);
      std::string& s = to_utf8[b];
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {  // every code point of the alphabet is below U+0800
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

uint32_t byte_to_code_point(uint8_t b) {
  return tables().to_cp[b];
}

std::optional<uint8_t> code_point_to_byte(uint32_t cp) {
  const auto& from = tables().from_cp;
  if (cp >= from.size() || from[cp] < 0) return std::nullopt;
  return static_cast<uint8_t>(from[cp]);
}

std::string bytes_to_unicode(std::string_view raw) {
  const Tables& t = tables();
  std::string out;
  out.reserve(raw.size() * 2);
  for (char c : raw) out.append(t.to_utf8[static_cast<uint8_t>(c)]);
  return out;
}

std::string unicode_to_bytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<uint8_t>(text[i]);
    if (c < 0x80) {
      // ASCII: printable characters stand for themselves; anything else is copied as is.
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    if ((c & 0xE0) == 0xC0 && i + 1 < text.size() &&
        (static_cast<uint8_t>(text[i + 1]) & 0xC0) == 0x80) {
      const uint32_t cp = (c & 0x1Fu) << 6 | (static_cast<uint8_t>(text[i + 1]) & 0x3Fu);
      if (const auto b = code_point_to_byte(cp)) {
        out.push_back(static_cast<char>(*b));
      } else {
        out.append(text.substr(i, 2));
      }
      i += 2;
      continue;
    }
    out.push_back(static_cast<char>(c));
    ++i;
  }
  return out;
}

}  // namespace kvc::model
