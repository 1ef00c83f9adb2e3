#include "server/choice_accumulator.h"

#include "kv/prefix_index.h"
#include "server/openai_protocol.h"

namespace kvc::server {

std::optional<ApiError> failure_of(const engine::RequestHandle& h) {
  const std::string error = h.error();
  const bool cancelled = h.stats().finish_reason == engine::FinishReason::kCancelled;
  if (error.empty() && !cancelled) return std::nullopt;
  if (cancelled) {
    return ApiError(503, "server_error", error.empty() ? "the request was cancelled" : error, "",
                    "cancelled");
  }
  return ApiError(500, "server_error", error);
}

ChoiceAccumulator::ChoiceAccumulator(std::shared_ptr<Generation> gen, ResponseShape shape,
                                     const model::Tokenizer& tokenizer)
    : gen_(std::move(gen)),
      shape_(std::move(shape)),
      tokenizer_(tokenizer),
      choices_(gen_->size()) {}

ChoiceAccumulator::Update ChoiceAccumulator::add(const Generation::Event& e) {
  Update u;
  const size_t i = e.choice;
  if (e.finished) {
    const engine::RequestHandle& h = gen_->handle(i);
    if (auto failure = failure_of(h)) {
      u.failure = std::move(failure);
      return u;
    }
    const engine::RequestStats s = h.stats();
    nlohmann::json choice = {
        {"index", i},
        {"logprobs", nullptr},
        {"finish_reason", openai_finish_reason(engine::finish_reason_name(s.finish_reason))}};
    if (shape_.chat) {
      choice["delta"] = nlohmann::json::object();
    } else {
      choice["text"] = "";
    }
    u.choice = std::move(choice);
    u.kvcache = kvcache_json(s, kv::steady_clock_ms()());
    return u;
  }
  Choice& c = choices_[i];
  const engine::TokenEvent& t = e.token;
  nlohmann::json lp = nullptr;
  if (shape_.logprobs && t.token >= 0 && !t.logits.empty()) {
    const SampledLogprobs s = token_logprobs(t.logits, t.token, shape_.top_logprobs);
    if (shape_.chat) {
      nlohmann::json entry = chat_logprob_entry(s, tokenizer_);
      c.chat_logprobs.push_back(entry);
      lp = {{"content", nlohmann::json::array({std::move(entry)})}};
    } else {
      // The streamed chunk carries this token's entry alone, at its offset in the choice.
      CompletionLogprobs one;
      one.add(s, tokenizer_, c.text.size());
      lp = one.to_json();
      c.logprobs.add(s, tokenizer_, c.text.size());
    }
  }
  c.text += t.text;
  if (t.text.empty() && lp.is_null()) return u;
  nlohmann::json choice = {{"index", i}, {"logprobs", lp}, {"finish_reason", nullptr}};
  if (shape_.chat) {
    choice["delta"] = {{"content", t.text}};
  } else {
    choice["text"] = t.text;
  }
  u.choice = std::move(choice);
  return u;
}

nlohmann::json ChoiceAccumulator::usage() const {
  size_t prompt = 0, cached = 0, completion = 0;
  for (size_t i = 0; i < gen_->size(); ++i) {
    const engine::RequestStats s = gen_->handle(i).stats();
    completion += s.generated_tokens;
    if (i % shape_.samples_per_prompt == 0) {
      prompt += s.prompt_tokens;
      cached += s.cached_tokens;
    }
  }
  return usage_json(prompt, completion, cached);
}

nlohmann::json ChoiceAccumulator::kvcache_summary() const {
  const double now = kv::steady_clock_ms()();
  nlohmann::json k = kvcache_json(gen_->handle(0).stats(), now);
  if (gen_->size() > 1) {
    nlohmann::json all = nlohmann::json::array();
    for (size_t i = 0; i < gen_->size(); ++i) {
      all.push_back(kvcache_json(gen_->handle(i).stats(), now));
    }
    k["choices"] = all;
  }
  return k;
}

nlohmann::json ChoiceAccumulator::response() const {
  nlohmann::json choices = nlohmann::json::array();
  for (size_t i = 0; i < gen_->size(); ++i) {
    if (const auto failure = failure_of(gen_->handle(i))) throw *failure;
    const Choice& c = choices_[i];
    nlohmann::json choice = {
        {"index", i},
        {"finish_reason",
         openai_finish_reason(engine::finish_reason_name(gen_->handle(i).stats().finish_reason))}};
    if (shape_.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      choice["logprobs"] =
          shape_.logprobs ? nlohmann::json{{"content", c.chat_logprobs}} : nlohmann::json(nullptr);
    } else {
      choice["text"] = c.text;
      choice["logprobs"] = shape_.logprobs ? c.logprobs.to_json() : nlohmann::json(nullptr);
    }
    choices.push_back(std::move(choice));
  }
  return {{"id", shape_.id},
          {"object", shape_.chat ? "chat.completion" : "text_completion"},
          {"created", shape_.created},
          {"model", shape_.model},
          {"choices", choices},
          {"usage", usage()},
          {"kvcache", kvcache_summary()}};
}

}  // namespace kvc::server
