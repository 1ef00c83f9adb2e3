// The log lines `kvcache run` and `kvcache serve` open with: the model and the KV pool.
#pragma once

#include <string>

#include "engine/engine.h"
#include "model/llama_model.h"

namespace kvc::cli {

// Logs the model loaded from path (shape, weight type and size) and the engine's KV pool (the
// figures `kvcache plan` prints, from the same code).
void log_model_and_pool(const std::string& path, const model::LlamaModel& model,
                        const engine::Engine& engine);

}  // namespace kvc::cli
