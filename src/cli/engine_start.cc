#include "cli/engine_start.h"

#include <new>

#include "base/byte_size.h"
#include "base/error.h"
#include "engine/kv_pool_size.h"

namespace kvc::cli {

std::unique_ptr<engine::Engine> start_engine(const model::LlamaModel& model,
                                             const model::Tokenizer& tokenizer,
                                             const engine::EngineOptions& options,
                                             const std::string& kv_memory_flag) {
  try {
    return std::make_unique<engine::Engine>(model, tokenizer, options);
  } catch (const std::bad_alloc&) {
    const model::LlamaConfig& c = model.config();
    if (kv_memory_flag.empty()) {
      fail(
          "cannot allocate the default KV pool (sized by the model's {}.context_length of {} "
          "tokens, at most {}); pass a smaller --kv-memory (e.g. 256MiB)",
          c.architecture, c.context_length, format_bytes(engine::kMaxDefaultKvPoolBytes));
    }
    fail("cannot allocate the KV pool of {} that --kv-memory asks for; pass a smaller size",
         kv_memory_flag);
  }
}

}  // namespace kvc::cli
