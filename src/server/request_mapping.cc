#include "server/request_mapping.h"

#include <fmt/format.h>

#include <algorithm>

#include "engine/generation_options.h"
#include "server/api_error.h"

namespace kvc::server {

std::string resolve_model(const Backend& backend, const std::string& requested) {
  if (requested.empty()) return backend.model_id;
  for (const auto& name : backend.model_names()) {
    if (name == requested) return requested;
  }
  throw ApiError(
      404, "invalid_request_error",
      fmt::format("The model `{}` does not exist or you do not have access to it.", requested),
      "model", "model_not_found");
}

std::vector<int32_t> encode_prompt(const PromptInput& p, const model::Tokenizer& tokenizer,
                                   bool add_bos, const std::string& param) {
  if (p.text) {
    std::vector<int32_t> ids = tokenizer.encode(*p.text, add_bos && tokenizer.add_bos());
    if (ids.empty() && add_bos && tokenizer.bos_id() >= 0) ids.push_back(tokenizer.bos_id());
    return ids;
  }
  for (int32_t t : p.tokens) {
    if (t >= tokenizer.size()) {
      bad_field(param, fmt::format("token id {} is outside the vocabulary of {} tokens", t,
                                   tokenizer.size()));
    }
  }
  return p.tokens;
}

void check_prompt_fits(size_t prompt_tokens, size_t context, const std::string& param) {
  if (prompt_tokens >= context) {
    throw ApiError(400, "invalid_request_error",
                   fmt::format("the prompt has {} tokens but the model's context is {} tokens "
                               "(the prompt and at least one generated token must fit)",
                               prompt_tokens, context),
                   param, "context_length_exceeded");
  }
}

void check_prompt_fits_pool(size_t prompt_tokens, const engine::Engine& engine,
                            const std::string& param) {
  // The engine's own check covers the prompt and max_tokens together, and so names
  // max_tokens; when the prompt alone is too large, lowering max_tokens would not help.
  const size_t need = engine.geometry().blocks_for_sequence(prompt_tokens + 1);
  if (need > engine.num_blocks()) {
    throw ApiError(400, "invalid_request_error",
                   fmt::format("the prompt has {} tokens and needs {} KV blocks with one generated "
                               "token, but the pool has {} blocks in all; shorten the {} or raise "
                               "--kv-memory",
                               prompt_tokens, need, engine.num_blocks(), param),
                   param, "context_length_exceeded");
  }
}

std::vector<int32_t> prompt_tokens(const Backend& b, const nlohmann::json& body, bool add_special,
                                   const std::string& what) {
  const model::Tokenizer& tokenizer = b.tokenizer();
  const JsonFields f(body);
  if (const auto* m = f.raw("messages"))
    return b.chat_template.apply(parse_messages(*m), tokenizer);
  // llama.cpp's /tokenize calls its text "content"; the OpenAI-style endpoints say "prompt".
  const auto* p = f.raw("prompt");
  std::string param = "prompt";
  if (!p && (p = f.raw("content"))) param = "content";
  if (!p) bad_field("prompt", fmt::format("{} needs a prompt (or messages)", what));
  const std::vector<PromptInput> prompts = parse_prompts(*p);
  if (prompts.size() != 1) bad_field(param, fmt::format("{} takes one prompt", what));
  return encode_prompt(prompts[0], tokenizer, add_special, param);
}

std::string render_chat_prompt(const Backend& b, const std::vector<ChatMessage>& messages,
                               bool add_generation_prompt) {
  return b.chat_template.render(messages, add_generation_prompt);
}

std::vector<engine::Request> map_completion(const CompletionRequest& r, const Backend& b,
                                            const std::string& tenant, const kv::Hash256& ns) {
  const engine::Engine& engine = b.engine();
  const model::Tokenizer& tokenizer = b.tokenizer();
  const size_t context = static_cast<size_t>(b.context_length());

  engine::GenerationOptions o;
  o.stop = r.stop;
  o.stop_tokens = r.stop_token_ids;
  for (int32_t t : o.stop_tokens) {
    if (t >= tokenizer.size()) {
      bad_field("stop_token_ids", fmt::format("token id {} is outside the vocabulary of {} tokens",
                                              t, tokenizer.size()));
    }
  }
  std::vector<std::vector<int32_t>> prompts;
  if (r.chat) {
    prompts.push_back(b.chat_template.apply(r.messages, tokenizer, r.add_generation_prompt));
    if (!r.ignore_eos) b.chat_template.end_of_turn(tokenizer, o.stop_tokens, o.stop);
  } else {
    for (const auto& p : r.prompts) prompts.push_back(encode_prompt(p, tokenizer, true, "prompt"));
  }
  const std::string prompt_param = r.chat ? "messages" : "prompt";
  for (const auto& p : prompts) {
    check_prompt_fits(p.size(), context, prompt_param);
    check_prompt_fits_pool(p.size(), engine, prompt_param);
  }

  // One call that could never fit the waiting queue is refused for good, not as overload: a
  // client that honours Retry-After would otherwise retry forever.
  const size_t total = prompts.size() * static_cast<size_t>(r.n);
  const size_t max_waiting = engine.options().max_waiting;
  if (total > max_waiting) {
    throw ApiError(400, "invalid_request_error",
                   fmt::format("the request asks for {} generations ({} prompts x n={}) but the "
                               "server queues at most {} (--max-waiting)",
                               total, prompts.size(), r.n, max_waiting),
                   r.n > 1 ? "n" : "prompt", "too_many_generations");
  }

  o.sampling.temperature = r.temperature;
  o.sampling.top_k = r.top_k;
  o.sampling.top_p = r.top_p;
  o.sampling.min_p = r.min_p;
  o.sampling.repeat_penalty = r.repetition_penalty;
  o.sampling.seed = r.seed ? *r.seed : engine::fresh_seed();
  o.ignore_eos = r.ignore_eos;
  o.ns = ns;
  // OpenAI's defaults: 16 tokens for completions; for chat the rest of the room, the context or
  // what the KV pool holds when that is less, so that leaving it out is never refused as too
  // large.
  if (r.max_tokens) {
    o.max_tokens = *r.max_tokens;
  } else if (r.chat) {
    const size_t pool_tokens = engine.num_blocks() * engine.geometry().block_tokens;
    const size_t room = std::min(context, pool_tokens);
    const size_t prompt = prompts.front().size();
    o.max_tokens = room > prompt + 1 ? static_cast<int>(room - prompt) : 1;
  } else {
    o.max_tokens = 16;
  }
  std::vector<engine::Request> requests =
      engine::make_requests(prompts, static_cast<size_t>(r.n), o);
  for (auto& q : requests) q.record_logits = r.logprobs;
  // Sessions are per tenant: two tenants' "session 1" are different conversations. Only the
  // first sample keeps its blocks for the next turn.
  if (!r.session_id.empty()) requests.front().session_id = tenant + "\n" + r.session_id;
  return requests;
}

}  // namespace kvc::server
