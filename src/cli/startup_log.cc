#include "cli/startup_log.h"

#include <spdlog/spdlog.h>

#include <sstream>

#include "base/byte_size.h"
#include "engine/kv_pool_size.h"
#include "kv/memory_plan.h"

namespace kvc::cli {

void log_model_and_pool(const std::string& path, const model::LlamaModel& model,
                        const engine::Engine& engine) {
  const model::LlamaConfig& config = model.config();
  spdlog::info(
      "model {}: {} ({} layers, {} heads / {} KV heads, dim {}, vocab {}, context {}), "
      "weights {} {}",
      path, config.name, config.n_layers, config.n_heads, config.n_kv_heads, config.n_embd,
      config.n_vocab, config.context_length, dtype_name(model.weight_dtype()),
      format_bytes(model.weight_bytes()));
  std::istringstream summary(
      kv::startup_summary(engine.geometry(), engine.arena_bytes(), config.context_length));
  for (std::string line; std::getline(summary, line);) spdlog::info("{}", line);
  const auto context = static_cast<size_t>(config.context_length);
  if (engine.geometry().blocks_for_sequence(context) > engine.num_blocks()) {
    spdlog::info(
        "KV cache: the pool holds less than one sequence of the model's {}.context_length of {} "
        "tokens (a default pool takes at most {}); pass --kv-memory to set its size",
        config.architecture, context, format_bytes(engine::kMaxDefaultKvPoolBytes));
  }
}

}  // namespace kvc::cli
