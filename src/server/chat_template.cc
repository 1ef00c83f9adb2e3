#include "server/chat_template.h"

#include <algorithm>

#include "base/error.h"
#include "model/gguf.h"

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
  if (!override_name.empty()) {
    ChatTemplate t = named(override_name);
    note = fmt::format("chat template {} (--chat-template)", t.name());
    return t;
  }
  const gguf::Value* v = file.find("tokenizer.chat_template");
  const std::string* jinja = v ? v->as_string() : nullptr;
  if (jinja == nullptr || jinja->empty()) {
    note =
        "chat template chatml: the model has no tokenizer.chat_template, so chat requests use "
        "chatml as llama.cpp does (pass --chat-template NAME for another)";
    return ChatTemplate(ChatFormat::kChatml);
  }
  if (auto t = recognise(*jinja)) {
    note = fmt::format("chat template {} (recognised from tokenizer.chat_template)", t->name());
    return *t;
  }
  fail(
      "the model's tokenizer.chat_template (starting '{}') is not one kvcache recognises "
      "({}); pass --chat-template NAME",
      jinja->substr(0, 60), chat_template_names());
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
  }
  return "?";
}

std::vector<ChatTemplate::Part> ChatTemplate::parts(
    const std::vector<ChatMessage>& messages) const {
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
  }
  return p;
}

std::vector<int32_t> ChatTemplate::apply(const std::vector<ChatMessage>& messages,
                                         const model::Tokenizer& tokenizer) const {
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
  for (const Part& part : parts(messages)) {
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

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages) const {
  std::string out;
  for (const Part& part : parts(messages)) out += part.text;
  return out;
}

void ChatTemplate::end_of_turn(const model::Tokenizer& tokenizer, std::vector<int32_t>& stop_tokens,
                               std::vector<std::string>& stop_strings) const {
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
