// Where `kvcache` commands find their model: a named GGUF file, or the embedded default (the
// `tiny` synthetic model, written on first use to the user's cache directory).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "base/dtype.h"

namespace kvc::cli {

// $KVCACHE_CACHE_DIR, else $XDG_CACHE_HOME/kvcache, else ~/.cache/kvcache (created if absent).
std::string cache_dir();
// Path of a synthetic model in the cache directory, writing it (with a progress bar on
// stderr) when it is not there yet.
std::string ensure_synthetic_model(const std::string& preset, DType dtype);
// model if non-empty, else the default model (created on first use, with a log line saying
// that it produces random text and how to pass a real GGUF).
std::string resolve_model(const std::string& model);
// A progress callback drawing "label [#####     ] 45%  500.0 MiB / 1.1 GiB" on stderr:
// redrawn in place on a terminal, a few lines at most otherwise.
std::function<void(uint64_t, uint64_t)> progress_bar(const std::string& label);

}  // namespace kvc::cli
