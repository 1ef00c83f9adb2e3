#include "cli/startup_log.h"

#include <spdlog/spdlog.h>

#include <sstream>

#include "base/byte_size.h"
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
}

}  // namespace kvc::cli
