#include "cli/cli_options.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>

#include "base/byte_size.h"
#include "base/error.h"
#include "base/strings.h"
#include "kv/redis_store.h"
#include "kv/tier_codec.h"
#include "kv/tier_key.h"

namespace kvc::cli {

DType parse_kv_dtype(std::string_view name, std::string_view flag) {
  const std::string n = to_lower(trim(name));
  if (n == "int8" || n == "q8") return DType::Q8_0;
  if (n == "int4" || n == "q4") return DType::Q4_0;
  if (const auto t = parse_dtype(n)) {
    if (block_elements(*t) == 1 || *t == DType::Q8_0 || *t == DType::Q4_0) return *t;
    fail("{}: {} is a weight type; KV blocks are stored as f32, f16, q8_0 or q4_0", flag, name);
  }
  fail("{}: unknown KV dtype '{}'; use f32, f16, bf16, q8_0 (int8) or q4_0 (int4)", flag, name);
}

DType parse_pool_kv_dtype(std::string_view name, std::string_view flag) {
  const DType t = parse_kv_dtype(name, flag);
  if (t == DType::BF16) fail("{}: the KV pool stores f32, f16, q8_0 or q4_0, not bf16", flag);
  return t;
}

void add_kv_dtype_options(CLI::App& cmd, KvDtypeArgs& args, std::string_view fallback) {
  const std::string types = "f32, f16, q8_0 (int8) or q4_0 (int4)";
  cmd.add_option(
         "--kv-dtype", args.both,
         fmt::format("KV storage type of keys and values: {} (default {})", types, fallback))
      ->type_name("DTYPE");
  cmd.add_option("--kv-dtype-k", args.k, "Keys' storage type (alias -ctk; default --kv-dtype)")
      ->type_name("DTYPE");
  cmd.add_option("--kv-dtype-v", args.v, "Values' storage type (alias -ctv; default --kv-dtype)")
      ->type_name("DTYPE");
}

KvDtypes resolve_kv_dtypes(const KvDtypeArgs& args, DType fallback, bool pool_only) {
  const auto parse = [&](const std::string& name, std::string_view flag) {
    return pool_only ? parse_pool_kv_dtype(name, flag) : parse_kv_dtype(name, flag);
  };
  const DType both = args.both.empty() ? fallback : parse(args.both, "--kv-dtype");
  return KvDtypes{args.k.empty() ? both : parse(args.k, "--kv-dtype-k"),
                  args.v.empty() ? both : parse(args.v, "--kv-dtype-v")};
}

std::vector<char*> expand_llama_cpp_aliases(int argc, char** argv) {
  static char k_flag[] = "--kv-dtype-k";
  static char v_flag[] = "--kv-dtype-v";
  static char npl_flag[] = "--npl";
  std::vector<char*> out(argv, argv + argc);
  for (char*& arg : out) {
    if (std::string_view(arg) == "-ctk") arg = k_flag;
    if (std::string_view(arg) == "-ctv") arg = v_flag;
    if (std::string_view(arg) == "-npl") arg = npl_flag;
  }
  return out;
}

int thread_count(int requested) {
  return requested > 0 ? requested
                       : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

void add_mmap_option(CLI::App& cmd, bool& mmap) {
  cmd.add_flag("--mmap", mmap,
               "Map the model file instead of loading it into huge-page memory: starts at once "
               "and shares the page cache between processes, but decodes slower");
}

gguf::Residency model_residency(bool mmap) {
  return mmap ? gguf::Residency::kMapped : gguf::Residency::kLoaded;
}

void add_tier_options(CLI::App& cmd, TierArgs& args) {
  cmd.add_option("--kv-disk", args.disk,
                 "Directory of the disk KV tier: blocks are stored there as they are computed "
                 "and found again after a restart");
  cmd.add_option("--kv-disk-size", args.disk_size, "Bytes the disk tier may use")
      ->capture_default_str();
  cmd.add_option("--kv-redis", args.redis,
                 "Redis KV tier shared by instances: redis://[:PASSWORD@]HOST[:PORT][/DB]");
  cmd.add_option("--kv-redis-password-file", args.redis_password_file,
                 "File holding the Redis password (first line), instead of the URL's");
  cmd.add_option("--kv-disk-compress", args.disk_compress,
                 "Compress blocks in the disk tier: none, lz4 or zstd")
      ->capture_default_str();
  cmd.add_option("--kv-redis-compress", args.redis_compress,
                 "Compress blocks in the Redis tier: none, lz4 or zstd")
      ->capture_default_str();
  cmd.add_option("--kv-tier-key", args.key_file,
                 "Encrypt blocks in the disk and Redis tiers with AES-256-GCM under this key "
                 "(a file of 32 raw bytes or 64 hex digits); unencrypted blocks are then refused");
  cmd.add_option("--kv-tier-policy", args.policy,
                 "How blocks move to and from the tiers: cost (store, load and evict by measured "
                 "value) or keep-all (store every block, load every hit, evict by recency)")
      ->check(CLI::IsMember({"cost", "keep-all"}))
      ->capture_default_str();
}

namespace {

kv::TierCompression parse_compression(const std::string& value, std::string_view flag) {
  const auto c = kv::parse_tier_compression(value);
  if (!c) fail("{}: unknown compression '{}'; use none, lz4 or zstd", flag, value);
  return *c;
}

}  // namespace

void apply_tier_options(const TierArgs& args, engine::EngineOptions& eo) {
  engine::TierOptions& t = eo.kv_tiers;
  t.disk_dir = args.disk;
  t.disk_max_bytes = parse_byte_size(args.disk_size, "--kv-disk-size");
  t.disk_compression = parse_compression(args.disk_compress, "--kv-disk-compress");
  t.redis_compression = parse_compression(args.redis_compress, "--kv-redis-compress");
  if (!args.key_file.empty()) t.key = kv::load_tier_key(args.key_file);
  t.policy =
      args.policy == "keep-all" ? engine::TierPolicy::kKeepAll : engine::TierPolicy::kCostModel;
  if (!args.redis.empty()) {
    kv::parse_redis_url(args.redis);  // a malformed URL is an error at start-up
    t.redis_url = args.redis;
  }
  if (!args.redis_password_file.empty()) {
    std::ifstream in(args.redis_password_file);
    if (!in) fail("--kv-redis-password-file {}: cannot be read", args.redis_password_file);
    std::string line;
    std::getline(in, line);
    t.redis_password = std::string(trim(line));
    if (t.redis_password.empty()) {
      fail("--kv-redis-password-file {}: the first line is empty", args.redis_password_file);
    }
  }
}

}  // namespace kvc::cli
