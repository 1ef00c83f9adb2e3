// Models for tests: the real stories260K (found through KVCACHE_TEST_MODEL) and synthetic
// ones written once per test process into its scratch directory.
#pragma once

#include <gtest/gtest.h>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "base/dtype.h"
#include "model/synthetic_model.h"
#include "scratch_dir.h"

namespace kvc::testing {

// Path of stories260K.gguf, or "" when KVCACHE_TEST_MODEL is unset or missing.
inline std::string stories_model_path() {
  const char* p = std::getenv("KVCACHE_TEST_MODEL");
  if (p == nullptr || !std::filesystem::exists(p)) return "";
  return p;
}

#define KVC_REQUIRE_STORIES(path)                                                         \
  const std::string path = ::kvc::testing::stories_model_path();                          \
  if (path.empty()) {                                                                     \
    GTEST_SKIP() << "KVCACHE_TEST_MODEL is not set to stories260K.gguf (.ci/run sets it " \
                    "from ../shared/models/stories260K.gguf)";                            \
  }

// A synthetic model of the given preset and dtype, written on first use.
inline std::string synthetic_model_path(const std::string& preset, DType dtype, int layers = 0) {
  static std::map<std::string, std::string> written;
  const std::string key =
      preset + "-" + std::string(dtype_name(dtype)) + "-" + std::to_string(layers);
  auto it = written.find(key);
  if (it != written.end()) return it->second;
  const std::string path = (scratch_dir() / (key + ".gguf")).string();
  model::SyntheticOptions o;
  o.preset = preset;
  o.dtype = dtype;
  o.layers = layers;
  model::write_synthetic_model(o, path);
  written[key] = path;
  return path;
}

}  // namespace kvc::testing
