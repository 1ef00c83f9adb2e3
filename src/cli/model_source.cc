#include "cli/model_source.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "base/byte_size.h"
#include "base/error.h"
#include "model/synthetic_model.h"

namespace kvc::cli {

std::string cache_dir() {
  std::filesystem::path dir;
  if (const char* d = std::getenv("KVCACHE_CACHE_DIR"); d && *d) {
    dir = d;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
    dir = std::filesystem::path(x) / "kvcache";
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    dir = std::filesystem::path(h) / ".cache" / "kvcache";
  } else {
    fail("no cache directory: set KVCACHE_CACHE_DIR or HOME");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("cannot create cache directory '{}': {}", dir.string(), ec.message());
  return dir.string();
}

std::function<void(uint64_t, uint64_t)> progress_bar(const std::string& label) {
  const bool tty = isatty(STDERR_FILENO) != 0;
  return [label, tty, last = uint64_t{0}](uint64_t done, uint64_t total) mutable {
    if (!tty && done != total && done - last < total / 4) return;
    last = done;
    constexpr int kWidth = 30;
    const double f = total ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
    const int filled = static_cast<int>(f * kWidth);
    std::string bar(filled, '#');
    bar.resize(kWidth, ' ');
    std::fprintf(stderr, "%s%s [%s] %3d%%  %s / %s%s", tty ? "\r" : "", label.c_str(), bar.c_str(),
                 static_cast<int>(f * 100), format_bytes(done).c_str(), format_bytes(total).c_str(),
                 (done >= total || !tty) ? "\n" : "");
    std::fflush(stderr);
  };
}

std::string ensure_synthetic_model(const std::string& preset, DType dtype) {
  const std::string path =
      fmt::format("{}/synthetic-{}-{}.gguf", cache_dir(), preset, dtype_name(dtype));
  if (std::filesystem::exists(path)) return path;
  model::SyntheticOptions options;
  options.preset = preset;
  options.dtype = dtype;
  spdlog::info("writing synthetic model {} ({}) to {}", preset, dtype_name(dtype), path);
  model::write_synthetic_model(options, path, progress_bar("make-model"));
  return path;
}

std::string resolve_model(const std::string& model) {
  if (!model.empty()) return model;
  const std::string path = ensure_synthetic_model("tiny", DType::F32);
  spdlog::info(
      "no model given: using the embedded default {}, a tiny synthetic model with "
      "random weights that produces random text; pass a real GGUF with -m FILE.gguf",
      path);
  return path;
}

}  // namespace kvc::cli
