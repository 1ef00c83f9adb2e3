// UTF-8 helpers for streaming text one token at a time.
#pragma once

#include <cstddef>
#include <string_view>

namespace kvc {

// Length of the longest prefix of s that does not end inside an unfinished multi-byte UTF-8
// sequence: the bytes after it may be completed by the next token's bytes. Invalid bytes
// count as complete, so they are never held back forever.
size_t utf8_complete_prefix(std::string_view s);

// Bytes in the UTF-8 sequence whose lead byte is s[i] (1 to 4, from that byte alone); 1 for a
// byte that leads no sequence (ASCII, a continuation or an invalid byte) or for a sequence that
// would run past the end of s.
size_t utf8_sequence_length(std::string_view s, size_t i);

}  // namespace kvc
