// The id of a block in the KV pool.
//
// Thread-safety: a plain value.
#pragma once

#include <cstdint>

namespace kvc::kv {

using BlockId = int32_t;

}  // namespace kvc::kv
