#include "model/vocabulary.h"

#include <array>

#include "base/error.h"
#include "model/pretokenizer.h"

namespace kvc::model {

std::string_view token_type_name(TokenType t) {
  switch (t) {
    case TokenType::kUndefined:
      return "undefined";
    case TokenType::kNormal:
      return "normal";
    case TokenType::kUnknown:
      return "unknown";
    case TokenType::kControl:
      return "control";
    case TokenType::kUserDefined:
      return "user-defined";
    case TokenType::kUnused:
      return "unused";
    case TokenType::kByte:
      return "byte";
  }
  return "invalid";
}

bool valid_token_type(TokenType t) {
  const auto v = static_cast<int32_t>(t);
  return v >= 0 && v <= static_cast<int32_t>(TokenType::kByte);
}

std::string_view tokenizer_model_name(TokenizerModel m) {
  return m == TokenizerModel::kBpe ? "gpt2" : "llama";
}

bool is_end_of_generation_text(std::string_view token) {
  static constexpr std::array<std::string_view, 11> kTexts = {
      "<|eot_id|>",
      "<|im_end|>",
      "<|end|>",
      "<end_of_turn>",
      "<|endoftext|>",
      "<|eom_id|>",
      "<EOT>",
      "<\xEF\xBD\x9C"
      "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
      "<|fim_pad|>",
      "<|repo_name|>",
      "<|file_sep|>"};
  for (std::string_view t : kTexts) {
    if (t == token) return true;
  }
  return false;
}

Vocabulary Vocabulary::from_gguf(const gguf::File& file, std::string* warning) {
  const std::string& label = file.label();
  const std::string& model = file.get_string("tokenizer.ggml.model");
  Vocabulary v;
  if (model == "gpt2") {
    v.model = TokenizerModel::kBpe;
  } else if (model != "llama") {
    fail(
        "{}: tokenizer.ggml.model is '{}', which kvcache does not support (supported: 'llama', "
        "the SentencePiece tokenizer, and 'gpt2', byte-level BPE)",
        label, model);
  }
  const bool bpe = v.model == TokenizerModel::kBpe;

  const auto& tokens = file.get_array("tokenizer.ggml.tokens");
  const size_t n = tokens.size();
  v.tokens.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string* s = tokens[i].as_string();
    if (s == nullptr) {
      fail("{}: tokenizer.ggml.tokens[{}] has type {}, expected a string", label, i,
           gguf::value_type_name(tokens[i].type));
    }
    v.tokens.push_back(*s);
  }

  auto optional_array = [&](std::string_view key) -> const gguf::Value::Array* {
    const gguf::Value* value = file.find(key);
    if (value == nullptr) return nullptr;
    const auto* array = value->as_array();
    if (array == nullptr) {
      fail("{}: {} has type {}, expected an array", label, key, gguf::value_type_name(value->type));
    }
    if (array->size() != n) {
      fail("{}: {} has {} entries but tokenizer.ggml.tokens has {}", label, key, array->size(), n);
    }
    return array;
  };
  if (const auto* scores = optional_array("tokenizer.ggml.scores")) {
    v.scores.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const auto score = (*scores)[i].as_f64();
      if (!score) fail("{}: tokenizer.ggml.scores[{}] is not a number", label, i);
      v.scores.push_back(static_cast<float>(*score));
    }
  }
  if (const auto* types = optional_array("tokenizer.ggml.token_type")) {
    v.types.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const auto type = (*types)[i].as_i64();
      if (!type || !valid_token_type(static_cast<TokenType>(*type)) ||
          *type != static_cast<int32_t>(*type)) {
        fail("{}: tokenizer.ggml.token_type[{}] is {}, not a token type (0 to 6)", label, i,
             (*types)[i].describe());
      }
      v.types.push_back(static_cast<TokenType>(*type));
    }
  }

  if (bpe) {
    const gguf::Value* merges = file.find("tokenizer.ggml.merges");
    if (merges == nullptr) fail("{}: a gpt2 tokenizer needs tokenizer.ggml.merges", label);
    const auto* array = merges->as_array();
    if (array == nullptr) {
      fail("{}: tokenizer.ggml.merges has type {}, expected an array", label,
           gguf::value_type_name(merges->type));
    }
    v.merges.reserve(array->size());
    for (size_t i = 0; i < array->size(); ++i) {
      const std::string* s = (*array)[i].as_string();
      if (s == nullptr) fail("{}: tokenizer.ggml.merges[{}] is not a string", label, i);
      v.merges.push_back(*s);
    }
    if (const gguf::Value* pre = file.find("tokenizer.ggml.pre")) {
      const std::string* s = pre->as_string();
      if (s == nullptr) fail("{}: tokenizer.ggml.pre is not a string", label);
      v.pre = *s;
    } else if (warning != nullptr) {
      *warning = fmt::format(
          "{}: no tokenizer.ggml.pre, using the 'default' pre-tokenizer as llama.cpp does; "
          "tokenization may differ from the model's own",
          label);
    }
    v.bos_id = v.eos_id = v.unk_id = -1;
    v.add_space_prefix = false;
    try {
      v.add_bos = PreTokenizer::named(v.pre).add_bos_default();
    } catch (const Error& e) {
      fail("{}: {}", label, e.what());
    }
  }

  auto special_id = [&](std::string_view key, int32_t fallback) -> int32_t {
    const gguf::Value* value = file.find(key);
    if (value == nullptr) return fallback;
    const auto id = value->as_i64();
    if (!id) fail("{}: {} is {}, expected a token id", label, key, value->describe());
    if (*id == -1 || *id == 0xFFFFFFFF) return -1;
    if (*id < 0 || *id >= static_cast<int64_t>(n)) {
      fail("{}: {} = {} is out of range for a vocabulary of {} tokens", label, key, *id, n);
    }
    return static_cast<int32_t>(*id);
  };
  // Absent ids default as in llama.cpp: SentencePiece's <unk>, <s>, </s> at 0, 1, 2 (where the
  // vocabulary has them), none for gpt2 (set above).
  const auto spm_default = [&](int32_t id) {
    return !bpe && static_cast<size_t>(id) < n ? id : int32_t{-1};
  };
  v.bos_id = special_id("tokenizer.ggml.bos_token_id", spm_default(v.bos_id));
  v.eos_id = special_id("tokenizer.ggml.eos_token_id", spm_default(v.eos_id));
  v.unk_id = special_id("tokenizer.ggml.unknown_token_id", spm_default(v.unk_id));
  v.pad_id = special_id("tokenizer.ggml.padding_token_id", -1);
  v.eot_id = special_id("tokenizer.ggml.eot_token_id", -1);
  v.eom_id = special_id("tokenizer.ggml.eom_token_id", -1);

  auto flag = [&](std::string_view key, bool fallback) {
    const gguf::Value* value = file.find(key);
    if (value == nullptr) return fallback;
    const bool* b = std::get_if<bool>(&value->data);
    if (b == nullptr) {
      fail("{}: {} has type {}, expected a bool", label, key, gguf::value_type_name(value->type));
    }
    return *b;
  };
  v.add_bos = flag("tokenizer.ggml.add_bos_token", bpe ? v.add_bos : true);
  v.add_eos = flag("tokenizer.ggml.add_eos_token", false);
  v.add_space_prefix = flag("tokenizer.ggml.add_space_prefix", !bpe);
  return v;
}

bool is_vocabulary_only(const gguf::File& file) {
  return file.tensors().empty() && file.find("tokenizer.ggml.model") != nullptr;
}

}  // namespace kvc::model
