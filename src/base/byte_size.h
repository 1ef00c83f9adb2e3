// Byte sizes as people write them ("512MiB", "24GiB", "80GB", "1048576") and back.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kvc {

// Parses a size with an optional unit, case-insensitive: B; K, KiB, M, MiB, G, GiB, T, TiB
// (powers of 1024); KB, MB, GB, TB (powers of 1000); fractions allowed ("1.5GiB"). Exact in
// integer arithmetic. Throws Error naming `what` and the text when it is not a positive size.
uint64_t parse_byte_size(std::string_view text, std::string_view what = "size");
// "16.0 MiB"-style rendering with binary units.
std::string format_bytes(uint64_t bytes);

}  // namespace kvc
