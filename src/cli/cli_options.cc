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

namespace kvc::cli {

DType parse_kv_dtype(std::string_view name, std::string_view flag) {
  const std::string n = to_lower(trim(name));
  if (n == "int8" || n == "q8") return DType::Q8_0;
  if (n == "int4" || n == "q4") return DType::Q4_0;
  if (const auto t = parse_dtype(n)) return *t;
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

std::vector<char*> expand_kv_dtype_aliases(int argc, char** argv) {
  static char k_flag[] = "--kv-dtype-k";
  static char v_flag[] = "--kv-dtype-v";
  std::vector<char*> out(argv, argv + argc);
  for (char*& arg : out) {
    if (std::string_view(arg) == "-ctk") arg = k_flag;
    if (std::string_view(arg) == "-ctv") arg = v_flag;
  }
  return out;
}

int thread_count(int requested) {
  return requested > 0 ? requested
                       : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
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
}

void apply_tier_options(const TierArgs& args, engine::EngineOptions& eo) {
  eo.kv_disk_dir = args.disk;
  eo.kv_disk_max_bytes = parse_byte_size(args.disk_size, "--kv-disk-size");
  if (!args.redis.empty()) {
    kv::parse_redis_url(args.redis);  // a malformed URL is an error at start-up
    eo.kv_redis_url = args.redis;
  }
  if (!args.redis_password_file.empty()) {
    std::ifstream in(args.redis_password_file);
    if (!in) fail("--kv-redis-password-file {}: cannot be read", args.redis_password_file);
    std::string line;
    std::getline(in, line);
    eo.kv_redis_password = std::string(trim(line));
    if (eo.kv_redis_password.empty()) {
      fail("--kv-redis-password-file {}: the first line is empty", args.redis_password_file);
    }
  }
}

}  // namespace kvc::cli
