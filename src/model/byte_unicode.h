// The byte-level BPE alphabet (GPT-2's bytes_to_unicode): every byte maps to one printable
// Unicode character so that any byte string is a string of vocabulary characters. Bytes that are
// printable in Latin-1 ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) map to themselves; the other
// 68 (controls, space, DEL, U+00A0, U+00AD) map in byte order to U+0100, U+0101, ... so that a
// space becomes 'Ġ' (U+0120) and a newline 'Ċ' (U+010A).
//
// Pure functions over constant tables: thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvc::model {

// The code point byte b maps to.
uint32_t byte_to_code_point(uint8_t b);
// The byte a code point stands for, or nullopt when it is not in the alphabet.
std::optional<uint8_t> code_point_to_byte(uint32_t cp);

// Each byte of raw replaced by the UTF-8 of its code point.
std::string bytes_to_unicode(std::string_view raw);
// The inverse: each UTF-8 character of text replaced by the byte it stands for. Characters
// outside the alphabet (and bytes that are not valid UTF-8) are copied unchanged, so a token
// whose text is not byte-level (an added token written in plain text) still decodes to itself.
std::string unicode_to_bytes(std::string_view text);

}  // namespace kvc::model
