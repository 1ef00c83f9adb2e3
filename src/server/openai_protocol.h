// The OpenAI wire format: parsing and validating request bodies (every error names the field),
// and building the response, chunk and usage objects the official clients expect.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"
#include "server/chat_template.h"

namespace kvc::server {

// How deeply a request body's JSON may nest (the top-level object is level 1): far beyond any
// real request, tool schemas included, and far below what recursion over a value can take.
constexpr int kMaxJsonDepth = 128;

// Parses a request body that must be a JSON object nested at most kMaxJsonDepth levels; throws
// ApiError 400 otherwise (malformed JSON, a number beyond a double's range, too deep).
nlohmann::json parse_json_object(const std::string& body);

// Typed, range-checked access to the fields of a JSON object. A missing field and a JSON null
// read as absent; a present field of the wrong type or out of range throws ApiError 400 whose
// param is the field's name (prefixed with `prefix`, as in "stream_options.include_usage").
class JsonFields {
 public:
  explicit JsonFields(const nlohmann::json& object, std::string prefix = {});
  // The field itself, or nullptr when absent.
  const nlohmann::json* raw(const std::string& name) const;
  std::optional<std::string> string(const std::string& name) const;
  std::optional<bool> boolean(const std::string& name) const;
  // A number in [lo, hi].
  std::optional<double> number(const std::string& name, double lo, double hi) const;
  // An integer in [lo, hi] (a JSON number with a fraction is refused).
  std::optional<int64_t> integer(const std::string& name, int64_t lo, int64_t hi) const;
  // The full name of a field, for messages and params.
  std::string param(const std::string& name) const { return prefix_ + name; }

 private:
  const nlohmann::json& object_;
  std::string prefix_;
};

// A completions prompt as given: text, or token ids.
struct PromptInput {
  std::optional<std::string> text;
  std::vector<int32_t> tokens;
};

constexpr int kMaxChoices = 16;
constexpr int kMaxTopLogprobs = 20;

// A validated /v1/completions or /v1/chat/completions request. Sampling defaults are
// OpenAI's (temperature 1, top_p 1, no top-k or min-p), not `kvcache run`'s.
struct CompletionRequest {
  bool chat = false;
  std::string model;
  std::vector<PromptInput> prompts;   // completions: one or more prompts
  std::vector<ChatMessage> messages;  // chat
  // chat: open the assistant's turn after the messages (vLLM's extension; false continues
  // from the conversation as rendered).
  bool add_generation_prompt = true;
  bool stream = false;
  bool include_usage = false;
  int n = 1;
  std::optional<int> max_tokens;  // absent: completions 16, chat the rest of the context
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  std::optional<uint64_t> seed;
  bool logprobs = false;  // chat: logprobs; completions: logprobs given (even 0)
  int top_logprobs = 0;   // chat: top_logprobs; completions: the logprobs integer
  std::string session_id;
  std::string cache_salt;
};

// Parses and validates a completions (chat = false) or chat completions body. Throws ApiError
// 400 naming the field for malformed JSON, wrong types, out-of-range values and features this
// server does not offer (tools, logit_bias, presence/frequency penalties, echo, ...).
CompletionRequest parse_completion_request(const std::string& body, bool chat);

// Parses "messages" of a chat-shaped body (chat completions, tokenize, cache explain/pin).
std::vector<ChatMessage> parse_messages(const nlohmann::json& messages);

// Non-negative integer token ids from a JSON array; throws 400 naming param otherwise.
std::vector<int32_t> parse_token_ids(const nlohmann::json& ids, const std::string& param);

// Parses "prompt" of a completions-shaped body: a string, strings, token ids or lists of ids.
std::vector<PromptInput> parse_prompts(const nlohmann::json& prompt);

// "stop" for "eos", "stop" (a stop string or token) and anything else that ended the text
// early; "length" for "length" and "context" (the context window is a length limit).
std::string openai_finish_reason(const std::string& engine_reason);

// {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details":
// {"cached_tokens"}}: cached_tokens is always present.
nlohmann::json usage_json(size_t prompt_tokens, size_t completion_tokens, size_t cached_tokens);

// A miss reason: {"reason": "diverged@32", "kind": "diverged", "at_token": 32}, at_token only
// when something was missed. now_ms is the prefix index's clock, for "evicted N s ago".
nlohmann::json miss_json(const kv::MissReason& miss, double now_ms);

// The `kvcache` object of a response: prompt and cached tokens, the miss reason (as text and
// as its kind and token), queue/TTFT/end-to-end/per-token milliseconds and preemptions.
// now_ms is the prefix index's clock, for "evicted N s ago".
nlohmann::json kvcache_json(const engine::RequestStats& stats, double now_ms);

// A fresh response id: prefix followed by 24 random hex digits.
std::string new_response_id(const std::string& prefix);

// JSON text with invalid UTF-8 (a lone byte token) replaced by U+FFFD rather than throwing.
std::string dump_json(const nlohmann::json& j);

// One server-sent event: "data: JSON\n\n".
std::string sse_data(const nlohmann::json& j);

}  // namespace kvc::server
