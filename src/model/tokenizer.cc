#include "model/tokenizer.h"

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <bit>
#include <cmath>
#include <limits>
#include <utility>

#include "base/error.h"
#include "model/bpe_tokenizer.h"
#include "model/spm_tokenizer.h"

namespace kvc::model {

namespace {

template <typename T>
void put_le(std::string& out, T v) {
  static_assert(std::is_integral_v<T>);
  for (size_t i = 0; i < sizeof(T); ++i) {
    out.push_back(static_cast<char>(static_cast<uint64_t>(v) >> (8 * i)));
  }
}

bool is_special_type(TokenType t) {
  return t == TokenType::kUserDefined || t == TokenType::kControl || t == TokenType::kUnknown;
}

}  // namespace

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(const Tokenizer&) = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(const Tokenizer&) = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer::Tokenizer(Vocabulary vocab) {
  auto owned = std::make_shared<Vocabulary>(std::move(vocab));
  Vocabulary& v = *owned;
  const bool bpe = v.model == TokenizerModel::kBpe;
  const size_t n = v.tokens.size();
  if (n == 0) fail("tokenizer vocabulary is empty");
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    fail("tokenizer vocabulary has {} tokens, more than int32 ids allow", n);
  }
  if (v.scores.empty()) v.scores.assign(n, 0.0f);
  if (v.scores.size() != n) {
    fail("tokenizer vocabulary has {} tokens but {} scores", n, v.scores.size());
  }
  if (!v.types.empty() && v.types.size() != n) {
    fail("tokenizer vocabulary has {} tokens but {} token types", n, v.types.size());
  }
  const std::pair<const char*, int32_t> specials[] = {
      {"bos", v.bos_id}, {"eos", v.eos_id}, {"unknown", v.unk_id}, {"padding", v.pad_id}};
  const std::pair<const char*, int32_t> turn_ends[] = {{"end-of-turn", v.eot_id},
                                                       {"end-of-message", v.eom_id}};
  for (const auto& [name, id] : specials) {
    if (id < -1 || id >= static_cast<int64_t>(n)) {
      fail("tokenizer {} token id {} is out of range for a vocabulary of {} tokens", name, id, n);
    }
  }
  for (const auto& [name, id] : turn_ends) {
    if (id < -1 || id >= static_cast<int64_t>(n)) {
      fail("tokenizer {} token id {} is out of range for a vocabulary of {} tokens", name, id, n);
    }
  }
  if (v.types.empty()) {
    v.types.resize(n, TokenType::kNormal);
    if (!bpe) {
      for (size_t i = 0; i < n; ++i) {
        if (parse_byte_token(v.tokens[i])) v.types[i] = TokenType::kByte;
      }
    }
    for (int32_t id : {v.bos_id, v.eos_id, v.pad_id, v.eot_id, v.eom_id}) {
      if (id >= 0) v.types[id] = TokenType::kControl;
    }
    if (v.unk_id >= 0) v.types[v.unk_id] = TokenType::kUnknown;
  }

  auto ids = std::make_shared<IdMap>();
  eog_mask_.assign(n, false);
  for (int32_t id : {v.eos_id, v.eot_id, v.eom_id}) {
    if (id >= 0) eog_mask_[id] = true;
  }
  for (size_t i = 0; i < n; ++i) {
    const std::string& tok = v.tokens[i];
    if (!valid_token_type(v.types[i])) {
      fail("tokenizer token {} ('{}') has invalid type {}", i, tok,
           static_cast<int32_t>(v.types[i]));
    }
    // NaN would break the strict ordering the merge queue relies on.
    if (std::isnan(v.scores[i])) fail("tokenizer token {} ('{}') has a NaN score", i, tok);
    ids->emplace(tok, static_cast<int32_t>(i));
    if (is_end_of_generation_text(tok)) {
      eog_mask_[i] = true;
      // As llama.cpp: a turn-ending token is a control token whatever the file says.
      v.types[i] = TokenType::kControl;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (eog_mask_[i]) eog_ids_.push_back(static_cast<int32_t>(i));
  }

  // The trie of tokens matched whole in text.
  auto edges = std::make_shared<std::unordered_map<uint64_t, int32_t>>();
  auto terminal = std::make_shared<std::vector<int32_t>>(1, -1);
  for (size_t i = 0; i < n; ++i) {
    if (!is_special_type(v.types[i]) || v.tokens[i].empty()) continue;
    uint64_t node = 0;
    for (char c : v.tokens[i]) {
      const uint64_t key = node << 8 | static_cast<uint8_t>(c);
      auto [it, inserted] = edges->emplace(key, static_cast<int32_t>(terminal->size()));
      if (inserted) terminal->push_back(-1);
      node = static_cast<uint64_t>(it->second);
    }
    if ((*terminal)[node] < 0) (*terminal)[node] = static_cast<int32_t>(i);
  }

  vocab_ = owned;
  all_ids_ = std::move(ids);
  special_edges_ = std::move(edges);
  special_terminal_ = std::move(terminal);
  if (bpe) {
    bpe_ = std::make_shared<const BpeTokenizer>(vocab_);
  } else {
    spm_ = std::make_shared<const SpmTokenizer>(vocab_);
  }

  // SentencePiece keeps the serialisation it has always had, so its fingerprints are stable.
  std::string blob = bpe ? "kvcache.tokenizer.bpe.v1" : "kvcache.tokenizer.spm.v1";
  put_le(blob, static_cast<uint64_t>(n));
  for (size_t i = 0; i < n; ++i) {
    put_le(blob, static_cast<uint64_t>(v.tokens[i].size()));
    blob.append(v.tokens[i]);
    put_le(blob, std::bit_cast<uint32_t>(v.scores[i]));
    put_le(blob, static_cast<int32_t>(v.types[i]));
  }
  for (const auto& [name, id] : specials) put_le(blob, id);
  put_le(blob, static_cast<uint8_t>(v.add_bos));
  put_le(blob, static_cast<uint8_t>(v.add_space_prefix));
  if (bpe) {
    for (const auto& [name, id] : turn_ends) put_le(blob, id);
    put_le(blob, static_cast<uint8_t>(v.add_eos));
    put_le(blob, static_cast<uint64_t>(v.pre.size()));
    blob.append(v.pre);
    put_le(blob, static_cast<uint64_t>(v.merges.size()));
    for (const std::string& m : v.merges) {
      put_le(blob, static_cast<uint64_t>(m.size()));
      blob.append(m);
    }
  }
  fingerprint_ = XXH3_64bits(blob.data(), blob.size());
}

Tokenizer Tokenizer::from_gguf(const gguf::File& file) {
  std::string warning;
  Vocabulary v = Vocabulary::from_gguf(file, &warning);
  if (!warning.empty()) spdlog::warn("{}", warning);
  try {
    return Tokenizer(std::move(v));
  } catch (const Error& e) {
    fail("{}: {}", file.label(), e.what());
  }
}

std::string_view Tokenizer::pre() const {
  return bpe_ ? std::string_view(bpe_->pre_tokenizer().name()) : std::string_view();
}

bool Tokenizer::has_byte_tokens() const {
  return bpe_ || spm_->has_byte_tokens();
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos) const {
  return encode(text, EncodeOptions{.add_bos = add_bos});
}

size_t Tokenizer::match_special(std::string_view text, size_t i, bool parse_special,
                                int32_t& id) const {
  size_t best = 0;
  uint64_t node = 0;
  for (size_t j = i; j < text.size(); ++j) {
    const auto it = special_edges_->find(node << 8 | static_cast<uint8_t>(text[j]));
    if (it == special_edges_->end()) break;
    node = static_cast<uint64_t>(it->second);
    const int32_t t = (*special_terminal_)[node];
    if (t >= 0 && (parse_special || vocab_->types[t] == TokenType::kUserDefined)) {
      best = j - i + 1;
      id = t;
    }
  }
  return best;
}

void Tokenizer::encode_plain(std::string_view text, bool first, std::vector<int32_t>& out) const {
  const bool prefix = first && vocab_->add_space_prefix;
  if (bpe_) {
    bpe_->encode(text, prefix, out);
  } else {
    spm_->encode(text, prefix, out);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<int32_t> out;
  if (options.add_bos && vocab_->bos_id >= 0) out.push_back(vocab_->bos_id);
  if (spm_ && !options.parse_special) {
    // The spm tokenizer matches user-defined tokens inside its own merge loop.
    spm_->encode(text, vocab_->add_space_prefix, out);
  } else {
    size_t start = 0;  // of the text not yet encoded
    bool first = true;
    for (size_t i = 0; i < text.size();) {
      int32_t id = -1;
      const size_t len = match_special(text, i, options.parse_special, id);
      if (len == 0) {
        ++i;
        continue;
      }
      if (i > start) encode_plain(text.substr(start, i - start), first, out);
      out.push_back(id);
      first = false;
      i += len;
      start = i;
    }
    if (start < text.size()) encode_plain(text.substr(start), first, out);
  }
  if (options.add_eos && vocab_->eos_id >= 0) out.push_back(vocab_->eos_id);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  for (int32_t id : ids) check_id(id);
  return bpe_ ? bpe_->decode(ids) : spm_->decode(ids);
}

std::string Tokenizer::piece(int32_t id) const {
  check_id(id);
  return bpe_ ? bpe_->piece(id) : spm_->piece(id);
}

std::optional<int32_t> Tokenizer::find(std::string_view token) const {
  const auto it = all_ids_->find(token);
  if (it == all_ids_->end()) return std::nullopt;
  return it->second;
}

const std::string& Tokenizer::token_text(int32_t id) const {
  check_id(id);
  return vocab_->tokens[id];
}

TokenType Tokenizer::type(int32_t id) const {
  check_id(id);
  return vocab_->types[id];
}

bool Tokenizer::is_eog(int32_t id) const {
  return id >= 0 && id < size() && eog_mask_[static_cast<size_t>(id)];
}

void Tokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= size()) {
    fail("token id {} is out of range for a vocabulary of {} tokens", id, size());
  }
}

}  // namespace kvc::model
