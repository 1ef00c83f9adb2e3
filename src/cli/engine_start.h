// Starting the engine for `kvcache run` and `kvcache serve`: a KV pool that cannot be allocated
// is a clear error naming what sized it, not an out-of-memory crash.
#pragma once

#include <memory>
#include <string>

#include "engine/engine.h"
#include "model/llama_model.h"
#include "model/tokenizer.h"

namespace kvc::cli {

// The engine of options; throws Error naming the pool's size and what set it (kv_memory_flag,
// the --kv-memory value given, or the model's context length when it is empty) when its pool
// cannot be allocated.
std::unique_ptr<engine::Engine> start_engine(const model::LlamaModel& model,
                                             const model::Tokenizer& tokenizer,
                                             const engine::EngineOptions& options,
                                             const std::string& kv_memory_flag);

}  // namespace kvc::cli
