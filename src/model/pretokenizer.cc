#define PCRE2_CODE_UNIT_WIDTH 8
#include "model/pretokenizer.h"

#include <pcre2.h>

#include <array>

#include "base/error.h"
#include "base/utf8.h"

namespace kvc::model {

namespace {

// ---- the patterns, as Hugging Face tokenizer.json files of each family write them ----------
// Contractions are spelled with explicit case classes rather than (?i:...), which under UCP
// would also fold 'ſ (U+017F) into 's and 'K (U+212A) into 'k.

// GPT-2 (and GPT-NeoX, MPT, OLMo, ...): ByteLevel's own regex.
constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";

// Llama 3 (tiktoken's cl100k pattern): digits in groups of up to three, one leading non-letter
// joined to a word, newlines kept with the punctuation or whitespace before them.
constexpr std::string_view kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Qwen 2: as Llama 3 but every digit alone.
constexpr std::string_view kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// DeepSeek LLM: a sequence of splits; letters are an explicit list of cased-letter ranges. The
// characters with canonical singleton decompositions (U+1F7D, U+1FD3, U+1FDB, U+1FBE, U+2126,
// U+212A) are escaped so that no editor or tool normalising the source can change them.
constexpr std::array<std::string_view, 6> kDeepseekLlm = {
    R"([\r\n])",
    R"(\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\x{1F7D}ᾀ-ᾴᾶ-ᾼ\x{1FBE}ῂ-ῄῆ-ῌῐ-\x{1FD3}ῖ-\x{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\x{2126}ℨ\x{212A}-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+)",
    R"(\s?[!-/:-~！-／：-～‘-‟　-。]+)",
    R"(\s+$)",
    R"([一-龥ࠀ-一가-퟿]+)",
    R"(\p{N}+)",
};

// DeepSeek Coder.
constexpr std::array<std::string_view, 5> kDeepseekCoder = {
    R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", R"([一-龥ࠀ-一가-퟿]+)", R"(\p{N})",
};

// Falcon: punctuation runs first, then GPT-2's pattern, then digits in threes.
constexpr std::array<std::string_view, 3> kFalcon = {
    R"([\p{P}\$\+<=>\^~\|`]+)",
    kGpt2,
    R"([0-9][0-9][0-9])",
};

// StarCoder, Refact, Command-R, SmolLM: every digit alone, then GPT-2's pattern.
constexpr std::array<std::string_view, 2> kStarcoder = {R"(\p{N})", kGpt2};

// llama.cpp's default for BPE files that name no pre-tokenizer.
constexpr std::array<std::string_view, 4> kDefault = {
    R"([\p{P}\$\+<=>\^~\|]+)",
    kGpt2,
    R"(\p{N}+)",
    R"([0-9][0-9][0-9])",
};

struct Family {
  std::span<const std::string_view> names;
  std::span<const std::string_view> patterns;
  bool ignore_merges = false;
  bool add_bos = false;
};

constexpr std::array<std::string_view, 1> kGpt2One = {kGpt2};
constexpr std::array<std::string_view, 1> kLlama3One = {kLlama3};
constexpr std::array<std::string_view, 1> kQwen2One = {kQwen2};

constexpr std::array<std::string_view, 1> kDefaultNames = {"default"};
constexpr std::array<std::string_view, 7> kGpt2Names = {"gpt-2", "gpt-neox", "mpt",        "olmo",
                                                        "jais",  "phi-2",    "roberta-bpe"};
constexpr std::array<std::string_view, 3> kLlama3Names = {"llama-bpe", "llama3", "llama-v3"};
constexpr std::array<std::string_view, 2> kDbrxNames = {"dbrx", "smaug-bpe"};
constexpr std::array<std::string_view, 3> kQwen2Names = {"qwen2", "deepseek-r1-qwen", "stablelm2"};
constexpr std::array<std::string_view, 1> kDeepseekLlmNames = {"deepseek-llm"};
constexpr std::array<std::string_view, 1> kDeepseekCoderNames = {"deepseek-coder"};
constexpr std::array<std::string_view, 1> kFalconNames = {"falcon"};
constexpr std::array<std::string_view, 6> kStarcoderNames = {"starcoder", "refact",    "command-r",
                                                             "smollm",    "codeshell", "exaone"};

const std::array<Family, 9>& families() {
  static const std::array<Family, 9> f = {{
      {kDefaultNames, kDefault},
      {kGpt2Names, kGpt2One},
      // Llama 3's tokenizer.json sets ignore_merges, and its models start with BOS.
      {kLlama3Names, kLlama3One, true, true},
      {kDbrxNames, kLlama3One},
      {kQwen2Names, kQwen2One},
      {kDeepseekLlmNames, kDeepseekLlm},
      {kDeepseekCoderNames, kDeepseekCoder},
      {kFalconNames, kFalcon},
      {kStarcoderNames, kStarcoder},
  }};
  return f;
}

}  // namespace

struct PreTokenizer::Pattern {
  pcre2_code* code = nullptr;
  ~Pattern() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(std::string name, std::span<const std::string_view> patterns,
                           bool ignore_merges, bool add_bos)
    : name_(std::move(name)), ignore_merges_(ignore_merges), add_bos_(add_bos) {
  for (std::string_view p : patterns) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    auto compiled = std::make_shared<Pattern>();
    compiled->code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY,
                      &error, &offset, nullptr);
    if (compiled->code == nullptr) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error, message.data(), message.size());
      fail("pre-tokenizer '{}': pattern '{}' does not compile at offset {}: {}", name_, p, offset,
           reinterpret_cast<const char*>(message.data()));
    }
    // JIT is an optimisation only: without it matching falls back to the interpreter.
    pcre2_jit_compile(compiled->code, PCRE2_JIT_COMPLETE);
    patterns_.emplace_back(p);
    compiled_.push_back(std::move(compiled));
  }
}

PreTokenizer PreTokenizer::named(std::string_view name) {
  const std::string_view key = name.empty() ? std::string_view("default") : name;
  for (const Family& f : families()) {
    for (std::string_view n : f.names) {
      if (n == key) return PreTokenizer(std::string(key), f.patterns, f.ignore_merges, f.add_bos);
    }
  }
  std::string list;
  for (std::string_view n : supported_names()) {
    if (!list.empty()) list += ", ";
    list += n;
  }
  fail("tokenizer.ggml.pre '{}' is a pre-tokenizer kvcache does not know; supported: {}", name,
       list);
}

std::vector<std::string_view> PreTokenizer::supported_names() {
  std::vector<std::string_view> out;
  for (const Family& f : families()) out.insert(out.end(), f.names.begin(), f.names.end());
  return out;
}

std::vector<std::string_view> PreTokenizer::split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  if (text.empty()) return pieces;
  pieces.push_back(text);
  std::vector<std::string_view> next;
  for (const auto& pattern : compiled_) {
    next.clear();
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
        pcre2_match_data_create_from_pattern(pattern->code, nullptr), &pcre2_match_data_free);
    if (!md) fail("pre-tokenizer '{}': out of memory for match data", name_);
    for (std::string_view piece : pieces) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t pos = 0;
      size_t last = 0;
      while (pos <= piece.size()) {
        int rc = pcre2_match(pattern->code, subject, piece.size(), pos, 0, md.get(), nullptr);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
          // Very long runs can exhaust the JIT's stack; the interpreter keeps its own on the heap.
          rc = pcre2_match(pattern->code, subject, piece.size(), pos, PCRE2_NO_JIT, md.get(),
                           nullptr);
        }
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          std::array<PCRE2_UCHAR, 256> message{};
          pcre2_get_error_message(rc, message.data(), message.size());
          fail("pre-tokenizer '{}': matching failed: {}", name_,
               reinterpret_cast<const char*>(message.data()));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
        const size_t start = ov[0];
        const size_t end = ov[1];
        if (end <= start) {
          // An empty match cuts nothing; step over one character and look again.
          if (start >= piece.size()) break;
          pos = start + utf8_sequence_length(piece, start);
          continue;
        }
        if (start > last) next.push_back(piece.substr(last, start - last));
        next.push_back(piece.substr(start, end - start));
        last = pos = end;
      }
      if (last < piece.size()) next.push_back(piece.substr(last));
    }
    pieces.swap(next);
  }
  return pieces;
}

}  // namespace kvc::model
