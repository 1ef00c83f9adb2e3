// From a validated API request to engine requests: prompts tokenized (or token ids checked),
// the chat template applied, sampling and limits mapped through engine::GenerationOptions
// (the mapping `kvcache run` uses too), the namespace and session attached; and every check
// that can refuse a request before it reaches the engine (the model's name, the context, the
// waiting queue).
//
// Thread-safety: pure functions over a Backend that is only read.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/request.h"
#include "server/api_keys.h"
#include "server/backend.h"
#include "server/openai_protocol.h"

namespace kvc::server {

// The model name a response carries: requested when it is one of the backend's names (or
// the backend's id when none was given). Throws 404 model_not_found, as OpenAI does, for any
// other name.
std::string resolve_model(const Backend& backend, const std::string& requested);

// Token ids of one prompt: text through the tokenizer (BOS first when add_bos), or ids checked
// against the vocabulary. An empty text prompt becomes BOS alone, as `kvcache run` does.
std::vector<int32_t> encode_prompt(const PromptInput& p, const model::Tokenizer& tokenizer,
                                   bool add_bos, const std::string& param);

// Throws 400 context_length_exceeded unless the prompt and one generated token fit.
void check_prompt_fits(size_t prompt_tokens, size_t context, const std::string& param);

// Throws 400 context_length_exceeded, naming param (the prompt or messages, not max_tokens),
// unless the prompt and one generated token fit the engine's whole KV pool.
void check_prompt_fits_pool(size_t prompt_tokens, const engine::Engine& engine,
                            const std::string& param);

// Tokens of a prompt-or-messages body (tokenize, explain, pin); what names the endpoint.
std::vector<int32_t> prompt_tokens(const Backend& backend, const nlohmann::json& body,
                                   bool add_special, const std::string& what);

// The chat template's text for messages: the one place the server renders a template as text.
std::string render_chat_prompt(const Backend& backend, const std::vector<ChatMessage>& messages,
                               bool add_generation_prompt);

// The engine requests of a completion: one per prompt and sample (n), in that order. tenant
// scopes the session id; ns is the tenant's namespace for the request's cache_salt. Throws
// ApiError 400 for stop token ids outside the vocabulary, prompts beyond the context, and more
// requests than the waiting queue holds (which no retry would fix).
std::vector<engine::Request> map_completion(const CompletionRequest& r, const Backend& backend,
                                            const std::string& tenant, const kv::Hash256& ns);

}  // namespace kvc::server
