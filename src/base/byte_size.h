// Byte sizes as people write them ("512MiB", "24GiB", "80GB", "1048576") and back.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kvc {

// Parses a size with an optional unit: B, K/KB (1000), KiB (1024), M/MB, MiB, G/GB, GiB, T/TB,
// TiB (case-insensitive). Throws Error naming the text when it is not a positive size.
uint64_t parse_byte_size(std::string_view text);
// "16.0 MiB"-style rendering with binary units.
std::string format_bytes(uint64_t bytes);

}  // namespace kvc
