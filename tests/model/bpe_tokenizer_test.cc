// Byte-level BPE without shared files: the byte alphabet, pre-tokenizer splits on tricky text,
// ranked merges, special and added tokens, end of generation, round trips and streaming pieces.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/utf8.h"
#include "model/byte_unicode.h"
#include "model/pretokenizer.h"
#include "model/tokenizer.h"

namespace kvc::model {
namespace {

using Ids = std::vector<int32_t>;
using Words = std::vector<std::string>;

Words split(std::string_view pre, std::string_view text) {
  Words out;
  for (std::string_view w : PreTokenizer::named(pre).split(text)) out.emplace_back(w);
  return out;
}

// ---- byte alphabet ----------------------------------------------------------------------------

TEST(ByteUnicode, MapsEveryByteToOnePrintableCharacterAndBack) {
  EXPECT_EQ(bytes_to_unicode(" "), "\xC4\xA0");   // Ġ
  EXPECT_EQ(bytes_to_unicode("\n"), "\xC4\x8A");  // Ċ
  EXPECT_EQ(bytes_to_unicode("a!~"), "a!~");
  EXPECT_EQ(byte_to_code_point(0xAD), 0x143u);  // the last remapped byte
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string mapped = bytes_to_unicode(all);
  EXPECT_EQ(unicode_to_bytes(mapped), all);
  // Characters outside the alphabet decode to themselves.
  EXPECT_EQ(unicode_to_bytes("\xE4\xBD\xA0"), "\xE4\xBD\xA0");
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(code_point_to_byte(byte_to_code_point(static_cast<uint8_t>(b))), b);
  }
  EXPECT_FALSE(code_point_to_byte(0x20).has_value());
  EXPECT_FALSE(code_point_to_byte(0x144).has_value());
}

// ---- pre-tokenizers ---------------------------------------------------------------------------

TEST(PreTokenizer, Gpt2KeepsContractionsAndLeavesTheLastSpaceToTheNextWord) {
  EXPECT_EQ(split("gpt-2", "Hello world's 12345  \n\nfoo"),
            (Words{"Hello", " world", "'s", " 12345", "  \n", "\n", "foo"}));
  EXPECT_EQ(split("gpt-2", "I'M you'll"), (Words{"I", "'", "M", " you", "'ll"}));
  EXPECT_EQ(split("gpt-2", "emoji \xF0\x9F\x98\x80\xF0\x9F\x98\x80!! ok"),
            (Words{"emoji", " \xF0\x9F\x98\x80\xF0\x9F\x98\x80!!", " ok"}));
  EXPECT_EQ(split("mpt", "a  b"), split("gpt-2", "a  b"));
}

TEST(PreTokenizer, Llama3GroupsDigitsInThreesAndFoldsContractionCase) {
  EXPECT_EQ(split("llama-bpe", "I'M you'll 1234567 x\n\n  y"),
            (Words{"I", "'M", " you", "'ll", " ", "123", "456", "7", " x", "\n\n", " ", " y"}));
  EXPECT_EQ(split("llama-bpe", "Hello  \n\nfoo"), (Words{"Hello", "  \n\n", "foo"}));
  EXPECT_EQ(split("llama-bpe", "a\tb"), (Words{"a", "\tb"}));
  // 'ſ (long s) is not the contraction 's.
  EXPECT_EQ(split("llama-bpe", "x'\xC5\xBF"), (Words{"x", "'\xC5\xBF"}));
}

TEST(PreTokenizer, Qwen2SplitsEveryDigit) {
  EXPECT_EQ(split("qwen2", "ab 2024"), (Words{"ab", " ", "2", "0", "2", "4"}));
}

TEST(PreTokenizer, DeepseekIsolatesNewlinesPunctuationCjkAndNumbers) {
  EXPECT_EQ(split("deepseek-llm", "Hello world's 12345  \n\nfoo"),
            (Words{"Hello", " world", "'", "s", " ", "12345", "  ", "\n", "\n", "foo"}));
  EXPECT_EQ(split("deepseek-llm", "\xE4\xBD\xA0\xE5\xA5\xBD abc"),
            (Words{"\xE4\xBD\xA0\xE5\xA5\xBD", " abc"}));
  EXPECT_EQ(split("deepseek-coder", "x 123"), (Words{"x", " ", "1", "2", "3"}));
  // Greek capital iota with oxia (U+1FDB) is in the letter class, as the range's end.
  EXPECT_EQ(split("deepseek-llm", "\xE1\xBF\x9B!"), (Words{"\xE1\xBF\x9B", "!"}));
}

TEST(PreTokenizer, FalconStarcoderAndDefault) {
  EXPECT_EQ(split("falcon", "$+<=>^~| x...y 1000000"),
            (Words{"$+<=>^~|", " x", "...", "y", " ", "100", "000", "0"}));
  EXPECT_EQ(split("starcoder", "ab 12"), (Words{"ab", " ", "1", "2"}));
  EXPECT_EQ(split("command-r", "ab 12"), split("refact", "ab 12"));
  EXPECT_EQ(split("default", "it's 1000000"), (Words{"it", "'", "s", " ", "100", "000", "0"}));
  EXPECT_EQ(split("", "a b"), split("default", "a b"));
}

TEST(PreTokenizer, PiecesAlwaysConcatenateBackToTheInput) {
  std::mt19937 rng(7);
  const std::vector<std::string> atoms = {
      "a",        "Z",    " ",        "  ",           "\n",
      "\r\n",     "\t",   "'s",       "'LL",          "9",
      "12345",    "!",    "...",      "\xE4\xBD\xA0", "\xF0\x9F\x98\x80",
      "\xC3\xA9", "\xFF", "\xE4\xBD", "\xE2\x80\x83"};
  for (std::string_view name : PreTokenizer::supported_names()) {
    const PreTokenizer p = PreTokenizer::named(name);
    for (int round = 0; round < 200; ++round) {
      std::string text;
      const int n = static_cast<int>(rng() % 12);
      for (int i = 0; i < n; ++i) text += atoms[rng() % atoms.size()];
      std::string joined;
      for (std::string_view w : p.split(text)) {
        EXPECT_FALSE(w.empty()) << name;
        joined += w;
      }
      EXPECT_EQ(joined, text) << name;
    }
  }
}

TEST(PreTokenizer, UnknownNamesAreRejectedWithTheSupportedList) {
  try {
    PreTokenizer::named("nonsense-bpe");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'nonsense-bpe'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("llama-bpe"), std::string::npos) << msg;
    EXPECT_NE(msg.find("deepseek-coder"), std::string::npos) << msg;
  }
}

TEST(PreTokenizer, LongWhitespaceRunsDoNotExhaustTheMatcher) {
  const std::string text = "a" + std::string(200000, ' ') + "b";
  for (std::string_view name : {"gpt-2", "llama-bpe", "qwen2"}) {
    std::string joined;
    for (std::string_view w : PreTokenizer::named(name).split(text)) joined += w;
    EXPECT_EQ(joined, text) << name;
  }
}

// ---- the tokenizer ----------------------------------------------------------------------------

// The 256 byte characters (ids 0..255, in byte order), then merged tokens, then specials.
struct TinyBpe {
  Vocabulary v;
  int32_t id(std::string_view raw) const {
    const std::string t = bytes_to_unicode(raw);
    for (size_t i = 0; i < v.tokens.size(); ++i) {
      if (v.tokens[i] == t) return static_cast<int32_t>(i);
    }
    ADD_FAILURE() << "no token for '" << raw << "'";
    return -1;
  }
  int32_t special(std::string_view text) const {
    for (size_t i = 0; i < v.tokens.size(); ++i) {
      if (v.tokens[i] == text) return static_cast<int32_t>(i);
    }
    return -1;
  }
};

TinyBpe tiny_bpe(std::string pre = "gpt-2",
                 std::vector<std::pair<std::string, std::string>> merges = {{"l", "l"},
                                                                            {"h", "e"},
                                                                            {"he", "ll"},
                                                                            {"hell", "o"},
                                                                            {" ", "w"},
                                                                            {" w", "o"},
                                                                            {"r", "l"},
                                                                            {" wo", "rl"},
                                                                            {" worl", "d"},
                                                                            {"a", "a"}}) {
  TinyBpe t;
  Vocabulary& v = t.v;
  v.model = TokenizerModel::kBpe;
  v.pre = std::move(pre);
  for (int b = 0; b < 256; ++b)
    v.tokens.push_back(bytes_to_unicode(std::string(1, static_cast<char>(b))));
  for (const auto& [l, r] : merges) {
    const std::string a = bytes_to_unicode(l);
    const std::string b = bytes_to_unicode(r);
    v.merges.push_back(a + " " + b);
    v.tokens.push_back(a + b);
  }
  v.types.assign(v.tokens.size(), TokenType::kNormal);
  v.tokens.push_back("<|endoftext|>");
  v.types.push_back(TokenType::kNormal);  // typed control because it ends generation
  v.tokens.push_back("<tool>");
  v.types.push_back(TokenType::kUserDefined);
  v.tokens.push_back("<|im_start|>");
  v.types.push_back(TokenType::kControl);
  v.bos_id = v.eos_id = static_cast<int32_t>(v.tokens.size()) - 3;
  v.unk_id = -1;
  v.add_bos = false;
  v.add_space_prefix = false;
  return t;
}

TEST(BpeTokenizer, MergesByRankLowestFirst) {
  const TinyBpe t = tiny_bpe();
  const Tokenizer tok(t.v);
  EXPECT_EQ(tok.model(), TokenizerModel::kBpe);
  EXPECT_EQ(tok.encode("hello world", false), (Ids{t.id("hello"), t.id(" world")}));
  EXPECT_EQ(tok.encode("help", false), (Ids{t.id("he"), t.id("l"), t.id("p")}));
  // Ties go to the leftmost pair.
  EXPECT_EQ(tok.encode("aaa", false), (Ids{t.id("aa"), t.id("a")}));
  // A lower rank wins over position: "b c" (rank 0) before "a b" (rank 1).
  const TinyBpe bc = tiny_bpe("gpt-2", {{"b", "c"}, {"a", "b"}});
  const Tokenizer bc_tok(bc.v);
  EXPECT_EQ(bc_tok.encode("abc", false), (Ids{bc.id("a"), bc.id("bc")}));
}

TEST(BpeTokenizer, MergesNeverCrossWordBoundaries) {
  const TinyBpe t = tiny_bpe("gpt-2", {{"o", " "}, {"h", "o"}});
  const Tokenizer tok(t.v);
  EXPECT_EQ(tok.encode("ho ho", false), (Ids{t.id("ho"), t.id(" "), t.id("ho")}));
}

TEST(BpeTokenizer, IgnoreMergesEmitsWholeWordTokens) {
  // "hello" is a token; with ranks that would never reach it, only ignore_merges finds it.
  TinyBpe t = tiny_bpe("llama-bpe", {{"h", "e"}});
  t.v.tokens.push_back("hello");
  t.v.types.push_back(TokenType::kNormal);
  const Tokenizer llama3(t.v);
  EXPECT_EQ(llama3.encode("hello", false), (Ids{t.special("hello")}));
  t.v.pre = "gpt-2";
  const Tokenizer gpt2(t.v);
  EXPECT_EQ(gpt2.encode("hello", false).size(), 4u);
}

TEST(BpeTokenizer, AddedTokensAreMatchedFirstControlTokensOnlyWhenParsingSpecials) {
  const TinyBpe t = tiny_bpe();
  const Tokenizer tok(t.v);
  const int32_t tool = t.special("<tool>");
  const int32_t im_start = t.special("<|im_start|>");
  EXPECT_EQ(tok.encode("hello<tool>hello", false), (Ids{t.id("hello"), tool, t.id("hello")}));
  const Ids plain = tok.encode("<|im_start|>", false);
  EXPECT_GT(plain.size(), 1u);
  EXPECT_EQ(tok.decode(plain), "<|im_start|>");
  EXPECT_EQ(tok.encode("<|im_start|>hello", EncodeOptions{.parse_special = true}),
            (Ids{im_start, t.id("hello")}));
  EXPECT_EQ(tok.encode("hello", EncodeOptions{.add_bos = true, .add_eos = true}),
            (Ids{tok.bos_id(), t.id("hello"), tok.eos_id()}));
  // Control tokens decode to nothing, added tokens to their text.
  EXPECT_EQ(tok.decode(Ids{im_start, tool, t.id("hello")}), "<tool>hello");
}

TEST(BpeTokenizer, EndOfGenerationTokens) {
  TinyBpe t = tiny_bpe();
  t.v.tokens.push_back("<|im_end|>");
  t.v.types.push_back(TokenType::kUserDefined);
  t.v.tokens.push_back("<|eot_id|>");
  t.v.types.push_back(TokenType::kNormal);
  t.v.eot_id = t.special("<tool>");
  const Tokenizer tok(t.v);
  const int32_t eot = t.special("<|eot_id|>");
  const int32_t im_end = t.special("<|im_end|>");
  EXPECT_TRUE(tok.is_eog(tok.eos_id()));
  EXPECT_TRUE(tok.is_eog(eot));
  EXPECT_TRUE(tok.is_eog(im_end));
  EXPECT_TRUE(tok.is_eog(t.special("<tool>")));  // tokenizer.ggml.eot_token_id
  EXPECT_FALSE(tok.is_eog(t.id("hello")));
  EXPECT_FALSE(tok.is_eog(-1));
  EXPECT_FALSE(tok.is_eog(tok.size()));
  EXPECT_EQ(tok.eog_ids(), (Ids{tok.eos_id(), t.special("<tool>"), im_end, eot}));
  // Turn-ending tokens are control tokens: their text in a prompt stays text.
  EXPECT_EQ(tok.type(im_end), TokenType::kControl);
  EXPECT_NE(tok.encode("<|im_end|>", false), (Ids{im_end}));
}

TEST(BpeTokenizer, RoundTripsAnyBytes) {
  for (const char* pre : {"gpt-2", "llama-bpe", "qwen2", "deepseek-llm", "deepseek-coder", "falcon",
                          "starcoder", "default"}) {
    const Tokenizer tok(tiny_bpe(pre).v);
    for (const std::string& s : std::vector<std::string>{
             "hello world", "  leading and trailing  ", "tabs\tand\r\nnewlines\n\n\n",
             "caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD\xE4\xB8\x96\xE7\x95\x8C "
             "\xF0\x9F\x98\x80\xF0\x9F\x91\x8D",
             "I'm 12345678 it's", "invalid \xFF\xFE \xE4\xBD bytes", std::string("nul\0byte", 8)}) {
      EXPECT_EQ(tok.decode(tok.encode(s, false)), s) << pre;
    }
  }
}

TEST(BpeTokenizer, StreamedPiecesSplitCharactersThatAStreamerMustHoldBack) {
  const Tokenizer tok(tiny_bpe().v);
  const std::string emoji = "\xF0\x9F\x98\x80";
  const Ids ids = tok.encode(emoji, false);
  ASSERT_EQ(ids.size(), 4u);  // one byte token each: no merges for it
  std::string streamed;
  std::string emitted;
  for (int32_t id : ids) {
    streamed += tok.piece(id);
    // What a streamer may emit now: never half a character.
    const size_t safe = utf8_complete_prefix(streamed);
    emitted += streamed.substr(0, safe);
    streamed.erase(0, safe);
    EXPECT_TRUE(emitted.empty() || emitted == emoji);
  }
  EXPECT_EQ(emitted, emoji);
}

TEST(BpeTokenizer, SpacePrefixIsAddedAndStrippedWhenTheVocabularyAsks) {
  TinyBpe t = tiny_bpe();
  t.v.add_space_prefix = true;
  const Tokenizer tok(t.v);
  EXPECT_EQ(tok.encode("world", false), (Ids{t.id(" world")}));
  EXPECT_EQ(tok.encode(" world", false), (Ids{t.id(" world")}));
  EXPECT_EQ(tok.decode(tok.encode("world", false)), "world");
}

TEST(BpeTokenizer, RejectsBadMergesAndUnknownPreTokenizers) {
  TinyBpe t = tiny_bpe();
  t.v.merges.push_back("nospace");
  EXPECT_THROW(Tokenizer{t.v}, Error);
  TinyBpe u = tiny_bpe("no-such-pre");
  try {
    Tokenizer tok(u.v);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'no-such-pre'"), std::string::npos) << e.what();
  }
}

TEST(BpeTokenizer, FingerprintCoversMergesAndPreTokenizer) {
  const TinyBpe t = tiny_bpe();
  const uint64_t fp = Tokenizer(t.v).fingerprint();
  EXPECT_EQ(fp, Tokenizer(tiny_bpe().v).fingerprint());
  Vocabulary other_pre = t.v;
  other_pre.pre = "llama-bpe";
  EXPECT_NE(fp, Tokenizer(other_pre).fingerprint());
  Vocabulary swapped = t.v;
  std::swap(swapped.merges[0], swapped.merges[1]);
  EXPECT_NE(fp, Tokenizer(swapped).fingerprint());
}

}  // namespace
}  // namespace kvc::model
