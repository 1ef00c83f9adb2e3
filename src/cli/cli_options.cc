#include "cli/cli_options.h"

#include <algorithm>
#include <thread>

#include "base/error.h"
#include "base/strings.h"

namespace kvc::cli {

DType parse_kv_dtype(std::string_view name) {
  const std::string n = to_lower(trim(name));
  if (n == "int8" || n == "q8") return DType::Q8_0;
  if (n == "int4" || n == "q4") return DType::Q4_0;
  if (const auto t = parse_dtype(n)) return *t;
  fail("--kv-dtype: unknown KV dtype '{}'; use f32, f16, bf16, q8_0 (int8) or q4_0 (int4)", name);
}

DType parse_pool_kv_dtype(std::string_view name) {
  const DType t = parse_kv_dtype(name);
  if (t != DType::F32 && t != DType::F16) {
    fail("--kv-dtype: the KV pool stores f32 or f16 today, got '{}'", name);
  }
  return t;
}

int thread_count(int requested) {
  return requested > 0 ? requested
                       : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace kvc::cli
