// Log-probabilities of generated tokens, computed from the raw logits the engine attaches to
// each token event: log-softmax over the whole vocabulary (before temperature, penalties and
// truncation, as OpenAI and vLLM report them), and the most likely alternatives.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace kvc::server {

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;
};

struct SampledLogprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;  // most likely first; ties by lower id
};

// The chosen token's log-probability and the top_n most likely tokens, from one row of logits.
SampledLogprobs token_logprobs(std::span<const float> logits, int32_t chosen, int top_n);

// Chat format: one entry of choices[].logprobs.content ({token, logprob, bytes, top_logprobs}).
nlohmann::json chat_logprob_entry(const SampledLogprobs& lp, const model::Tokenizer& tokenizer);

// Legacy completions format ({tokens, token_logprobs, top_logprobs, text_offset}), built up one
// token at a time.
class CompletionLogprobs {
 public:
  // Adds one token whose text starts at byte offset text_offset of the choice's text.
  void add(const SampledLogprobs& lp, const model::Tokenizer& tokenizer, size_t text_offset);
  // The choice's "logprobs" object.
  nlohmann::json to_json() const;

 private:
  nlohmann::json tokens_ = nlohmann::json::array();
  nlohmann::json token_logprobs_ = nlohmann::json::array();
  nlohmann::json top_logprobs_ = nlohmann::json::array();
  nlohmann::json text_offset_ = nlohmann::json::array();
};

}  // namespace kvc::server
