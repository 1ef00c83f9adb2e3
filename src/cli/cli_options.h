// Option values shared by the commands that run a model (`run`, `serve`, `bench`, `plan`,
// `perplexity`).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "base/dtype.h"
#include "engine/engine.h"
#include "model/gguf.h"

namespace kvc::cli {

// A KV dtype value of `flag`: f32, f16, bf16, q8_0 (int8, q8) or q4_0 (int4, q4), any case;
// throws Error naming the flag and the choices otherwise.
DType parse_kv_dtype(std::string_view name, std::string_view flag = "--kv-dtype");
// A KV dtype the block pool can store (f32, f16, q8_0, q4_0); throws Error otherwise.
DType parse_pool_kv_dtype(std::string_view name, std::string_view flag = "--kv-dtype");

// The KV storage type flags: --kv-dtype sets both, --kv-dtype-k / --kv-dtype-v (llama.cpp's
// -ctk / -ctv) override it for keys or values.
struct KvDtypeArgs {
  std::string both;  // --kv-dtype
  std::string k;     // --kv-dtype-k
  std::string v;     // --kv-dtype-v
};
struct KvDtypes {
  DType k = DType::F16;
  DType v = DType::F16;
};
// Adds the three flags to cmd; fallback names the type used when none is given.
void add_kv_dtype_options(CLI::App& cmd, KvDtypeArgs& args, std::string_view fallback);
// The K and V types the flags choose (fallback where none is given), parsed with
// parse_pool_kv_dtype when pool_only, else parse_kv_dtype; throws Error naming the flag.
KvDtypes resolve_kv_dtypes(const KvDtypeArgs& args, DType fallback, bool pool_only);
// argv with llama.cpp's -ctk / -ctv / -npl spelled --kv-dtype-k / --kv-dtype-v / --npl (CLI11
// takes only one-letter short options); the pointers stay those of argv or static strings.
std::vector<char*> expand_llama_cpp_aliases(int argc, char** argv);
// The --threads value: requested if positive, else every core.
int thread_count(int requested);
// Adds --mmap: map the model file from the page cache instead of loading it into huge-page
// memory (llama.cpp maps by default and loads with --no-mmap).
void add_mmap_option(CLI::App& cmd, bool& mmap);
// The residency that the --mmap flag's value chooses.
gguf::Residency model_residency(bool mmap);

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
