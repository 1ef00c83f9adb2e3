// UTF-8 helpers for streaming text one token at a time.
#pragma once

#include <cstddef>
#include <string_view>

namespace kvc {

// Length of the longest prefix of s that does not end inside an unfinished multi-byte UTF-8
// sequence: the bytes after it may be completed by the next token's bytes. Invalid bytes
// count as complete, so they are never held back forever.
size_t utf8_complete_prefix(std::string_view s);

}  // namespace kvc
