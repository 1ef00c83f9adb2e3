// Option values shared by the commands that run a model (`run`, `serve`).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <string_view>

#include "base/dtype.h"
#include "engine/engine.h"

namespace kvc::cli {

// A --kv-dtype value: f32, f16, bf16, q8_0 (int8, q8) or q4_0 (int4, q4), any case; throws
// Error naming the choices otherwise.
DType parse_kv_dtype(std::string_view name);
// A --kv-dtype value the block pool can store (f32 or f16); throws Error otherwise.
DType parse_pool_kv_dtype(std::string_view name);
// The --threads value: requested if positive, else every core.
int thread_count(int requested);

// The lower KV tiers' flags, shared by run and serve.
struct TierArgs {
  std::string disk;                     // --kv-disk DIR
  std::string disk_size = "10GiB";      // --kv-disk-size BYTES
  std::string redis;                    // --kv-redis URL
  std::string redis_password_file;      // --kv-redis-password-file FILE
  std::string disk_compress = "none";   // --kv-disk-compress none|lz4|zstd
  std::string redis_compress = "none";  // --kv-redis-compress none|lz4|zstd
  std::string key_file;                 // --kv-tier-key FILE
  std::string policy = "cost";          // --kv-tier-policy cost|keep-all
};
void add_tier_options(CLI::App& cmd, TierArgs& args);
// Copies the tier flags into eo; throws Error naming the flag for a bad size, URL or file.
void apply_tier_options(const TierArgs& args, engine::EngineOptions& eo);

}  // namespace kvc::cli
