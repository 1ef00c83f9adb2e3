// llama.cpp's tokenizer test pairs over its vocabulary-only GGUFs (shared/testdata/vocab): every
// text must encode (no BOS, no special-token parsing) to exactly the ids llama.cpp gives, and
// decode back to itself where the vocabulary can spell it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/tokenizer.h"

namespace kvc::model {
namespace {

std::filesystem::path vocab_dir() {
  const char* root = std::getenv("KVCACHE_TESTDATA");
  if (root == nullptr || *root == '\0') return {};
  return std::filesystem::path(root) / "vocab";
}

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> texts_of(const std::string& inp) {
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  size_t at = 0;
  while (at < inp.size()) {
    const size_t hit = inp.find(sep, at);
    if (hit == std::string::npos) break;
    out.push_back(inp.substr(at, hit - at));
    at = hit + sep.size();
  }
  return out;
}

std::vector<std::vector<int32_t>> ids_of(const std::string& out) {
  std::vector<std::vector<int32_t>> rows;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream nums(line);
    std::vector<int32_t> row;
    int32_t id = 0;
    while (nums >> id) row.push_back(id);
    rows.push_back(std::move(row));
  }
  return rows;
}

class VocabPairs : public ::testing::TestWithParam<std::string> {};

TEST_P(VocabPairs, EveryPairMatchesLlamaCpp) {
  const std::filesystem::path dir = vocab_dir();
  if (dir.empty()) {
    GTEST_SKIP() << "KVCACHE_TESTDATA not set: point it at shared/testdata to run llama.cpp's "
                    "tokenizer pairs";
  }
  const std::string name = GetParam();
  const auto gguf_path = dir / (name + ".gguf");
  ASSERT_TRUE(std::filesystem::exists(gguf_path)) << gguf_path << " is missing";
  const auto file = gguf::File::open(gguf_path.string());
  const Tokenizer tok = Tokenizer::from_gguf(*file);
  const auto texts = texts_of(read_all(dir / (name + ".inp")));
  const auto expected = ids_of(read_all(dir / (name + ".out")));
  ASSERT_EQ(texts.size(), expected.size()) << name;
  ASSERT_GT(texts.size(), 0u);
  size_t matched = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto got = tok.encode(texts[i], false);
    if (got == expected[i]) {
      ++matched;
    } else {
      ADD_FAILURE() << name << " pair " << i << " text '" << texts[i] << "'\n  got      "
                    << ::testing::PrintToString(got) << "\n  expected "
                    << ::testing::PrintToString(expected[i]);
    }
    if (tok.model() == TokenizerModel::kBpe) {
      EXPECT_EQ(tok.decode(got), texts[i]) << name << " pair " << i;
    }
  }
  std::printf("%s: %zu of %zu pairs match\n", name.c_str(), matched, texts.size());
}

INSTANTIATE_TEST_SUITE_P(LlamaCpp, VocabPairs,
                         ::testing::Values("gpt-2", "deepseek-llm", "llama-spm", "phi-3"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) {
                             if (c == '-') c = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace kvc::model
