#include "base/byte_size.h"

#include <cctype>
#include <charconv>
#include <cmath>

#include "base/error.h"

namespace kvc {

uint64_t parse_byte_size(std::string_view text) {
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  size_t digits = 0;
  while (digits < s.size() &&
         (std::isdigit(static_cast<unsigned char>(s[digits])) || s[digits] == '.')) {
    ++digits;
  }
  double value = 0.0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + digits, value);
  if (digits == 0 || ec != std::errc() || ptr != s.data() + digits) {
    fail("'{}' is not a size (examples: 512MiB, 24GiB, 80GB, 1048576)", text);
  }
  std::string unit;
  for (char c : s.substr(digits)) {
    if (!std::isspace(static_cast<unsigned char>(c))) unit += static_cast<char>(std::tolower(c));
  }
  double scale = 0.0;
  if (unit.empty() || unit == "b")
    scale = 1.0;
  else if (unit == "k" || unit == "kb")
    scale = 1e3;
  else if (unit == "kib")
    scale = 1024.0;
  else if (unit == "m" || unit == "mb")
    scale = 1e6;
  else if (unit == "mib")
    scale = 1024.0 * 1024;
  else if (unit == "g" || unit == "gb")
    scale = 1e9;
  else if (unit == "gib")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tb")
    scale = 1e12;
  else if (unit == "tib")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else
    fail("'{}' has an unknown unit '{}' (use B, KB, KiB, MB, MiB, GB, GiB, TB, TiB)", text, unit);
  const double bytes = std::floor(value * scale);
  if (!(bytes >= 1.0) || bytes > 1.8e19) fail("'{}' is not a positive size", text);
  return static_cast<uint64_t>(bytes);
}

std::string format_bytes(uint64_t bytes) {
  static constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, units[u]);
}

}  // namespace kvc
