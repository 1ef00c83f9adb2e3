// The one place a generation's events become OpenAI choices: text and log-probs per choice,
// finish reasons, failures, usage and the `kvcache` figures. A streamed answer sends what
// add() returns as it comes; a whole answer calls add() for every event, then response().
//
// Thread-safety: none; one accumulator belongs to the thread answering its request.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/tokenizer.h"
#include "server/api_error.h"
#include "server/generation.h"
#include "server/logprobs.h"

namespace kvc::server {

// What a completion response looks like, shared by the whole and the streamed forms.
struct ResponseShape {
  bool chat = false;
  std::string id;
  int64_t created = 0;
  std::string model;
  size_t samples_per_prompt = 1;
  bool logprobs = false;
  int top_logprobs = 0;
  bool include_usage = false;
};

// Why a request ended without completing, as an API error (nullopt when it completed).
std::optional<ApiError> failure_of(const engine::RequestHandle& h);

class ChoiceAccumulator {
 public:
  ChoiceAccumulator(std::shared_ptr<Generation> gen, ResponseShape shape,
                    const model::Tokenizer& tokenizer);

  // What one event adds to its choice, for a stream chunk.
  struct Update {
    std::optional<nlohmann::json> choice;  // the chunk's choice object (nothing to send: none)
    nlohmann::json kvcache;                // with a finish: the choice's `kvcache` figures
    std::optional<ApiError> failure;       // the choice failed (a stream sends the error)
  };
  Update add(const Generation::Event& e);

  // The whole response (once every choice ended); throws the first choice's failure.
  nlohmann::json response() const;
  // Usage over every choice: each prompt counted once, completions summed.
  nlohmann::json usage() const;
  // The first choice's `kvcache` figures, and with several choices each one's.
  nlohmann::json kvcache_summary() const;

  const ResponseShape& shape() const { return shape_; }
  Generation& generation() { return *gen_; }

 private:
  struct Choice {
    std::string text;
    nlohmann::json chat_logprobs = nlohmann::json::array();
    CompletionLogprobs logprobs;
  };

  std::shared_ptr<Generation> gen_;
  ResponseShape shape_;
  const model::Tokenizer& tokenizer_;
  std::vector<Choice> choices_;
};

}  // namespace kvc::server
