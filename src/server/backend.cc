#include "server/backend.h"

#include <fmt/format.h>

#include "server/api_error.h"

namespace kvc::server {

Backend Backend::generating(engine::Engine& engine) {
  Backend b;
  b.tokenizer_ = &engine.tokenizer();
  b.context_length_ = engine.model().config().context_length;
  b.engine_ = &engine;
  return b;
}

Backend Backend::tokenizer_only(const model::Tokenizer& tokenizer, int context_length) {
  Backend b;
  b.tokenizer_ = &tokenizer;
  b.context_length_ = context_length;
  return b;
}

engine::Engine& Backend::engine() const {
  // 400 rather than 501: the OpenAI client libraries retry 5xx answers, and no retry can
  // help; vLLM too answers 400 when a model does not support an endpoint.
  if (engine_ == nullptr) {
    throw ApiError(400, "invalid_request_error",
                   fmt::format("{} is a vocabulary-only GGUF (no weights): only /tokenize, "
                               "/detokenize and /apply-template are served",
                               model_id),
                   "", "model_has_no_weights");
  }
  return *engine_;
}

std::vector<std::string> Backend::model_names() const {
  std::vector<std::string> out = {model_id};
  for (const auto& n : served_model_names) {
    bool seen = false;
    for (const auto& o : out) seen = seen || o == n;
    if (!seen) out.push_back(n);
  }
  return out;
}

}  // namespace kvc::server
