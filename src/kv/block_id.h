// The id of a block in the KV pool.
#pragma once

#include <cstdint>

namespace kvc::kv {

using BlockId = int32_t;

}  // namespace kvc::kv
