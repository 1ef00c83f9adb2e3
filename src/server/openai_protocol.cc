#include "server/openai_protocol.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <random>

#include "model/sampler.h"
#include "server/api_error.h"
#include "server/tenant.h"

namespace kvc::server {

namespace {

const char* type_name(const nlohmann::json& j) {
  return j.type_name();
}

int64_t integer_or(const std::optional<int64_t>& v, int64_t fallback) {
  return v ? *v : fallback;
}

// Fields of the OpenAI API this server does not implement: refused with a message rather than
// silently ignored, when set to anything but their neutral value.
void refuse_unsupported(const JsonFields& f, bool chat) {
  for (const char* penalty : {"presence_penalty", "frequency_penalty"}) {
    if (const auto v = f.number(penalty, -2.0, 2.0); v && *v != 0.0) {
      bad_field(penalty, fmt::format("{} is not supported; use repetition_penalty", penalty));
    }
  }
  if (const auto* b = f.raw("logit_bias"); b && !(b->is_object() && b->empty())) {
    bad_field("logit_bias", "logit_bias is not supported");
  }
  // Tool calling in any of its forms is refused rather than ignored: a client that offers
  // tools, even none, expects the model to be told about them.
  for (const char* name : {"tools", "tool_choice", "functions", "function_call"}) {
    if (f.raw(name)) bad_field(name, fmt::format("{} is not supported (no tool calling)", name));
  }
  if (const auto* r = f.raw("response_format")) {
    if (!r->is_object() || !r->contains("type") || (*r)["type"] != "text") {
      bad_field("response_format", "only response_format {\"type\": \"text\"} is supported");
    }
  }
  if (!chat) {
    if (const auto b = f.integer("best_of", 1, kMaxChoices); b && *b != 1) {
      bad_field("best_of", "best_of other than 1 is not supported; use n");
    }
    if (f.boolean("echo").value_or(false)) bad_field("echo", "echo is not supported");
    if (const auto s = f.string("suffix"); s && !s->empty()) {
      bad_field("suffix", "suffix is not supported");
    }
  }
}

std::vector<std::string> parse_stop(const nlohmann::json& stop) {
  std::vector<std::string> out;
  if (stop.is_string()) {
    out.push_back(stop.get<std::string>());
  } else if (stop.is_array()) {
    if (stop.size() > 16) bad_field("stop", "stop holds at most 16 strings");
    for (const auto& s : stop) {
      if (!s.is_string()) bad_field("stop", "stop must be a string or an array of strings");
      out.push_back(s.get<std::string>());
    }
  } else {
    bad_field("stop",
              fmt::format("stop must be a string or an array of strings, not {}", type_name(stop)));
  }
  for (const auto& s : out) {
    if (s.empty()) bad_field("stop", "stop strings must not be empty");
  }
  return out;
}

// A positive sampling value as the sampler holds it, a 32-bit float. A value that rounds to 0
// there, or to a subnormal float (whose reciprocal overflows), is refused here under the API's
// name, rather than by the engine under its own or by turning logits into infinities.
float positive_sampler_float(const std::string& field, double value, const char* range) {
  const float x = static_cast<float>(value);
  if (!(value > 0.0)) bad_field(field, fmt::format("{} must be {}, got {}", field, range, value));
  if (!std::isnormal(x)) {
    bad_field(field, fmt::format("{} must be {}, and at least {} (the smallest normal 32-bit "
                                 "float, which the sampler uses), got {}",
                                 field, range, std::numeric_limits<float>::min(), value));
  }
  return x;
}

}  // namespace

nlohmann::json parse_json_object(const std::string& body) {
  // The parser keeps its own stack, but copying, dumping and rendering a value recurse once per
  // level: a body of a few hundred kilobytes nested 100,000 deep would overflow the
  // connection thread's stack. No real request comes near the limit.
  const nlohmann::json::parser_callback_t bound_depth =
      [](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
        const bool opens = event == nlohmann::json::parse_event_t::object_start ||
                           event == nlohmann::json::parse_event_t::array_start;
        if (opens && depth >= kMaxJsonDepth) {
          throw ApiError(400, "invalid_request_error",
                         fmt::format("the request body's JSON is nested deeper than {} levels",
                                     kMaxJsonDepth));
        }
        return true;
      };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(body, bound_depth);
  } catch (const nlohmann::json::parse_error& e) {
    throw ApiError(
        400, "invalid_request_error",
        fmt::format("the request body is not valid JSON (byte {}): {}", e.byte, e.what()));
  } catch (const nlohmann::json::exception& e) {
    // A number beyond the range of a double (1e400) is out_of_range, not a parse error.
    throw ApiError(400, "invalid_request_error",
                   fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) {
    throw ApiError(400, "invalid_request_error",
                   fmt::format("the request body must be a JSON object, not {}", type_name(j)));
  }
  return j;
}

JsonFields::JsonFields(const nlohmann::json& object, std::string prefix)
    : object_(object), prefix_(std::move(prefix)) {}

const nlohmann::json* JsonFields::raw(const std::string& name) const {
  auto it = object_.find(name);
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<std::string> JsonFields::string(const std::string& name) const {
  const auto* v = raw(name);
  if (!v) return std::nullopt;
  if (!v->is_string()) {
    bad_field(param(name), fmt::format("{} must be a string, not {}", param(name), type_name(*v)));
  }
  return v->get<std::string>();
}

std::optional<bool> JsonFields::boolean(const std::string& name) const {
  const auto* v = raw(name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) {
    bad_field(param(name), fmt::format("{} must be a boolean, not {}", param(name), type_name(*v)));
  }
  return v->get<bool>();
}

std::optional<double> JsonFields::number(const std::string& name, double lo, double hi) const {
  const auto* v = raw(name);
  if (!v) return std::nullopt;
  if (!v->is_number()) {
    bad_field(param(name), fmt::format("{} must be a number, not {}", param(name), type_name(*v)));
  }
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) {
    bad_field(param(name),
              fmt::format("{} must be between {} and {}, got {}", param(name), lo, hi, v->dump()));
  }
  return x;
}

std::optional<int64_t> JsonFields::integer(const std::string& name, int64_t lo, int64_t hi) const {
  const auto* v = raw(name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) {
    bad_field(param(name), fmt::format("{} must be an integer, not {}", param(name),
                                       v->is_number() ? v->dump() : std::string(type_name(*v))));
  }
  // An unsigned value above INT64_MAX reads as negative through get<int64_t>.
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    bad_field(param(name),
              fmt::format("{} must be between {} and {}, got {}", param(name), lo, hi, v->dump()));
  }
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) {
    bad_field(param(name),
              fmt::format("{} must be between {} and {}, got {}", param(name), lo, hi, x));
  }
  return x;
}

std::vector<int32_t> parse_token_ids(const nlohmann::json& ids, const std::string& param) {
  if (!ids.is_array()) bad_field(param, fmt::format("{} must be an array of token ids", param));
  std::vector<int32_t> out;
  for (const auto& t : ids) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) {
      bad_field(param, fmt::format("{} must hold non-negative integer token ids", param));
    }
    out.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return out;
}

std::vector<ChatMessage> parse_messages(const nlohmann::json& messages) {
  if (!messages.is_array() || messages.empty()) {
    bad_field("messages", "messages must be a non-empty array of {role, content} objects");
  }
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    const std::string at = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad_field(at, fmt::format("{} must be an object", at));
    const JsonFields f(m, at + ".");
    const auto role = f.string("role");
    if (!role) bad_field(at + ".role", fmt::format("{}.role is required", at));
    ChatMessage msg;
    // OpenAI's newer "developer" role is the system role of older models.
    if (*role == "system" || *role == "developer") {
      msg.role = "system";
    } else if (*role == "user" || *role == "assistant" || *role == "tool") {
      msg.role = *role;
    } else {
      bad_field(at + ".role",
                fmt::format("{}.role must be system, developer, user, assistant or tool, got '{}'",
                            at, *role));
    }
    // Jinja chat templates may read the rest of the message (tool_calls, name, ...).
    msg.json = m;
    const auto* content = f.raw("content");
    const bool has_tool_calls = m.contains("tool_calls") && !m["tool_calls"].is_null();
    if (!content && !has_tool_calls) {
      bad_field(at + ".content", fmt::format("{}.content is required", at));
    }
    if (!content || (content->is_null() && has_tool_calls)) {
      msg.json["content"] = nullptr;
    } else if (content->is_string()) {
      msg.content = content->get<std::string>();
    } else if (content->is_array()) {
      // Content parts: only text parts, concatenated.
      for (size_t k = 0; k < content->size(); ++k) {
        const auto& part = (*content)[k];
        const std::string pat = fmt::format("{}.content[{}]", at, k);
        if (!part.is_object()) bad_field(pat, fmt::format("{} must be an object", pat));
        const JsonFields pf(part, pat + ".");
        const auto type = pf.string("type");
        if (type != "text") {
          bad_field(pat + ".type", fmt::format("{}.type must be \"text\" (only text parts are "
                                               "supported)",
                                               pat));
        }
        const auto text = pf.string("text");
        if (!text) bad_field(pat + ".text", fmt::format("{}.text is required", pat));
        msg.content += *text;
      }
    } else {
      bad_field(at + ".content",
                fmt::format("{}.content must be a string or an array of text parts, not {}", at,
                            type_name(*content)));
    }
    out.push_back(std::move(msg));
  }
  return out;
}

std::vector<PromptInput> parse_prompts(const nlohmann::json& prompt) {
  std::vector<PromptInput> out;
  const char* shape =
      "prompt must be a string, an array of strings, an array of token ids or "
      "an array of arrays of token ids";
  if (prompt.is_string()) {
    out.push_back({prompt.get<std::string>(), {}});
    return out;
  }
  if (!prompt.is_array() || prompt.empty()) bad_field("prompt", shape);
  if (prompt[0].is_number()) {
    out.push_back({std::nullopt, parse_token_ids(prompt, "prompt")});
    return out;
  }
  for (const auto& p : prompt) {
    if (p.is_string()) {
      out.push_back({p.get<std::string>(), {}});
    } else if (p.is_array() && !p.empty()) {
      out.push_back({std::nullopt, parse_token_ids(p, "prompt")});
    } else {
      bad_field("prompt", shape);
    }
  }
  return out;
}

CompletionRequest parse_completion_request(const std::string& body, bool chat) {
  const nlohmann::json j = parse_json_object(body);
  const JsonFields f(j);
  CompletionRequest r;
  r.chat = chat;
  r.model = f.string("model").value_or("");
  if (chat) {
    const auto* m = f.raw("messages");
    if (!m) bad_field("messages", "messages is required");
    r.messages = parse_messages(*m);
    r.add_generation_prompt = f.boolean("add_generation_prompt").value_or(true);
  } else {
    const auto* p = f.raw("prompt");
    if (!p) bad_field("prompt", "prompt is required");
    r.prompts = parse_prompts(*p);
  }
  r.stream = f.boolean("stream").value_or(false);
  if (const auto* so = f.raw("stream_options")) {
    if (!so->is_object()) bad_field("stream_options", "stream_options must be an object");
    if (!r.stream) {
      bad_field("stream_options", "stream_options is only allowed when stream is true");
    }
    r.include_usage = JsonFields(*so, "stream_options.").boolean("include_usage").value_or(false);
  }
  r.n = static_cast<int>(integer_or(f.integer("n", 1, kMaxChoices), 1));
  // Both are validated; max_completion_tokens (OpenAI's newer name) wins when both are given.
  const auto max_tokens = f.integer("max_tokens", 1, INT32_MAX);
  if (const auto v = f.integer("max_completion_tokens", 1, INT32_MAX)) {
    r.max_tokens = static_cast<int>(*v);
  } else if (max_tokens) {
    r.max_tokens = static_cast<int>(*max_tokens);
  }
  if (const auto* s = f.raw("stop")) r.stop = parse_stop(*s);
  if (const auto* s = f.raw("stop_token_ids")) {
    if (!s->is_array()) bad_field("stop_token_ids", "stop_token_ids must be an array");
    r.stop_token_ids = parse_token_ids(*s, "stop_token_ids");
  }
  r.ignore_eos = f.boolean("ignore_eos").value_or(false);
  // As vLLM: below kGreedyTemperature sampling is greedy (the sampler's 1/temperature would
  // overflow a float).
  const double temperature = f.number("temperature", 0.0, 2.0).value_or(1.0);
  r.temperature = temperature < model::kGreedyTemperature ? 0.0f : static_cast<float>(temperature);
  if (const auto p = f.number("top_p", 0.0, 1.0)) {
    r.top_p = positive_sampler_float("top_p", *p, "greater than 0 and at most 1");
  }
  // vLLM's extensions: -1 or 0 disables top-k.
  r.top_k = static_cast<int>(std::max<int64_t>(0, integer_or(f.integer("top_k", -1, 1 << 20), 0)));
  r.min_p = static_cast<float>(f.number("min_p", 0.0, 1.0).value_or(0.0));
  if (const auto p = f.number("repetition_penalty", 0.0, 10.0)) {
    r.repetition_penalty =
        positive_sampler_float("repetition_penalty", *p, "greater than 0 and at most 10");
  }
  if (const auto s = f.integer("seed", INT64_MIN, INT64_MAX)) r.seed = static_cast<uint64_t>(*s);
  if (chat) {
    r.logprobs = f.boolean("logprobs").value_or(false);
    if (const auto t = f.integer("top_logprobs", 0, kMaxTopLogprobs)) {
      if (!r.logprobs) bad_field("top_logprobs", "top_logprobs needs logprobs set to true");
      r.top_logprobs = static_cast<int>(*t);
    }
  } else if (const auto t = f.integer("logprobs", 0, kMaxTopLogprobs)) {
    r.logprobs = true;
    r.top_logprobs = static_cast<int>(*t);
  }
  if (const auto s = f.string("session_id")) {
    if (s->empty() || s->size() > 256) {
      bad_field("session_id", "session_id must hold 1 to 256 characters");
    }
    r.session_id = *s;
  }
  r.cache_salt = parse_cache_salt(f);
  f.string("user");  // type-checked only: the end-user id is not used
  refuse_unsupported(f, chat);
  return r;
}

std::string openai_finish_reason(const std::string& engine_reason) {
  if (engine_reason == "length" || engine_reason == "context") return "length";
  return "stop";
}

nlohmann::json usage_json(size_t prompt_tokens, size_t completion_tokens, size_t cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

nlohmann::json miss_json(const kv::MissReason& miss, double now_ms) {
  nlohmann::json m = {{"reason", miss.to_string(now_ms)}, {"kind", miss.kind_name()}};
  if (miss.kind != kv::MissKind::kNone && miss.kind != kv::MissKind::kDisabled) {
    m["at_token"] = miss.at_token;
  }
  return m;
}

nlohmann::json kvcache_json(const engine::RequestStats& s, double now_ms) {
  const auto ms = [](double v) { return std::round(v * 1000.0) / 1000.0; };
  return {{"prompt_tokens", s.prompt_tokens}, {"cached_tokens", s.cached_tokens},
          {"disk_tokens", s.disk_tokens},     {"redis_tokens", s.redis_tokens},
          {"tier_note", s.tier_note},         {"miss", miss_json(s.miss, now_ms)},
          {"queue_ms", ms(s.queue_ms)},       {"ttft_ms", ms(s.ttft_ms)},
          {"tpot_ms", ms(s.tpot_ms)},         {"e2e_ms", ms(s.e2e_ms)},
          {"preemptions", s.preemptions}};
}

std::string new_response_id(const std::string& prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), static_cast<uint32_t>(rng()));
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string sse_data(const nlohmann::json& j) {
  return "data: " + dump_json(j) + "\n\n";
}

}  // namespace kvc::server
