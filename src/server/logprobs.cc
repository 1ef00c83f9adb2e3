#include "server/logprobs.h"

#include <algorithm>
#include <cmath>

#include "server/openai_protocol.h"

namespace kvc::server {

namespace {

// A token's text. A byte token that is part of a UTF-8 character is not valid text on its own:
// responses are serialised with invalid bytes replaced (U+FFFD), and "bytes" keeps the exact
// ones.
std::string token_text(const model::Tokenizer& tokenizer, int32_t id) {
  return tokenizer.piece(id);
}

// The text as a response carries it: invalid UTF-8 replaced by U+FFFD the way dump_json
// replaces it. Byte tokens of different bytes can carry the same text.
std::string text_as_sent(const std::string& text) {
  return nlohmann::json::parse(dump_json(nlohmann::json(text))).get<std::string>();
}

nlohmann::json bytes_of(const std::string& s) {
  nlohmann::json b = nlohmann::json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

}  // namespace

SampledLogprobs token_logprobs(std::span<const float> logits, int32_t chosen, int top_n) {
  // log p_i = x_i - (max + log sum exp(x_j - max)), in double so that a large vocabulary does
  // not lose the small terms.
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max);
  const double log_z = max + std::log(sum);
  const auto lp = [&](int32_t id) {
    return static_cast<float>(static_cast<double>(logits[static_cast<size_t>(id)]) - log_z);
  };
  SampledLogprobs out;
  out.chosen = {chosen, lp(chosen)};
  const size_t n = std::min(static_cast<size_t>(std::max(top_n, 0)), logits.size());
  if (n > 0) {
    std::vector<int32_t> ids(logits.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end(),
                      [&](int32_t a, int32_t b) {
                        const float xa = logits[static_cast<size_t>(a)];
                        const float xb = logits[static_cast<size_t>(b)];
                        return xa != xb ? xa > xb : a < b;
                      });
    for (size_t i = 0; i < n; ++i) out.top.push_back({ids[i], lp(ids[i])});
  }
  return out;
}

nlohmann::json chat_logprob_entry(const SampledLogprobs& lp, const model::Tokenizer& tokenizer) {
  const auto entry = [&](const TokenLogprob& t) {
    const std::string text = token_text(tokenizer, t.id);
    return nlohmann::json{{"token", text}, {"logprob", t.logprob}, {"bytes", bytes_of(text)}};
  };
  nlohmann::json e = entry(lp.chosen);
  nlohmann::json top = nlohmann::json::array();
  for (const auto& t : lp.top) top.push_back(entry(t));
  e["top_logprobs"] = top;
  return e;
}

void CompletionLogprobs::add(const SampledLogprobs& lp, const model::Tokenizer& tokenizer,
                             size_t text_offset) {
  tokens_.push_back(token_text(tokenizer, lp.chosen.id));
  token_logprobs_.push_back(lp.chosen.logprob);
  nlohmann::json top = nlohmann::json::object();
  for (const auto& t : lp.top) {
    // Tokens with the same text as sent (a byte token and a piece, or two byte tokens that
    // are both U+FFFD on their own) keep the likelier one, which comes first: an object with
    // a key twice is invalid for many parsers, and vLLM's dict keyed by text holds one too.
    const std::string text = text_as_sent(token_text(tokenizer, t.id));
    if (!top.contains(text)) top[text] = t.logprob;
  }
  top_logprobs_.push_back(top);
  text_offset_.push_back(text_offset);
}

nlohmann::json CompletionLogprobs::to_json() const {
  return {{"tokens", tokens_},
          {"token_logprobs", token_logprobs_},
          {"top_logprobs", top_logprobs_},
          {"text_offset", text_offset_}};
}

}  // namespace kvc::server
