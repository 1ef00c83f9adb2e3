#include "model/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "model/gguf.h"

namespace kvc::model {
namespace {

using Ids = std::vector<int32_t>;

constexpr std::string_view kSpace = "\xE2\x96\x81";
constexpr int32_t kByte0 = 3;  // the hand-built vocabularies put <0x00> at id 3, like stories260K

std::string sp(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == ' ') {
      out.append(kSpace);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// <unk>, <s>, </s>, optionally the 256 byte tokens, then pieces (spaces written as ' ' and stored
// as U+2581) with the given scores and types.
struct Piece {
  std::string text;
  float score = 0.0f;
  TokenType type = TokenType::kNormal;
};

Vocabulary make_vocab(const std::vector<Piece>& pieces, bool bytes = true) {
  Vocabulary v;
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.scores = {0, 0, 0};
  v.types = {TokenType::kUnknown, TokenType::kControl, TokenType::kControl};
  if (bytes) {
    for (int b = 0; b < 256; ++b) {
      v.tokens.push_back(fmt::format("<0x{:02X}>", b));
      v.scores.push_back(0);
      v.types.push_back(TokenType::kByte);
    }
  }
  for (const Piece& p : pieces) {
    v.tokens.push_back(sp(p.text));
    v.scores.push_back(p.score);
    v.types.push_back(p.type);
  }
  return v;
}

// The id of a piece in a make_vocab vocabulary.
int32_t id_of(const Tokenizer& tok, std::string_view text) {
  const auto id = tok.find(sp(text));
  EXPECT_TRUE(id.has_value()) << "no token '" << text << "'";
  return id.value_or(-1);
}

Vocabulary no_prefix(Vocabulary v) {
  v.add_space_prefix = false;
  return v;
}

// A small English-ish vocabulary with a merge hierarchy, used for round trips without the model.
Tokenizer small_tokenizer() {
  std::vector<Piece> pieces;
  float score = 0;
  for (const char* p :
       {" ",  "e",  "t",  "a",    "o",    "h",      "n",   "s",   "i",    "r",    "l",
        "d",  ".",  ",",  "!",    "é",    " t",     "he",  " a",  "in",   " the", "er",
        "an", " s", "on", " w",   "ll",   " h",     "ing", " he", " and", "re",   "at",
        "en", "ed", " o", "hell", "ello", " hello", "  ",  "   "}) {
    pieces.push_back({p, score});
    score -= 1;
  }
  return Tokenizer(make_vocab(pieces));
}

// Encoding by the definition: repeatedly merge the best-scoring adjacent pair (leftmost on
// ties) by scanning all pairs, then byte fallback. Quadratic but obviously right; it checks the
// fast priority-queue implementation on vocabularies with only normal, control, unknown and byte
// tokens.
Ids reference_encode(const Tokenizer& tok, std::string_view text, bool add_bos) {
  const Vocabulary& v = tok.vocabulary();
  Ids out;
  if (add_bos && v.bos_id >= 0) out.push_back(v.bos_id);
  if (text.empty()) return out;
  std::string s = v.add_space_prefix ? std::string(kSpace) : std::string();
  s += sp(text);
  std::vector<std::string> symbols;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<uint8_t>(s[i]);
    size_t n = c >= 0xF0 && c < 0xF8   ? 4
               : c >= 0xE0 && c < 0xF0 ? 3
               : c >= 0xC0 && c < 0xE0 ? 2
                                       : 1;
    if (i + n > s.size()) n = 1;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<uint8_t>(s[i + k]) & 0xC0) != 0x80) n = 1;
    }
    symbols.push_back(s.substr(i, n));
    i += n;
  }
  auto normal_id = [&](const std::string& piece) -> std::optional<int32_t> {
    const auto id = tok.find(piece);
    if (id && tok.type(*id) == TokenType::kNormal) return id;
    return std::nullopt;
  };
  for (;;) {
    float best = -std::numeric_limits<float>::infinity();
    size_t at = symbols.size();
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto id = normal_id(symbols[i] + symbols[i + 1]);
      if (id && (at == symbols.size() || v.scores[*id] > best)) {
        best = v.scores[*id];
        at = i;
      }
    }
    if (at == symbols.size()) break;
    symbols[at] += symbols[at + 1];
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  for (const std::string& sym : symbols) {
    if (const auto id = normal_id(sym)) {
      out.push_back(*id);
    } else if (tok.has_byte_tokens()) {
      for (char c : sym) out.push_back(*tok.find(fmt::format("<0x{:02X}>", uint8_t(c))));
    } else {
      out.push_back(v.unk_id);
    }
  }
  return out;
}

// Strings whose round trip must be exact: whitespace, punctuation, multi-byte UTF-8, characters
// outside any vocabulary here, and invalid UTF-8.
std::vector<std::string> round_trip_cases() {
  return {"",
          " ",
          "  ",
          "     ",
          "a",
          " a",
          "a ",
          "  leading and trailing  ",
          "multiple   spaces    inside",
          "\n",
          "line one\nline two\n\n",
          "\ttab\tseparated\t",
          " \n \t \r\n",
          "Hello, world! How's it going? (fine) [ok] {x} <s> </s> <unk> <0x41>",
          "Once upon a time, there was a little girl named Lily.",
          "café naïve résumé é",
          "日本語のテキスト",
          "emoji: \xF0\x9F\x98\x80\xF0\x9F\x8E\x89 done",
          "Ω≈ç√∫˜µ≤≥÷ \xE2\x80\x94 \xE2\x80\x9Cquoted\xE2\x80\x9D",
          "z{}|~^`@#%&*_=+",
          std::string("nul\0inside", 10),
          "\xff\xfe",
          "\xff",
          "\x80\x80\x80",
          "truncated \xE6\x97",
          "truncated at end \xF0\x9F\x98",
          "\xE6\x97 space after",
          "\xC3",
          "overlong \xC0\xAF and surrogate \xED\xA0\x80",
          "\xE2\x96 almost a space symbol",
          "mixed \xff valid \xC3\xA9 invalid \xFE"};
}

std::unique_ptr<gguf::File> open_test_model() {
  const char* path = std::getenv("KVCACHE_TEST_MODEL");
  if (path == nullptr || !std::filesystem::exists(path)) return nullptr;
  return gguf::File::open(path);
}

#define SKIP_WITHOUT_MODEL(file)                                                           \
  if (!(file)) {                                                                           \
    GTEST_SKIP() << "KVCACHE_TEST_MODEL not set or missing: point it at stories260K.gguf " \
                    "(shared/models/stories260K.gguf) to run the real-tokenizer tests";    \
  }

// Writes a GGUF v3 image with metadata only, for from_gguf tests.
class GgufWriter {
 public:
  void string(std::string_view key, std::string_view value) {
    begin(key, 8);
    str(value);
  }
  void u32(std::string_view key, uint32_t value) {
    begin(key, 4);
    put(value);
  }
  void boolean(std::string_view key, bool value) {
    begin(key, 7);
    body_.push_back(value ? 1 : 0);
  }
  void strings(std::string_view key, const std::vector<std::string>& values) {
    array(key, 8, values.size());
    for (const auto& v : values) str(v);
  }
  void f32s(std::string_view key, const std::vector<float>& values) {
    array(key, 6, values.size());
    for (float v : values) put(v);
  }
  void i32s(std::string_view key, const std::vector<int32_t>& values) {
    array(key, 5, values.size());
    for (int32_t v : values) put(v);
  }
  // Parses the image; the bytes live as long as the writer.
  std::unique_ptr<gguf::File> file() {
    image_.clear();
    const uint32_t magic = 0x46554747;  // "GGUF"
    put_to(image_, magic);
    put_to(image_, uint32_t{3});
    put_to(image_, uint64_t{0});
    put_to(image_, n_kv_);
    image_.insert(image_.end(), body_.begin(), body_.end());
    return gguf::File::parse(image_, "synthetic.gguf");
  }

 private:
  template <typename T>
  static void put_to(std::vector<uint8_t>& out, T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  template <typename T>
  void put(T v) {
    put_to(body_, v);
  }
  void str(std::string_view s) {
    put(uint64_t{s.size()});
    body_.insert(body_.end(), s.begin(), s.end());
  }
  void begin(std::string_view key, uint32_t type) {
    str(key);
    put(type);
    ++n_kv_;
  }
  void array(std::string_view key, uint32_t element_type, size_t n) {
    begin(key, 9);
    put(element_type);
    put(uint64_t{n});
  }
  std::vector<uint8_t> body_;
  std::vector<uint8_t> image_;
  uint64_t n_kv_ = 0;
};

// A valid llama tokenizer GGUF: <unk>, <s>, </s>, "▁", "a", "▁a".
GgufWriter small_gguf(std::string_view model = "llama") {
  GgufWriter w;
  w.string("tokenizer.ggml.model", model);
  w.strings("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", sp(" "), "a", sp(" a")});
  w.f32s("tokenizer.ggml.scores", {0, 0, 0, -1, -2, -3});
  w.i32s("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1});
  w.u32("tokenizer.ggml.bos_token_id", 1);
  w.u32("tokenizer.ggml.eos_token_id", 2);
  w.u32("tokenizer.ggml.unknown_token_id", 0);
  w.u32("tokenizer.ggml.padding_token_id", 0xFFFFFFFF);
  return w;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// ---- merging ----------------------------------------------------------------------------------

TEST(Tokenizer, MergesHighestScoringPairFirst) {
  const Tokenizer ab_first(no_prefix(make_vocab({{"a"}, {"b"}, {"c"}, {"ab", -1}, {"bc", -2}})));
  EXPECT_EQ(ab_first.encode("abc", false), (Ids{id_of(ab_first, "ab"), id_of(ab_first, "c")}));
  const Tokenizer bc_first(no_prefix(make_vocab({{"a"}, {"b"}, {"c"}, {"ab", -2}, {"bc", -1}})));
  EXPECT_EQ(bc_first.encode("abc", false), (Ids{id_of(bc_first, "a"), id_of(bc_first, "bc")}));
}

TEST(Tokenizer, TiesMergeLeftmostFirst) {
  const Tokenizer tok(no_prefix(make_vocab({{"a"}, {"b"}, {"c"}, {"ab", -1}, {"bc", -1}})));
  EXPECT_EQ(tok.encode("abc", false), (Ids{id_of(tok, "ab"), id_of(tok, "c")}));
  const Tokenizer aa(no_prefix(make_vocab({{"a"}, {"aa", -1}})));
  const int32_t a = id_of(aa, "a");
  const int32_t a2 = id_of(aa, "aa");
  EXPECT_EQ(aa.encode("aaa", false), (Ids{a2, a}));
  EXPECT_EQ(aa.encode("aaaaa", false), (Ids{a2, a2, a}));
}

TEST(Tokenizer, MergesChainAndAreGreedyNotOptimal) {
  const Tokenizer tok(no_prefix(make_vocab(
      {{"a"}, {"b"}, {"c"}, {"d"}, {"ab", -1}, {"cd", -1}, {"bc", -0.5}, {"abcd", -3}})));
  // "bc" wins first, after which neither "ab" nor "cd" can form, so "abcd" is never reached.
  EXPECT_EQ(tok.encode("abcd", false), (Ids{id_of(tok, "a"), id_of(tok, "bc"), id_of(tok, "d")}));
  const Tokenizer chain(no_prefix(make_vocab({{"a"}, {"b"}, {"c"}, {"ab", -1}, {"abc", -2}})));
  EXPECT_EQ(chain.encode("abcab", false), (Ids{id_of(chain, "abc"), id_of(chain, "ab")}));
}

TEST(Tokenizer, SpacesBecomeU2581AndDummyPrefixIsAdded) {
  const std::vector<Piece> pieces = {{" "}, {"a"}, {"b"}, {" a", -1}, {" b", -2}};
  const Tokenizer with(make_vocab(pieces));
  const Tokenizer without(no_prefix(make_vocab(pieces)));
  EXPECT_EQ(with.encode("a b", true), (Ids{1, id_of(with, " a"), id_of(with, " b")}));
  EXPECT_EQ(without.encode("a b", false), (Ids{id_of(without, "a"), id_of(without, " b")}));
  EXPECT_EQ(with.encode("  a", false),
            (Ids{id_of(with, " "), id_of(with, " "), id_of(with, " a")}));
  EXPECT_EQ(with.decode(with.encode("  a", true)), "  a");
  EXPECT_EQ(without.decode(without.encode("  a", true)), "  a");
  // Tabs and newlines are not spaces: they stay themselves (here via byte fallback).
  EXPECT_EQ(without.encode("\t\n", false), (Ids{kByte0 + '\t', kByte0 + '\n'}));
}

TEST(Tokenizer, EmptyTextHasNoDummyPrefix) {
  const Tokenizer tok = small_tokenizer();
  EXPECT_EQ(tok.encode("", false), Ids{});
  EXPECT_EQ(tok.encode("", true), Ids{1});
  EXPECT_EQ(tok.decode(Ids{1}), "");
  EXPECT_EQ(tok.decode(Ids{}), "");
}

TEST(Tokenizer, NoBosWhenVocabularyHasNone) {
  Vocabulary v = make_vocab({{"a"}});
  v.bos_id = -1;
  const Tokenizer tok(std::move(v));
  EXPECT_EQ(tok.encode("a", true), tok.encode("a", false));
}

TEST(Tokenizer, ByteFallbackForCharactersOutsideTheVocabulary) {
  const Tokenizer tok(no_prefix(make_vocab({{"a"}, {"é"}})));
  ASSERT_TRUE(tok.has_byte_tokens());
  EXPECT_EQ(tok.encode("z", false), (Ids{kByte0 + 'z'}));
  EXPECT_EQ(tok.encode("é", false), (Ids{id_of(tok, "é")}));
  // U+00E8 "è" is C3 A8: one byte token per UTF-8 byte.
  EXPECT_EQ(tok.encode("aè", true), (Ids{1, id_of(tok, "a"), kByte0 + 0xC3, kByte0 + 0xA8}));
  EXPECT_EQ(tok.encode("\xff\xfe", false), (Ids{kByte0 + 0xFF, kByte0 + 0xFE}));
  EXPECT_EQ(tok.decode(tok.encode("aè\xff", true)), "aè\xff");
}

TEST(Tokenizer, UnknownTokenWhenThereAreNoByteTokens) {
  const Tokenizer tok(no_prefix(make_vocab({{"a"}, {"b"}, {"ab", -1}}, /*bytes=*/false)));
  ASSERT_FALSE(tok.has_byte_tokens());
  const int32_t ab = id_of(tok, "ab");
  // One unknown per character, whatever its byte length.
  EXPECT_EQ(tok.encode("abzab", false), (Ids{ab, 0, ab}));
  EXPECT_EQ(tok.encode("日本", false), (Ids{0, 0}));
  EXPECT_EQ(tok.encode("\xff", false), (Ids{0}));
  EXPECT_EQ(tok.decode(tok.encode("abz", false)), "ab \xE2\x81\x87 ");
}

TEST(Tokenizer, ControlTokensAreNeverProducedFromText) {
  const Tokenizer tok(no_prefix(make_vocab({{"a"}, {"b"}, {"ab", 10, TokenType::kControl}})));
  EXPECT_EQ(tok.encode("ab", false), (Ids{id_of(tok, "a"), id_of(tok, "b")}));
  // The text "<s>" is characters, not BOS.
  for (int32_t id : tok.encode("<s></s><unk><0x41>", true)) {
    if (id == 1) continue;
    EXPECT_NE(tok.type(id), TokenType::kControl);
    EXPECT_NE(tok.type(id), TokenType::kUnknown);
  }
  EXPECT_EQ(tok.encode("<s>", true)[1], kByte0 + '<');
}

TEST(Tokenizer, ParseSpecialMatchesControlTokensAndPrefixesOnlyTheStart) {
  const Tokenizer tok(
      make_vocab({{" "}, {"a"}, {" a", -1}, {"<|im_end|>", 0, TokenType::kControl}}));
  const int32_t im_end = id_of(tok, "<|im_end|>");
  EXPECT_EQ(tok.encode("a<|im_end|>a", EncodeOptions{.add_bos = true, .parse_special = true}),
            (Ids{1, id_of(tok, " a"), im_end, id_of(tok, "a")}));
  // Without parse_special the same text is characters.
  const Ids plain = tok.encode("a<|im_end|>", false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), im_end), 0);
  EXPECT_TRUE(tok.is_eog(im_end));
  EXPECT_TRUE(tok.is_eog(tok.eos_id()));
  EXPECT_FALSE(tok.is_eog(tok.bos_id()));
  EXPECT_EQ(tok.eog_ids(), (Ids{2, im_end}));
  EXPECT_EQ(tok.token_text(im_end), "<|im_end|>");
  EXPECT_EQ(tok.model(), TokenizerModel::kSpm);
  EXPECT_EQ(tok.pre(), "");
}

TEST(Tokenizer, UnusedTokensAreMergedThroughButNeverEmitted) {
  const Tokenizer tok(
      no_prefix(make_vocab({{"a"}, {"b"}, {"c"}, {"ab", 0, TokenType::kUnused}, {"abc", -1}})));
  EXPECT_EQ(tok.encode("abc", false), (Ids{id_of(tok, "abc")}));
  EXPECT_EQ(tok.encode("ab", false), (Ids{id_of(tok, "a"), id_of(tok, "b")}));
  EXPECT_EQ(tok.encode("abab", false),
            (Ids{id_of(tok, "a"), id_of(tok, "b"), id_of(tok, "a"), id_of(tok, "b")}));
}

TEST(Tokenizer, UserDefinedTokensAreMatchedWholeAndNeverMerged) {
  const Tokenizer tok(no_prefix(make_vocab({{"a"},
                                            {"b"},
                                            {"<|x|>", 0, TokenType::kUserDefined},
                                            {"<|x|>b", 10},
                                            {"<|xy|>", 0, TokenType::kUserDefined}})));
  const int32_t x = id_of(tok, "<|x|>");
  EXPECT_EQ(tok.encode("a<|x|>b", false), (Ids{id_of(tok, "a"), x, id_of(tok, "b")}));
  EXPECT_EQ(tok.encode("<|xy|><|x|>", false), (Ids{id_of(tok, "<|xy|>"), x}));
  EXPECT_EQ(tok.decode(tok.encode("a<|x|>b<|x", false)), "a<|x|>b<|x");
}

// ---- decoding and pieces ----------------------------------------------------------------------

TEST(Tokenizer, DecodeStripsOnlyTheDummyPrefix) {
  const Tokenizer tok(make_vocab({{" "}, {"a"}, {" a", -1}}));
  const int32_t space = id_of(tok, " ");
  const int32_t space_a = id_of(tok, " a");
  EXPECT_EQ(tok.decode(Ids{1, space_a, space_a}), "a a");
  EXPECT_EQ(tok.decode(Ids{space_a, 2}), "a");
  EXPECT_EQ(tok.decode(Ids{1, space, space_a}), " a");
  EXPECT_EQ(tok.decode(Ids{1, kByte0 + 'a', space_a}), "a a");
  const Tokenizer raw(no_prefix(make_vocab({{" "}, {"a"}, {" a", -1}})));
  EXPECT_EQ(raw.decode(Ids{1, space_a}), " a");
  EXPECT_THROW(tok.decode(Ids{1, tok.size()}), Error);
  EXPECT_THROW(tok.decode(Ids{-1}), Error);
}

TEST(Tokenizer, PieceIsWhatATokenContributesWhenStreaming) {
  const Tokenizer tok(make_vocab({{" "}, {" Once", -1}, {"a"}}));
  EXPECT_EQ(tok.piece(id_of(tok, " ")), " ");
  EXPECT_EQ(tok.piece(id_of(tok, " Once")), " Once");
  EXPECT_EQ(tok.piece(id_of(tok, "a")), "a");
  EXPECT_EQ(tok.piece(kByte0 + 0x0A), "\n");
  EXPECT_EQ(tok.piece(kByte0 + 0xFF), "\xff");
  EXPECT_EQ(tok.piece(kByte0), std::string(1, '\0'));
  EXPECT_EQ(tok.piece(1), "");
  EXPECT_EQ(tok.piece(2), "");
  EXPECT_EQ(tok.piece(0), " \xE2\x81\x87 ");
  EXPECT_THROW(tok.piece(tok.size()), Error);
  EXPECT_THROW(tok.piece(-1), Error);
  // Streaming a multi-byte character through byte tokens yields its bytes in order.
  std::string streamed;
  for (int32_t id : tok.encode("日", false)) streamed += tok.piece(id);
  EXPECT_EQ(streamed, " 日");
}

TEST(Tokenizer, LiteralU2581DecodesAsSpace) {
  // SentencePiece stores spaces as U+2581, so that character in the input cannot come back.
  const Tokenizer tok = small_tokenizer();
  EXPECT_EQ(tok.decode(tok.encode("a\xE2\x96\x81"
                                  "b",
                                  true)),
            "a b");
}

TEST(Tokenizer, FindAndTypes) {
  const Tokenizer tok = small_tokenizer();
  EXPECT_EQ(tok.find("<s>"), 1);
  EXPECT_EQ(tok.find("<0x41>"), kByte0 + 0x41);
  EXPECT_EQ(tok.find("no such token"), std::nullopt);
  EXPECT_EQ(tok.type(0), TokenType::kUnknown);
  EXPECT_EQ(tok.type(1), TokenType::kControl);
  EXPECT_EQ(tok.type(kByte0), TokenType::kByte);
  EXPECT_EQ(tok.type(id_of(tok, "he")), TokenType::kNormal);
  EXPECT_EQ(token_type_name(TokenType::kUserDefined), "user-defined");
}

TEST(Tokenizer, TypesAreInferredWhenAbsent) {
  Vocabulary v = make_vocab({{"a"}});
  v.types.clear();
  v.scores.clear();
  const Tokenizer tok(std::move(v));
  EXPECT_EQ(tok.type(0), TokenType::kUnknown);
  EXPECT_EQ(tok.type(1), TokenType::kControl);
  EXPECT_EQ(tok.type(2), TokenType::kControl);
  EXPECT_EQ(tok.type(kByte0 + 0x41), TokenType::kByte);
  EXPECT_EQ(tok.type(id_of(tok, "a")), TokenType::kNormal);
  EXPECT_TRUE(tok.has_byte_tokens());
  EXPECT_EQ(tok.vocabulary().scores.size(), static_cast<size_t>(tok.size()));
}

// ---- round trips ------------------------------------------------------------------------------

void expect_round_trips(const Tokenizer& tok) {
  for (const std::string& s : round_trip_cases()) {
    for (bool bos : {false, true}) {
      const Ids ids = tok.encode(s, bos);
      EXPECT_EQ(tok.decode(ids), s) << "bos=" << bos << " text='" << s << "'";
      // Streaming the pieces gives the same text plus the dummy-prefix space.
      std::string streamed;
      for (int32_t id : ids) streamed += tok.piece(id);
      const std::string prefix = tok.add_space_prefix() && !s.empty() ? " " : "";
      EXPECT_EQ(streamed, prefix + s);
    }
  }
}

// Random byte strings; U+2581 itself is left out because it decodes to a space by design.
void expect_fuzz_round_trips(const Tokenizer& tok, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<std::string> atoms = {
      " ",    "  ",   "\n",       "e",    "th",  "é",   "日", "\xF0\x9F\x98\x80",
      "\xff", "\xC3", "\xE2\x96", "\x81", "the", "Lily"};
  for (int i = 0; i < 3000; ++i) {
    std::string s;
    const int len = static_cast<int>(rng() % 40);
    for (int k = 0; k < len; ++k) {
      if (i % 2 == 0) {
        s.push_back(static_cast<char>(rng() & 0xFF));
      } else {
        s += atoms[rng() % atoms.size()];
      }
    }
    if (s.find(kSpace) != std::string::npos) continue;
    const Ids ids = tok.encode(s, true);
    ASSERT_EQ(tok.decode(ids), s) << "case " << i;
    ASSERT_EQ(ids, reference_encode(tok, s, true)) << "case " << i;
  }
}

TEST(Tokenizer, RoundTripsOnSmallVocabulary) {
  const Tokenizer tok = small_tokenizer();
  expect_round_trips(tok);
  expect_round_trips(Tokenizer(no_prefix(small_tokenizer().vocabulary())));
}

TEST(Tokenizer, FuzzRoundTripsAndMatchesReferenceOnSmallVocabulary) {
  expect_fuzz_round_trips(small_tokenizer(), 12345);
  expect_fuzz_round_trips(Tokenizer(no_prefix(small_tokenizer().vocabulary())), 777);
}

TEST(Tokenizer, LongTextEncodesQuickly) {
  const Tokenizer tok = small_tokenizer();
  std::mt19937 rng(1);
  const std::vector<std::string> words = {"the", "hello", "and", "a",     "there", "dinner",
                                          "é",   "日本",  "ran", "said,", "in",    "tree."};
  std::string text;
  for (int i = 0; i < 10000; ++i) text += words[rng() % words.size()] + (i % 17 ? " " : "\n");
  const auto start = std::chrono::steady_clock::now();
  const Ids ids = tok.encode(text, true);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(tok.decode(ids), text);
  // Generous, to stay robust on a loaded machine and under sanitizers; quadratic would be far off.
  EXPECT_LT(seconds, 2.0) << text.size() << " bytes";
  // One long run with no spaces: every merge rescans neighbours only.
  const std::string run(100000, 'l');
  EXPECT_EQ(tok.decode(tok.encode(run, false)), run);
}

// ---- validation -------------------------------------------------------------------------------

TEST(Tokenizer, RejectsBadVocabularies) {
  auto bad = [](auto edit) {
    Vocabulary v = make_vocab({{"a"}, {"b"}});
    edit(v);
    return error_of([&] { Tokenizer t(std::move(v)); });
  };
  EXPECT_NE(bad([](Vocabulary& v) { v.scores.pop_back(); }).find("scores"), std::string::npos);
  EXPECT_NE(bad([](Vocabulary& v) { v.types.push_back(TokenType::kNormal); }).find("types"),
            std::string::npos);
  const std::string bos = bad([](Vocabulary& v) { v.bos_id = 999; });
  EXPECT_NE(bos.find("bos"), std::string::npos) << bos;
  EXPECT_NE(bos.find("999"), std::string::npos) << bos;
  EXPECT_NE(bad([](Vocabulary& v) { v.eos_id = -2; }).find("eos"), std::string::npos);
  EXPECT_NE(bad([](Vocabulary& v) { v.unk_id = 1 << 20; }).find("unknown"), std::string::npos);
  EXPECT_NE(bad([](Vocabulary& v) { v.pad_id = 1000; }).find("padding"), std::string::npos);
  EXPECT_NE(bad([](Vocabulary& v) { v.tokens.clear(); }).find("empty"), std::string::npos);
  EXPECT_NE(bad([](Vocabulary& v) { v.scores[5] = std::nanf(""); }).find("NaN"), std::string::npos);
  EXPECT_NE(bad([](Vocabulary& v) { v.types[4] = static_cast<TokenType>(9); }).find("type 9"),
            std::string::npos);
  EXPECT_NE(bad([](Vocabulary& v) { v.tokens[kByte0 + 7] = "<0xZZ>"; }).find("<0xZZ>"),
            std::string::npos);
  EXPECT_NE(bad([](Vocabulary& v) { v.tokens[kByte0 + 7] = "<0x06>"; }).find("duplicates"),
            std::string::npos);
  const std::string partial =
      bad([](Vocabulary& v) { v.types[kByte0 + 0x41] = TokenType::kNormal; });
  EXPECT_NE(partial.find("<0x41> is missing"), std::string::npos) << partial;
  const std::string neither = error_of([] {
    Vocabulary v = make_vocab({{"a"}}, /*bytes=*/false);
    v.unk_id = -1;
    Tokenizer t(std::move(v));
  });
  EXPECT_NE(neither.find("neither byte tokens nor an unknown token"), std::string::npos);
}

TEST(Tokenizer, FingerprintCoversTokensScoresTypesAndSpecialIds) {
  const Vocabulary base = small_tokenizer().vocabulary();
  const uint64_t fp = Tokenizer(base).fingerprint();
  EXPECT_EQ(fp, small_tokenizer().fingerprint());
  auto changed = [&](auto edit) {
    Vocabulary v = base;
    edit(v);
    return Tokenizer(std::move(v)).fingerprint();
  };
  EXPECT_NE(fp, changed([](Vocabulary& v) { v.tokens.back() += "x"; }));
  EXPECT_NE(fp, changed([](Vocabulary& v) { v.scores.back() -= 0.5f; }));
  EXPECT_NE(fp, changed([](Vocabulary& v) { v.types.back() = TokenType::kUserDefined; }));
  EXPECT_NE(fp, changed([](Vocabulary& v) { v.bos_id = 2; }));
  EXPECT_NE(fp, changed([](Vocabulary& v) { v.eos_id = 1; }));
  EXPECT_NE(fp, changed([](Vocabulary& v) { v.pad_id = 0; }));
  EXPECT_NE(fp, changed([](Vocabulary& v) { v.add_space_prefix = false; }));
}

// ---- from_gguf --------------------------------------------------------------------------------

TEST(TokenizerGguf, ReadsAVocabulary) {
  GgufWriter w = small_gguf();
  w.boolean("tokenizer.ggml.add_bos_token", false);
  const auto file = w.file();
  const Tokenizer tok = Tokenizer::from_gguf(*file);
  EXPECT_EQ(tok.size(), 6);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.unk_id(), 0);
  EXPECT_EQ(tok.pad_id(), -1);
  EXPECT_FALSE(tok.add_bos());
  EXPECT_TRUE(tok.add_space_prefix());
  EXPECT_FALSE(tok.has_byte_tokens());
  EXPECT_EQ(tok.encode("a a", true), (Ids{1, 5, 5}));
  EXPECT_EQ(tok.encode("a b", false), (Ids{5, 3, 0}));
}

// As llama.cpp: a SentencePiece vocabulary without special ids has <unk> 0, <s> 1 and </s> 2
// (those its tokens reach); a gpt2 one has none.
TEST(TokenizerGguf, OptionalKeysHaveDefaults) {
  GgufWriter w;
  w.string("tokenizer.ggml.model", "llama");
  w.strings("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a", sp(" a")});
  w.boolean("tokenizer.ggml.add_space_prefix", false);
  const auto file = w.file();
  const Tokenizer tok = Tokenizer::from_gguf(*file);
  EXPECT_EQ(tok.vocabulary().unk_id, 0);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.vocabulary().pad_id, -1);
  EXPECT_TRUE(tok.add_bos());
  EXPECT_FALSE(tok.add_space_prefix());
  EXPECT_EQ(tok.vocabulary().scores, (std::vector<float>{0, 0, 0, 0, 0}));
  EXPECT_EQ(tok.type(0), TokenType::kUnknown);
  EXPECT_EQ(tok.type(1), TokenType::kControl);
  EXPECT_EQ(tok.type(2), TokenType::kControl);
  EXPECT_EQ(tok.type(4), TokenType::kNormal);
  EXPECT_EQ(tok.encode("a a", true), (Ids{1, 3, 4}));

  // A default past the last token is none.
  GgufWriter two;
  two.string("tokenizer.ggml.model", "llama");
  two.strings("tokenizer.ggml.tokens", {"<unk>", "<s>"});
  const Vocabulary short_vocab = Vocabulary::from_gguf(*two.file());
  EXPECT_EQ(short_vocab.unk_id, 0);
  EXPECT_EQ(short_vocab.bos_id, 1);
  EXPECT_EQ(short_vocab.eos_id, -1);

  GgufWriter bpe;
  bpe.string("tokenizer.ggml.model", "gpt2");
  bpe.strings("tokenizer.ggml.tokens", {"a", "b", "c", "ab"});
  bpe.strings("tokenizer.ggml.merges", {"a b"});
  const Vocabulary gpt2 = Vocabulary::from_gguf(*bpe.file());
  EXPECT_EQ(gpt2.unk_id, -1);
  EXPECT_EQ(gpt2.bos_id, -1);
  EXPECT_EQ(gpt2.eos_id, -1);
}

TEST(TokenizerGguf, RejectsOtherTokenizerModels) {
  GgufWriter w = small_gguf("bert");
  const auto file = w.file();
  const std::string msg = error_of([&] { Tokenizer::from_gguf(*file); });
  EXPECT_NE(msg.find("tokenizer.ggml.model"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'bert'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("synthetic.gguf"), std::string::npos) << msg;
}

TEST(TokenizerGguf, RejectsMissingAndMalformedKeys) {
  {
    GgufWriter w;
    w.strings("tokenizer.ggml.tokens", {"<unk>"});
    const auto file = w.file();
    EXPECT_NE(error_of([&] { Tokenizer::from_gguf(*file); }).find("tokenizer.ggml.model"),
              std::string::npos);
  }
  {
    GgufWriter w;
    w.string("tokenizer.ggml.model", "llama");
    const auto file = w.file();
    EXPECT_NE(error_of([&] { Tokenizer::from_gguf(*file); }).find("tokenizer.ggml.tokens"),
              std::string::npos);
  }
  {
    GgufWriter short_scores;
    short_scores.string("tokenizer.ggml.model", "llama");
    short_scores.strings("tokenizer.ggml.tokens", {"<unk>", "a"});
    short_scores.f32s("tokenizer.ggml.scores", {0});
    const auto file = short_scores.file();
    const std::string msg = error_of([&] { Tokenizer::from_gguf(*file); });
    EXPECT_NE(msg.find("tokenizer.ggml.scores has 1 entries"), std::string::npos) << msg;
  }
  {
    GgufWriter w;
    w.string("tokenizer.ggml.model", "llama");
    w.strings("tokenizer.ggml.tokens", {"<unk>", "a"});
    w.u32("tokenizer.ggml.unknown_token_id", 0);
    w.u32("tokenizer.ggml.bos_token_id", 7);
    const auto file = w.file();
    const std::string msg = error_of([&] { Tokenizer::from_gguf(*file); });
    EXPECT_NE(msg.find("tokenizer.ggml.bos_token_id = 7 is out of range"), std::string::npos)
        << msg;
  }
  {
    GgufWriter w;
    w.string("tokenizer.ggml.model", "llama");
    w.strings("tokenizer.ggml.tokens", {"<unk>", "a"});
    w.i32s("tokenizer.ggml.token_type", {2, 42});
    const auto file = w.file();
    const std::string msg = error_of([&] { Tokenizer::from_gguf(*file); });
    EXPECT_NE(msg.find("tokenizer.ggml.token_type[1] is 42"), std::string::npos) << msg;
  }
  {
    // Vocabulary-level problems are reported with the file's name.
    GgufWriter w;
    w.string("tokenizer.ggml.model", "llama");
    w.strings("tokenizer.ggml.tokens", {"a", "b"});
    w.u32("tokenizer.ggml.unknown_token_id", 0xFFFFFFFF);  // none, rather than the default 0
    const auto file = w.file();
    const std::string msg = error_of([&] { Tokenizer::from_gguf(*file); });
    EXPECT_NE(msg.find("synthetic.gguf: "), std::string::npos) << msg;
    EXPECT_NE(msg.find("neither byte tokens nor an unknown token"), std::string::npos) << msg;
  }
}

// ---- stories260K ------------------------------------------------------------------------------

// The first 64 greedy ids stories260K generates from BOS (shared/models/PROVENANCE.md).
const Ids kReferenceGreedy = {403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395,
                              317, 426, 338, 401, 396, 267, 337, 410, 408, 419, 292, 411, 322,
                              265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432,
                              352, 266, 268, 388, 426, 338, 391, 266, 267, 337, 335, 312, 432,
                              398, 312, 286, 267, 414, 270, 333, 415, 426, 13,  438, 310};

TEST(Stories260K, EncodesThePrompt) {
  const auto file = open_test_model();
  SKIP_WITHOUT_MODEL(file);
  const Tokenizer tok = Tokenizer::from_gguf(*file);
  EXPECT_EQ(tok.size(), 512);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_TRUE(tok.add_bos());
  EXPECT_TRUE(tok.has_byte_tokens());
  EXPECT_EQ(tok.encode("Once upon a time", true), (Ids{1, 403, 407, 261, 378}));
  EXPECT_EQ(tok.piece(403), " Once");
  EXPECT_EQ(tok.piece(13), "\n");
  EXPECT_EQ(tok.find("<s>"), 1);
}

TEST(Stories260K, DecodesTheReferenceGeneration) {
  const auto file = open_test_model();
  SKIP_WITHOUT_MODEL(file);
  const Tokenizer tok = Tokenizer::from_gguf(*file);
  Ids ids = {1};
  ids.insert(ids.end(), kReferenceGreedy.begin(), kReferenceGreedy.end());
  const std::string text = tok.decode(ids);
  EXPECT_TRUE(
      text.starts_with("Once upon a time, there was a little girl named Lily. She loved "
                       "to play outside in the park. One day, she saw a big, red ball."))
      << text;
  // The model learned this tokenizer's segmentation, so its output re-encodes to the same ids.
  EXPECT_EQ(tok.encode(text, true), ids);
}

TEST(Stories260K, RoundTripsAndMatchesReference) {
  const auto file = open_test_model();
  SKIP_WITHOUT_MODEL(file);
  const Tokenizer tok = Tokenizer::from_gguf(*file);
  expect_round_trips(tok);
  expect_fuzz_round_trips(tok, 2024);
  for (const std::string& s : round_trip_cases()) {
    EXPECT_EQ(tok.encode(s, true), reference_encode(tok, s, true)) << s;
  }
  // é is a token of its own; 日 is not, so it falls back to its three bytes.
  EXPECT_EQ(tok.encode("日", false),
            (Ids{tok.find(sp(" ")).value(), 3 + 0xE6, 3 + 0x97, 3 + 0xA5}));
}

TEST(Stories260K, FingerprintIsStable) {
  const auto file = open_test_model();
  SKIP_WITHOUT_MODEL(file);
  const Tokenizer tok = Tokenizer::from_gguf(*file);
  // Pinned: a change here changes every prefix-cache key built on this tokenizer.
  EXPECT_EQ(tok.fingerprint(), 0x367fe360790bb92bu) << fmt::format("0x{:016x}", tok.fingerprint());
}

TEST(Stories260K, LongTextEncodesQuickly) {
  const auto file = open_test_model();
  SKIP_WITHOUT_MODEL(file);
  const Tokenizer tok = Tokenizer::from_gguf(*file);
  Ids ids = {1};
  ids.insert(ids.end(), kReferenceGreedy.begin(), kReferenceGreedy.end());
  const std::string paragraph = tok.decode(ids) + "\n";
  std::string text;
  while (text.size() < 60000) text += paragraph;  // about 10,000 words
  const auto start = std::chrono::steady_clock::now();
  const Ids encoded = tok.encode(text, true);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(tok.decode(encoded), text);
  EXPECT_LT(seconds, 2.0);
  std::cout << "stories260K: encoded " << text.size() << " bytes into " << encoded.size()
            << " tokens in " << seconds * 1000 << " ms\n";
}

}  // namespace
}  // namespace kvc::model
