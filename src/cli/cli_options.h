// Option values shared by the commands that run a model (`run`, `serve`).
#pragma once

#include <string>
#include <string_view>

#include "base/dtype.h"

namespace kvc::cli {

// A --kv-dtype value: f32, f16, bf16, q8_0 (int8, q8) or q4_0 (int4, q4), any case; throws
// Error naming the choices otherwise.
DType parse_kv_dtype(std::string_view name);
// A --kv-dtype value the block pool can store (f32 or f16); throws Error otherwise.
DType parse_pool_kv_dtype(std::string_view name);
// The --threads value: requested if positive, else every core.
int thread_count(int requested);

}  // namespace kvc::cli
