// The key that encrypts blocks leaving the process (disk and Redis tiers) with AES-256-GCM:
// keys and values can be inverted to recover prompt text, so an operator may keep them
// unreadable at rest.
//
// Thread-safety: values; safe from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>

namespace kvc::kv {

using TierKey = std::array<uint8_t, 32>;

// Reads a key file: exactly 32 raw bytes, or 64 hex digits (surrounding whitespace allowed).
// Throws Error naming the file and what is wrong with it.
TierKey load_tier_key(const std::filesystem::path& file);

}  // namespace kvc::kv
