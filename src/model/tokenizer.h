// SentencePiece-style ("llama"/spm) tokenizer over a GGUF vocabulary: score-driven BPE over
// UTF-8 characters with byte fallback, as SentencePiece's BPE model and llama.cpp's spm
// tokenizer do.
//
// Text maps to ids like this: spaces become U+2581 "▁", a dummy "▁" is prepended when
// add_space_prefix is set, the text is split into UTF-8 characters (user-defined tokens are
// matched first and never split or merged; a byte that is not part of a valid UTF-8 sequence is
// a symbol of its own), and the adjacent pair whose concatenation is the highest-scoring token
// is merged (ties: leftmost) until no pair merges. Symbols that are not tokens become byte
// tokens <0xXX>, or the unknown token when the vocabulary has none.
//
// decode(encode(s)) == s for every byte string s that does not contain U+2581 itself (that
// character is how spaces are stored, so it decodes to a space, as in SentencePiece).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
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

// What a GGUF holds under tokenizer.ggml.*. An id of -1 means "none".
struct Vocabulary {
  std::vector<std::string> tokens;
  std::vector<float> scores;     // empty: all 0
  std::vector<TokenType> types;  // empty: inferred (see Tokenizer::Tokenizer)
  int32_t bos_id = 1;
  int32_t eos_id = 2;
  int32_t unk_id = 0;
  int32_t pad_id = -1;
  bool add_bos = true;
  bool add_space_prefix = true;
};

class Tokenizer {
 public:
  // Validates vocab and builds the lookup tables; throws Error naming the problem: array sizes
  // that disagree, a special id out of range, a NaN score, a malformed or duplicate byte token,
  // an incomplete set of byte tokens (all 256 or none), or neither byte tokens nor an unknown
  // token. Empty types are inferred: unk_id -> kUnknown, bos/eos/pad -> kControl, "<0xXX>" ->
  // kByte, anything else kNormal.
  explicit Tokenizer(Vocabulary vocab);

  // Reads tokenizer.ggml.* from file; the model must be "llama". Scores default to 0, types are
  // inferred when absent, a special id that is absent or 0xFFFFFFFF means none, add_bos_token
  // and add_space_prefix default to true. Throws Error naming the key at fault.
  static Tokenizer from_gguf(const gguf::File& file);

  // Token ids for text, preceded by BOS when add_bos is set and the vocabulary has one.
  std::vector<int32_t> encode(std::string_view text, bool add_bos) const;

  // The text of a whole sequence: the concatenated pieces, minus the one dummy-prefix space at
  // the start (after leading control tokens) when add_space_prefix is set. Throws Error on an
  // id out of range.
  std::string decode(std::span<const int32_t> ids) const;

  // The bytes one token contributes when streaming: "▁" -> ' ', <0xXX> -> that byte, control
  // tokens -> "", the unknown token -> " ⁇ ". No dummy-prefix stripping. Throws on a bad id.
  std::string piece(int32_t id) const;

  // The id of a token with exactly this text (any type; the first one on duplicates).
  std::optional<int32_t> find(std::string_view token) const;

  // The token's type; throws Error on an id out of range.
  TokenType type(int32_t id) const;

  int32_t size() const { return static_cast<int32_t>(vocab_.tokens.size()); }
  int32_t bos_id() const { return vocab_.bos_id; }
  int32_t eos_id() const { return vocab_.eos_id; }
  int32_t unk_id() const { return vocab_.unk_id; }
  int32_t pad_id() const { return vocab_.pad_id; }
  bool add_bos() const { return vocab_.add_bos; }
  bool add_space_prefix() const { return vocab_.add_space_prefix; }
  // Whether unknown characters fall back to byte tokens (otherwise to the unknown token).
  bool has_byte_tokens() const { return byte_ids_[0] >= 0; }
  const Vocabulary& vocabulary() const { return vocab_; }

  // XXH3-64 of a little-endian serialisation of the tokens, scores (as IEEE bits), types,
  // special ids and the add_bos/add_space_prefix flags: equal fingerprints mean the same
  // text -> ids mapping. Part of the model fingerprint that keys the prefix cache.
  uint64_t fingerprint() const { return fingerprint_; }

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using IdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

  void check_id(int32_t id) const;

  Vocabulary vocab_;
  IdMap all_ids_;    // every token, for find()
  IdMap merge_ids_;  // tokens that text may merge into: normal, undefined, user-defined, unused
  std::array<int32_t, 256> byte_ids_{};  // -1 when the vocabulary has no byte tokens
  size_t max_merge_bytes_ = 0;           // longest token in merge_ids_: longer pairs cannot merge
  // Byte trie of the user-defined tokens (node 0 is the root); empty when there are none.
  std::unordered_map<uint64_t, int32_t> user_edges_;  // (node << 8 | byte) -> child node
  std::vector<bool> user_terminal_;                   // node ends a user-defined token
  uint64_t fingerprint_ = 0;
};

}  // namespace kvc::model
