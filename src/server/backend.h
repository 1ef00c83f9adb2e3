// What the server serves once the model is loaded: the engine, the chat template and the
// names the model answers to.
//
// Thread-safety: a plain value, written once before the server is ready and only read after.
#pragma once

#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/chat_template.h"

namespace kvc::server {

struct Backend {
  engine::Engine* engine = nullptr;  // must outlive the server
  ChatTemplate chat_template{ChatFormat::kChatml};
  std::string model_id;  // the id /v1/models lists first and responses carry by default
  // Further names the model answers to (--served-model-name), listed by /v1/models too.
  std::vector<std::string> served_model_names;

  // model_id, then each served name not equal to an earlier one.
  std::vector<std::string> model_names() const {
    std::vector<std::string> out = {model_id};
    for (const auto& n : served_model_names) {
      bool seen = false;
      for (const auto& o : out) seen = seen || o == n;
      if (!seen) out.push_back(n);
    }
    return out;
  }
};

}  // namespace kvc::server
