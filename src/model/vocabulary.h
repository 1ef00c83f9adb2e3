// What a GGUF holds under tokenizer.ggml.*: the tokens with their scores and types, the merges
// of a byte-level BPE vocabulary, the special ids and flags; plus the end-of-generation set
// derived from them. Plain data; no tokenization here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/gguf.h"

namespace kvc::model {

// The SentencePiece piece types, with the values GGUF's tokenizer.ggml.token_type uses.
enum class TokenType : int32_t {
  kUndefined = 0,  // treated like kNormal
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // <s>, </s>: never produced from text, decode to nothing
  kUserDefined = 4,  // matched whole in text before merging, never split
  kUnused = 5,       // may be a merge step, never emitted
  kByte = 6,         // <0xXX>: byte fallback
};

std::string_view token_type_name(TokenType t);
bool valid_token_type(TokenType t);

// tokenizer.ggml.model: "llama" (SentencePiece) or "gpt2" (byte-level BPE).
enum class TokenizerModel { kSpm, kBpe };
std::string_view tokenizer_model_name(TokenizerModel m);

// An id of -1 means "none". The defaults are a SentencePiece (llama) vocabulary's: unk 0, bos 1,
// eos 2.
struct Vocabulary {
  TokenizerModel model = TokenizerModel::kSpm;
  std::string pre;  // BPE: tokenizer.ggml.pre ("" = default)
  std::vector<std::string> tokens;
  std::vector<float> scores;        // empty: all 0
  std::vector<TokenType> types;     // empty: inferred (see Tokenizer::Tokenizer)
  std::vector<std::string> merges;  // BPE: "left right", rank = index
  int32_t bos_id = 1;
  int32_t eos_id = 2;
  int32_t unk_id = 0;
  int32_t pad_id = -1;
  int32_t eot_id = -1;  // tokenizer.ggml.eot_token_id (end of turn)
  int32_t eom_id = -1;  // tokenizer.ggml.eom_token_id (end of message, Llama 3.1 tool calls)
  bool add_bos = true;
  bool add_eos = false;
  bool add_space_prefix = true;

  // Reads tokenizer.ggml.* from file. SentencePiece defaults are as above, as in llama.cpp (an
  // absent id whose default is not below the token count is -1); a gpt2 vocabulary
  // defaults to no BOS/EOS/unknown ids, no space prefix, and BOS added only for pre-tokenizers
  // whose models expect it (Llama 3). Throws Error naming the file and the key at fault,
  // including an unsupported tokenizer.ggml.model. A missing tokenizer.ggml.pre for gpt2 means
  // "default" (as in llama.cpp, which warns); `warning` then says so.
  static Vocabulary from_gguf(const gguf::File& file, std::string* warning = nullptr);
};

// Texts of tokens that end generation wherever a vocabulary has them (as llama.cpp marks them).
bool is_end_of_generation_text(std::string_view token);

// Whether file is a vocabulary-only GGUF, as llama.cpp's ggml-vocab-*.gguf: a tokenizer
// (tokenizer.ggml.model) and no tensors at all, whatever general.architecture names. A file
// with some tensors is a model, however broken, and loading it says what is missing.
bool is_vocabulary_only(const gguf::File& file);

}  // namespace kvc::model
