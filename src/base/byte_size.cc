#include "base/byte_size.h"

#include <cctype>
#include <limits>
#include <optional>
#include <string>

#include "base/error.h"
#include "base/strings.h"

namespace kvc {

namespace {

using Wide = unsigned __int128;
constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

std::optional<uint64_t> unit_multiplier(const std::string& unit) {
  static const std::pair<const char*, uint64_t> kUnits[] = {
      {"", 1},
      {"b", 1},
      {"k", 1ull << 10},
      {"kib", 1ull << 10},
      {"kb", 1000},
      {"m", 1ull << 20},
      {"mib", 1ull << 20},
      {"mb", 1000000},
      {"g", 1ull << 30},
      {"gib", 1ull << 30},
      {"gb", 1000000000},
      {"t", 1ull << 40},
      {"tib", 1ull << 40},
      {"tb", 1000000000000},
  };
  for (const auto& [name, mult] : kUnits) {
    if (unit == name) return mult;
  }
  return std::nullopt;
}

}  // namespace

uint64_t parse_byte_size(std::string_view text, std::string_view what) {
  const std::string_view s = trim(text);
  const auto bad = [&] {
    fail(
        "{}: cannot read size '{}': expected a number with an optional unit, B, KiB, MiB, GiB, "
        "TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000), e.g. 24GiB",
        what, text);
  };
  if (!s.empty() && s.front() == '-') fail("{}: size must be positive, got '{}'", what, text);
  size_t i = 0;
  Wide whole = 0;
  Wide fraction = 0;
  Wide scale = 1;
  size_t digits = 0;
  for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i, ++digits) {
    whole = whole * 10 + static_cast<unsigned>(s[i] - '0');
    if (whole > kMax) fail("{}: size '{}' is too large", what, text);
  }
  if (i < s.size() && s[i] == '.') {
    for (++i; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i, ++digits) {
      if (scale < Wide{1000000000000000000ull}) {  // digits past 18 cannot change whole bytes
        fraction = fraction * 10 + static_cast<unsigned>(s[i] - '0');
        scale *= 10;
      }
    }
  }
  if (digits == 0) bad();
  const auto mult = unit_multiplier(to_lower(trim(s.substr(i))));
  if (!mult) bad();
  const Wide bytes = whole * *mult + fraction * *mult / scale;
  if (bytes > kMax) fail("{}: size '{}' is too large", what, text);
  if (bytes == 0) fail("{}: size must be positive, got '{}'", what, text);
  return static_cast<uint64_t>(bytes);
}

std::string format_bytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double value = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  // Round first so that 1023.96 KiB reads "1.0 MiB" rather than "1024.0 KiB".
  while (value >= 1023.95 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

}  // namespace kvc
