#include "cli/cli_options.h"

#include <algorithm>
#include <thread>

#include "base/error.h"

namespace kvc::cli {

DType parse_kv_dtype(const std::string& name) {
  const auto t = parse_dtype(name);
  if (!t || (*t != DType::F32 && *t != DType::F16)) {
    fail("--kv-dtype must be f32 or f16, got '{}'", name);
  }
  return *t;
}

int thread_count(int requested) {
  return requested > 0 ? requested
                       : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace kvc::cli
