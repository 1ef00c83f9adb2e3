#include "base/utf8.h"

#include <cstdint>

namespace kvc {

size_t utf8_complete_prefix(std::string_view s) {
  // Look back at most 3 bytes for the lead byte of a sequence that has not finished yet.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xc0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = 0;
    if ((c & 0xe0) == 0xc0)
      need = 2;
    else if ((c & 0xf0) == 0xe0)
      need = 3;
    else if ((c & 0xf8) == 0xf0)
      need = 4;
    return (need > back) ? n - back : n;
  }
  return n;
}

size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto c = static_cast<uint8_t>(s[i]);
  const size_t n = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
  return i + n > s.size() ? 1 : n;
}

}  // namespace kvc
