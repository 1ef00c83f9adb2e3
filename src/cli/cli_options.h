// Option values shared by the commands that run a model (`run`, `serve`).
#pragma once

#include <string>

#include "base/dtype.h"

namespace kvc::cli {

// The --kv-dtype value: f32 or f16 (what the block pool stores); throws Error otherwise.
DType parse_kv_dtype(const std::string& name);
// The --threads value: requested if positive, else every core.
int thread_count(int requested);

}  // namespace kvc::cli
