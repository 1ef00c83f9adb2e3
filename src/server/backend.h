// What the server serves once the model is loaded: the tokenizer and chat template, the engine
// that generates (none for a vocabulary-only GGUF: the tokenizer-only mode), and the names the
// model answers to.
//
// Thread-safety: a plain value, written once before the server is ready and only read after.
#pragma once

#include <string>
#include <vector>

#include "engine/engine.h"
#include "model/tokenizer.h"
#include "server/chat_template.h"

namespace kvc::server {

class Backend {
 public:
  // Generation through engine (which must outlive the server), with its tokenizer and context.
  static Backend generating(engine::Engine& engine);
  // The tokenizer-only mode of a vocabulary-only GGUF: /tokenize, /detokenize and
  // /apply-template work, and every endpoint that needs the engine answers 400 (see engine()).
  // tokenizer must outlive the server; context_length is the file's, or 0 when it names none.
  static Backend tokenizer_only(const model::Tokenizer& tokenizer, int context_length);

  ChatTemplate chat_template{ChatFormat::kChatml};
  std::string model_id;  // the id /v1/models lists first and responses carry by default
  // Further names the model answers to (--served-model-name), listed by /v1/models too.
  std::vector<std::string> served_model_names;

  const model::Tokenizer& tokenizer() const { return *tokenizer_; }
  // max_model_len, as /v1/models and /tokenize report it.
  int context_length() const { return context_length_; }
  // Whether there is an engine: false in the tokenizer-only mode.
  bool generates() const { return engine_ != nullptr; }
  // The engine. In the tokenizer-only mode throws ApiError 400 (code model_has_no_weights)
  // saying that the model is a vocabulary-only GGUF and which endpoints it serves: every use
  // of the engine passes here, so each generation and cache endpoint refuses the same way.
  engine::Engine& engine() const;

  // model_id, then each served name not equal to an earlier one.
  std::vector<std::string> model_names() const;

 private:
  Backend() = default;  // only through generating() or tokenizer_only()

  const model::Tokenizer* tokenizer_ = nullptr;
  int context_length_ = 0;
  engine::Engine* engine_ = nullptr;
};

}  // namespace kvc::server
