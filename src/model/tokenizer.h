// The tokenizer of a model: one facade over the SentencePiece tokenizer (spm_tokenizer.h,
// tokenizer.ggml.model "llama") and the byte-level BPE tokenizer (bpe_tokenizer.h, "gpt2"),
// plus what both share: vocabulary validation, special and added tokens matched in text before
// either model runs, BOS/EOS, the end-of-generation set, and the fingerprint.
//
// Special tokens in text: user-defined (added) tokens are always matched whole, leftmost and
// longest first, before the model splits the rest; control tokens (<|im_end|>, <s>, ...) only
// when encoding with parse_special (chat templates), otherwise their text is ordinary text.
// For SentencePiece without parse_special the spm tokenizer matches user-defined tokens itself,
// exactly as before this facade existed.
//
// End of generation: eos, eot (tokenizer.ggml.eot_token_id), eom, and every token whose text
// is one llama.cpp treats as ending a turn (<|eot_id|>, <|im_end|>, <|end|>, <end_of_turn>,
// <|endoftext|>, <|eom_id|>, <EOT>, DeepSeek's end of sentence, the FIM pad/repo/file-separator
// tokens). Such tokens are typed control, as llama.cpp does, so text never produces them.
//
// Copies share the immutable tables: thread-safe for concurrent const use.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/gguf.h"
#include "model/vocabulary.h"

namespace kvc::model {

class SpmTokenizer;
class BpeTokenizer;

struct EncodeOptions {
  bool add_bos = false;        // prepend BOS when the vocabulary has one
  bool add_eos = false;        // append EOS when the vocabulary has one
  bool parse_special = false;  // match control tokens in the text too
};

class Tokenizer {
 public:
  // Validates vocab and builds the lookup tables; throws Error naming the problem: array sizes
  // that disagree, a special id out of range, a NaN score, (SentencePiece) a malformed or
  // duplicate byte token, an incomplete set of byte tokens (all 256 or none), or neither byte
  // tokens nor an unknown token; (BPE) a malformed merge or an unknown pre-tokenizer. Empty
  // types are inferred: unk_id -> kUnknown, bos/eos/pad -> kControl, "<0xXX>" -> kByte
  // (SentencePiece), anything else kNormal.
  explicit Tokenizer(Vocabulary vocab);
  ~Tokenizer();
  Tokenizer(const Tokenizer&);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(const Tokenizer&);
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Reads tokenizer.ggml.* from file (Vocabulary::from_gguf). Throws Error naming the file and
  // the key at fault. A gpt2 file without tokenizer.ggml.pre uses "default" and logs a warning.
  static Tokenizer from_gguf(const gguf::File& file);

  // Token ids for text, preceded by BOS when add_bos is set and the vocabulary has one.
  std::vector<int32_t> encode(std::string_view text, bool add_bos) const;
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& options) const;

  // The text of a whole sequence: the concatenated pieces, minus the one dummy-prefix space at
  // the start (after leading control tokens) when add_space_prefix is set. Throws Error on an
  // id out of range.
  std::string decode(std::span<const int32_t> ids) const;

  // The bytes one token contributes when streaming (possibly part of a UTF-8 character: a
  // streamer holds those back until complete): control tokens -> "", SentencePiece "▁" -> ' '
  // and <0xXX> -> that byte, its unknown token -> " ⁇ ", byte-level BPE text mapped back to its
  // bytes. No dummy-prefix stripping. Throws on a bad id.
  std::string piece(int32_t id) const;

  // The id of a token with exactly this text (any type; the first one on duplicates).
  std::optional<int32_t> find(std::string_view token) const;
  // The token's stored text; throws Error on an id out of range.
  const std::string& token_text(int32_t id) const;

  // The token's type; throws Error on an id out of range.
  TokenType type(int32_t id) const;

  int32_t size() const { return static_cast<int32_t>(vocab_->tokens.size()); }
  TokenizerModel model() const { return vocab_->model; }
  // The pre-tokenizer's name (BPE), "" for SentencePiece.
  std::string_view pre() const;
  int32_t bos_id() const { return vocab_->bos_id; }
  int32_t eos_id() const { return vocab_->eos_id; }
  int32_t eot_id() const { return vocab_->eot_id; }
  int32_t eom_id() const { return vocab_->eom_id; }
  int32_t unk_id() const { return vocab_->unk_id; }
  int32_t pad_id() const { return vocab_->pad_id; }
  bool add_bos() const { return vocab_->add_bos; }
  bool add_eos() const { return vocab_->add_eos; }
  bool add_space_prefix() const { return vocab_->add_space_prefix; }
  // Whether unknown characters fall back to byte tokens (otherwise to the unknown token).
  // Always true for byte-level BPE.
  bool has_byte_tokens() const;
  const Vocabulary& vocabulary() const { return *vocab_; }

  // Whether generating id ends the sequence (see above); false for ids out of range.
  bool is_eog(int32_t id) const;
  // Every end-of-generation id, ascending.
  const std::vector<int32_t>& eog_ids() const { return eog_ids_; }

  // XXH3-64 of a little-endian serialisation of the tokens, scores (as IEEE bits), types,
  // special ids and flags (and for BPE the pre-tokenizer and merges): equal fingerprints mean
  // the same text -> ids mapping. Part of the model fingerprint that keys the prefix cache.
  uint64_t fingerprint() const { return fingerprint_; }

 private:
  void check_id(int32_t id) const;
  // Appends the ids of a text fragment that holds no special token.
  void encode_plain(std::string_view text, bool first, std::vector<int32_t>& out) const;
  // Length of the longest special token at text[i] (0: none) and its id.
  size_t match_special(std::string_view text, size_t i, bool parse_special, int32_t& id) const;

  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using IdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

  std::shared_ptr<const Vocabulary> vocab_;
  std::shared_ptr<const SpmTokenizer> spm_;
  std::shared_ptr<const BpeTokenizer> bpe_;
  std::shared_ptr<const IdMap> all_ids_;  // every token, for find()
  // Byte trie of the special tokens: user-defined, control and unknown (node 0 is the root).
  std::shared_ptr<const std::unordered_map<uint64_t, int32_t>> special_edges_;
  std::shared_ptr<const std::vector<int32_t>> special_terminal_;  // node -> token id or -1
  std::vector<int32_t> eog_ids_;
  std::vector<bool> eog_mask_;
  uint64_t fingerprint_ = 0;
};

}  // namespace kvc::model
