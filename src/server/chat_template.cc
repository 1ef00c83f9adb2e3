#include "server/chat_template.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "base/error.h"
#include "jinja/template.h"
#include "model/gguf.h"
#include "server/api_error.h"

namespace kvc::server {

namespace {

bool has(const std::string& s, const char* marker) {
  return s.find(marker) != std::string::npos;
}

std::string trim(const std::string& s) {
  const char* space = " \t\r\n";
  const size_t b = s.find_first_not_of(space);
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(space) - b + 1);
}

// The text of the token whose id the GGUF stores under id_key; "" when there is none.
std::string token_text(const gguf::File& file, const char* id_key) {
  const gguf::Value* id = file.find(id_key);
  const gguf::Value* tokens = file.find("tokenizer.ggml.tokens");
  if (id == nullptr || tokens == nullptr || tokens->as_array() == nullptr) return {};
  const auto i = id->as_u64();
  if (!i || *i >= tokens->as_array()->size()) return {};
  const std::string* text = (*tokens->as_array())[*i].as_string();
  return text ? *text : std::string();
}

// Markers that end an assistant's turn in the templates of common model families.
const char* const kEndMarkers[] = {
    "<|im_end|>",    "<|eot_id|>",    "<|eom_id|>",           "<|end|>",
    "<end_of_turn>", "<|endoftext|>", "<｜end▁of▁sentence｜>"};

}  // namespace

std::string chat_template_names() {
  return "llama-2, chatml, llama-3, zephyr";
}

ChatTemplate ChatTemplate::named(const std::string& name) {
  // llama.cpp spells the Llama ones without the dash; both are accepted.
  if (name == "llama-2" || name == "llama2") return ChatTemplate(ChatFormat::kLlama2);
  if (name == "chatml") return ChatTemplate(ChatFormat::kChatml);
  if (name == "llama-3" || name == "llama3") return ChatTemplate(ChatFormat::kLlama3);
  if (name == "zephyr") return ChatTemplate(ChatFormat::kZephyr);
  fail("unknown chat template '{}'; built in: {}", name, chat_template_names());
}

ChatTemplate::ChatTemplate(ChatFormat format) : format_(format) {
  if (format == ChatFormat::kJinja) fail("a Jinja chat template needs its source");
}

ChatTemplate ChatTemplate::jinja(const std::string& source, std::string bos_token,
                                 std::string eos_token, std::string origin) {
  ChatTemplate t(ChatFormat::kChatml);
  t.format_ = ChatFormat::kJinja;
  t.jinja_ = std::make_shared<const jinja::Template>(jinja::Template::parse(source));
  t.source_ = source;
  t.bos_token_ = std::move(bos_token);
  t.eos_token_ = std::move(eos_token);
  t.origin_ = std::move(origin);
  return t;
}

std::optional<ChatTemplate> ChatTemplate::recognise(const std::string& jinja) {
  if (has(jinja, "<|start_header_id|>") && has(jinja, "<|eot_id|>")) {
    return ChatTemplate(ChatFormat::kLlama3);
  }
  if (has(jinja, "<|im_start|>")) return ChatTemplate(ChatFormat::kChatml);
  // Mistral's templates also use [INST] but have no <<SYS>> block and a different spacing.
  if (has(jinja, "[INST]") && has(jinja, "<<SYS>>")) return ChatTemplate(ChatFormat::kLlama2);
  // Phi-3 uses <|user|> too, but ends turns with <|end|>.
  if (has(jinja, "<|user|>") && has(jinja, "<|assistant|>") && !has(jinja, "<|end|>")) {
    return ChatTemplate(ChatFormat::kZephyr);
  }
  return std::nullopt;
}

ChatTemplate ChatTemplate::for_model(const gguf::File& file, const std::string& override_name,
                                     std::string& note) {
  bool warning = false;
  return for_model(file, ChatTemplateFlags{override_name, {}}, note, warning);
}

ChatTemplate ChatTemplate::for_model(const gguf::File& file, const ChatTemplateFlags& flags,
                                     std::string& note, bool& warning) {
  warning = false;
  const std::string bos = token_text(file, "tokenizer.ggml.bos_token_id");
  const std::string eos = token_text(file, "tokenizer.ggml.eos_token_id");
  if (!flags.file.empty()) {
    if (!flags.name.empty()) fail("give --chat-template or --chat-template-file, not both");
    std::ifstream in(flags.file, std::ios::binary);
    if (!in) fail("cannot read --chat-template-file {}", flags.file);
    std::ostringstream text;
    text << in.rdbuf();
    try {
      ChatTemplate t = jinja(text.str(), bos, eos, flags.file);
      note =
          fmt::format("chat template: the Jinja template in {} (--chat-template-file)", flags.file);
      return t;
    } catch (const Error& e) {
      fail("--chat-template-file {}: {}", flags.file, e.what());
    }
  }
  if (!flags.name.empty()) {
    ChatTemplate t = named(flags.name);
    note = fmt::format("chat template {} (--chat-template)", t.name());
    return t;
  }
  const gguf::Value* v = file.find("tokenizer.chat_template");
  const std::string* source = v ? v->as_string() : nullptr;
  if (source == nullptr || source->empty()) {
    note =
        "chat template chatml: the model has no tokenizer.chat_template, so chat requests use "
        "chatml as llama.cpp does (pass --chat-template NAME or --chat-template-file FILE for "
        "another)";
    return ChatTemplate(ChatFormat::kChatml);
  }
  try {
    ChatTemplate t = jinja(*source, bos, eos, "the model's tokenizer.chat_template");
    note = "chat template: the model's tokenizer.chat_template (Jinja)";
    return t;
  } catch (const Error& e) {
    warning = true;
    const std::optional<ChatTemplate> known = recognise(*source);
    const ChatTemplate t = known ? *known : ChatTemplate(ChatFormat::kChatml);
    note = fmt::format(
        "the model's tokenizer.chat_template does not parse ({}); chat requests use {} "
        "instead{} (pass --chat-template NAME or --chat-template-file FILE to choose)",
        e.what(), t.name(), known ? ", which its markers show" : " as llama-server does");
    return t;
  }
}

std::string ChatTemplate::name() const {
  switch (format_) {
    case ChatFormat::kLlama2:
      return "llama-2";
    case ChatFormat::kChatml:
      return "chatml";
    case ChatFormat::kLlama3:
      return "llama-3";
    case ChatFormat::kZephyr:
      return "zephyr";
    case ChatFormat::kJinja:
      return origin_;
  }
  return "?";
}

std::vector<ChatTemplate::Part> ChatTemplate::parts(const std::vector<ChatMessage>& messages,
                                                    bool add_generation_prompt) const {
  std::vector<Part> p;
  const auto text = [&](std::string s) { p.push_back({std::move(s), false}); };
  const auto special = [&](std::string s) { p.push_back({std::move(s), true}); };
  switch (format_) {
    case ChatFormat::kChatml:
      for (const auto& m : messages) {
        special("<|im_start|>");
        text(m.role + "\n" + m.content);
        special("<|im_end|>");
        text("\n");
      }
      if (!add_generation_prompt) break;
      special("<|im_start|>");
      text("assistant\n");
      break;
    case ChatFormat::kLlama3:
      for (const auto& m : messages) {
        special("<|start_header_id|>");
        text(m.role);
        special("<|end_header_id|>");
        text("\n\n" + trim(m.content));
        special("<|eot_id|>");
      }
      if (!add_generation_prompt) break;
      special("<|start_header_id|>");
      text("assistant");
      special("<|end_header_id|>");
      text("\n\n");
      break;
    case ChatFormat::kZephyr:
      for (const auto& m : messages) {
        special("<|" + m.role + "|>");
        text("\n" + m.content);
        special("</s>");
        text("\n");
      }
      if (!add_generation_prompt) break;
      special("<|assistant|>");
      text("\n");
      break;
    case ChatFormat::kLlama2: {
      // Meta's format: the system prompt sits in a <<SYS>> block inside the next user turn;
      // each later turn reopens with <s> (the first one's BOS comes from the tokenizer).
      std::string system;
      bool first_turn = true;
      for (const auto& m : messages) {
        if (m.role == "system") {
          system += (system.empty() ? "" : "\n") + m.content;
        } else if (m.role == "user") {
          if (!first_turn) special("<s>");
          first_turn = false;
          std::string turn = "[INST] ";
          if (!system.empty()) turn += "<<SYS>>\n" + system + "\n<</SYS>>\n\n";
          system.clear();
          text(turn + trim(m.content) + " [/INST]");
        } else {
          text(" " + trim(m.content) + " ");
          special("</s>");
        }
      }
      if (!system.empty()) text("[INST] <<SYS>>\n" + system + "\n<</SYS>>\n\n [/INST]");
      break;
    }
    case ChatFormat::kJinja:
      break;
  }
  return p;
}

std::vector<int32_t> ChatTemplate::apply(const std::vector<ChatMessage>& messages,
                                         const model::Tokenizer& tokenizer,
                                         bool add_generation_prompt) const {
  if (format_ == ChatFormat::kJinja) {
    return tokenize(render(messages, add_generation_prompt), tokenizer);
  }
  std::vector<int32_t> ids;
  if (tokenizer.add_bos() && tokenizer.bos_id() >= 0) ids.push_back(tokenizer.bos_id());
  // Text runs between markers the vocabulary has are encoded one run at a time, as
  // llama.cpp does when it splits a prompt on special tokens.
  std::string run;
  const auto flush = [&] {
    if (run.empty()) return;
    const auto t = tokenizer.encode(run, false);
    ids.insert(ids.end(), t.begin(), t.end());
    run.clear();
  };
  for (const Part& part : parts(messages, add_generation_prompt)) {
    const std::optional<int32_t> id = part.special ? tokenizer.find(part.text) : std::nullopt;
    if (id) {
      flush();
      ids.push_back(*id);
    } else {
      run += part.text;
    }
  }
  flush();
  return ids;
}

std::vector<int32_t> ChatTemplate::tokenize(const std::string& text,
                                            const model::Tokenizer& tokenizer) {
  // The special tokens, by first byte, longest first so that the longest match wins.
  std::unordered_map<unsigned char, std::vector<std::pair<std::string_view, int32_t>>> specials;
  const auto& tokens = tokenizer.vocabulary().tokens;
  for (int32_t id = 0; id < tokenizer.size(); ++id) {
    const model::TokenType type = tokenizer.type(id);
    const std::string& t = tokens[static_cast<size_t>(id)];
    if (t.empty() ||
        (type != model::TokenType::kControl && type != model::TokenType::kUserDefined &&
         type != model::TokenType::kUnknown)) {
      continue;
    }
    specials[static_cast<unsigned char>(t[0])].emplace_back(t, id);
  }
  for (auto& [c, list] : specials) {
    std::stable_sort(list.begin(), list.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  }
  std::vector<int32_t> ids;
  size_t run_start = 0;
  const auto flush = [&](size_t end) {
    if (end > run_start) {
      const auto t =
          tokenizer.encode(std::string_view(text).substr(run_start, end - run_start), false);
      ids.insert(ids.end(), t.begin(), t.end());
    }
  };
  for (size_t i = 0; i < text.size();) {
    const auto it = specials.find(static_cast<unsigned char>(text[i]));
    std::optional<std::pair<std::string_view, int32_t>> match;
    if (it != specials.end()) {
      for (const auto& cand : it->second) {
        if (std::string_view(text).substr(i, cand.first.size()) == cand.first) {
          match = cand;
          break;
        }
      }
    }
    if (!match) {
      ++i;
      continue;
    }
    flush(i);
    ids.push_back(match->second);
    i += match->first.size();
    run_start = i;
  }
  flush(text.size());
  const int32_t bos = tokenizer.bos_id();
  if (tokenizer.add_bos() && bos >= 0 && (ids.empty() || ids[0] != bos)) {
    ids.insert(ids.begin(), bos);
  }
  return ids;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra) const {
  if (format_ != ChatFormat::kJinja) {
    std::string out;
    for (const Part& part : parts(messages, add_generation_prompt)) out += part.text;
    return out;
  }
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) {
    nlohmann::ordered_json j = m.json.is_object() ? m.json : nlohmann::ordered_json::object();
    j["role"] = m.role;
    if (!(j.contains("content") && j["content"].is_null())) j["content"] = m.content;
    list.push_back(std::move(j));
  }
  // What Hugging Face passes: tools and documents are none unless given.
  nlohmann::ordered_json context = {{"messages", std::move(list)},
                                    {"add_generation_prompt", add_generation_prompt},
                                    {"bos_token", bos_token_},
                                    {"eos_token", eos_token_},
                                    {"tools", nullptr},
                                    {"documents", nullptr}};
  if (extra.is_object()) {
    for (auto it = extra.begin(); it != extra.end(); ++it) context[it.key()] = it.value();
  }
  try {
    return jinja_->render_json(context);
  } catch (const jinja::RaisedError& e) {
    throw ApiError(400, "invalid_request_error", e.what(), "messages");
  } catch (const jinja::UnsupportedError& e) {
    throw ApiError(500, "server_error", e.what());
  } catch (const jinja::TemplateError& e) {
    throw ApiError(400, "invalid_request_error",
                   fmt::format("the chat template failed on these messages: {}", e.what()),
                   "messages");
  }
}

void ChatTemplate::end_of_turn(const model::Tokenizer& tokenizer, std::vector<int32_t>& stop_tokens,
                               std::vector<std::string>& stop_strings) const {
  const auto add_token = [&](int32_t id) {
    if (std::find(stop_tokens.begin(), stop_tokens.end(), id) == stop_tokens.end()) {
      stop_tokens.push_back(id);
    }
  };
  if (format_ == ChatFormat::kJinja) {
    // The end-of-turn markers the template writes, and its EOS.
    for (const char* marker : kEndMarkers) {
      if (source_.find(marker) == std::string::npos) continue;
      if (const auto id = tokenizer.find(marker)) {
        add_token(*id);
      } else if (std::find(stop_strings.begin(), stop_strings.end(), marker) ==
                 stop_strings.end()) {
        stop_strings.push_back(marker);
      }
    }
    if (!eos_token_.empty()) {
      if (const auto id = tokenizer.find(eos_token_)) add_token(*id);
    }
    return;
  }
  std::string marker;
  switch (format_) {
    case ChatFormat::kChatml:
      marker = "<|im_end|>";
      break;
    case ChatFormat::kLlama3:
      marker = "<|eot_id|>";
      break;
    case ChatFormat::kLlama2:
    case ChatFormat::kZephyr:
    case ChatFormat::kJinja:
      marker = "</s>";
      break;
  }
  if (const auto id = tokenizer.find(marker)) {
    if (std::find(stop_tokens.begin(), stop_tokens.end(), *id) == stop_tokens.end()) {
      stop_tokens.push_back(*id);
    }
  } else if (std::find(stop_strings.begin(), stop_strings.end(), marker) == stop_strings.end()) {
    stop_strings.push_back(marker);
  }
}

}  // namespace kvc::server
